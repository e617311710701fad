"""Shape and data-movement ONNX ops: Shape, Size, Reshape, Flatten, (Un)Squeeze, Transpose, Concat,
Split, Expand, Tile, DepthToSpace, SpaceToDepth, ConstantOfShape, Range, Constant, Identity, Dropout.

Each handler has a load-time path for `Known` inputs (shape tensors stay symbolic integer arrays,
so `Reshape(x, Concat(Shape(x)[0], [-1]))` becomes a View with a symbolic batch dim) and a graph
path for runtime values.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from kn_graph.dtype import DType
from kn_graph.onnx.context import KNOWN_LIMIT, MAX_RANK, Known, NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.common import all_known
from kn_graph.onnx.handlers.data_sizes import (
    at_run_time,
    dynamic_constant_of_shape,
    dynamic_expand,
    dynamic_range,
    dynamic_reshape,
    dynamic_tile,
)
from kn_graph.ops import Value
from kn_graph.shape import Shape, Size, broadcast_shapes

__all__ = ["axis_of", "known", "known_apply", "known_take", "scalar_operand", "static_ints"]


# -- helpers shared with the tensor family ---------------------------------------------------------
def known(data: np.ndarray, dtype: DType) -> Known:
    """A Known from a NumPy array (object arrays may hold Sizes; plain arrays are cast)."""
    if data.dtype == object:
        return Known.of(data, dtype)
    return Known(np.array(data, dtype=dtype.np), dtype)  # a copy, rank 0 kept


def known_apply(k: Known, f: Callable[[np.ndarray], np.ndarray]) -> Known:
    """A pure data-movement function (reshape, transpose, take, …) applied to a Known's elements."""
    return known(np.asarray(f(k.data)), k.dtype)


def known_take(k: Known, idx: np.ndarray, axis: int) -> Known:
    """`np.take` on a Known's elements (Slice, Split and Gather of shape tensors)."""
    return known(np.asarray(np.take(k.data, idx, axis=axis)), k.dtype)  # a 0-d take gives a scalar


def static_ints(ctx: NodeContext, i: int, what: str) -> list[int]:
    """Input i as a flat list of Python ints; it must be known at load time, without symbols."""
    arr = np.asarray(ctx.input_static(i, what))
    if arr.dtype.kind not in "iub":
        ctx.unsupported(f"{what} (input {i}) must be integers, found {arr.dtype}")
    return [int(v) for v in arr.reshape(-1)]


def scalar_operand(ctx: NodeContext, s: Size, dtype: DType) -> int | Value:
    """A size as an operand of graph arithmetic: a plain int when fixed, else a runtime scalar."""
    f = s.fixed_value()
    return f if f is not None else ctx.size_value(s, dtype)


def axis_of(ctx: NodeContext, axis: int, rank: int) -> int:
    """An axis of a rank-`rank` operand, normalised; a rank-0 operand has none."""
    if rank == 0:
        ctx.unsupported(f"axis {axis} of a rank-0 operand")
    return ctx.axis(axis, rank)


def _small(shape: Shape) -> bool:
    return (
        shape.is_fixed and shape.rank <= MAX_RANK and math.prod(shape.fixed_dims()) <= KNOWN_LIMIT
    )


def _axes(ctx: NodeContext, input_index: int, first_input_opset: int) -> list[int] | None:
    """Axes as an attribute before `first_input_opset`, as an optional input from it on."""
    if ctx.opset < first_input_opset:
        return ctx.attr_ints("axes")
    if not ctx.has_input(input_index):
        return None
    return static_ints(ctx, input_index, "axes")


# -- shape queries ---------------------------------------------------------------------------------
@onnx_op("Shape")
def shape(ctx: NodeContext) -> Result:
    dims = list(ctx.input_shape(0).dims)
    start = ctx.attr_int("start", 0)
    end = ctx.attr_int("end", len(dims))
    return Known.of(dims[slice(start, end)], DType.I64)


@onnx_op("Size")
def size(ctx: NodeContext) -> Result:
    return Known.of(np.array(ctx.input_shape(0).size(), dtype=object), DType.I64)


# -- constants and identities ----------------------------------------------------------------------
@onnx_op("Identity")
def identity(ctx: NodeContext) -> Result:
    return ctx.raw_input(0)


_CONSTANT_FORMS: dict[str, Callable[[NodeContext], np.ndarray | None]] = {
    "value": lambda ctx: ctx.attr_tensor("value"),
    "value_float": lambda ctx: np.array(ctx.attr_float("value_float"), np.float32),
    "value_floats": lambda ctx: np.array(ctx.attr_floats("value_floats"), np.float32),
    "value_int": lambda ctx: np.array(ctx.attr_int("value_int"), np.int64),
    "value_ints": lambda ctx: np.array(ctx.attr_ints("value_ints"), np.int64),
}


@onnx_op("Constant")
def constant(ctx: NodeContext) -> Result:
    for name, read in _CONSTANT_FORMS.items():
        if ctx.has_attr(name):
            arr = read(ctx)
            if arr is None:
                ctx.unsupported(f"attribute '{name}' has no value")
            return ctx.loader.result_of_array(arr)
    for name in ("sparse_value", "value_string", "value_strings"):
        if ctx.has_attr(name):
            ctx.unsupported(f"the '{name}' form (sparse or string tensors) is not supported")
    ctx.unsupported("no value attribute")


@onnx_op("Dropout")
def dropout(ctx: NodeContext) -> Result | list[Result | None]:
    """Inference: the identity. Training with ratio 0 is the identity too; other ratios are random."""
    ctx.ignore_attrs("seed", "is_test", "ratio")
    if ctx.opset >= 12 and ctx.has_input(2):
        training = np.asarray(ctx.input_static(2, "training_mode")).reshape(-1)
        if training.size != 1:
            ctx.unsupported("training_mode must be a scalar")
        ratio = 0.5
        if ctx.has_input(1):
            ratios = np.asarray(ctx.input_static(1, "ratio")).reshape(-1)
            if ratios.size != 1:
                ctx.unsupported(f"ratio must be a scalar, found {ratios.tolist()}")
            ratio = float(ratios[0])
        if bool(training[0]) and ratio != 0:
            ctx.unsupported(
                f"training mode with ratio {ratio} is random; only inference is supported"
            )
    if ctx.has_input(1):
        ctx.raw_input(1)  # the ratio has no effect at inference
    x = ctx.raw_input(0)
    if len(ctx.node.output) < 2 or not ctx.node.output[1]:
        return x
    shape = ctx.input_shape(0)
    mask_dtype = DType.BOOL if ctx.opset >= 10 else ctx.input_dtype(0)
    return [x, ctx.graph.full(True if mask_dtype.is_bool else 1, shape, mask_dtype)]


# -- reshaping -------------------------------------------------------------------------------------
def _reshape_to(ctx: NodeContext, out: Shape) -> Result:
    in_shape = ctx.input_shape(0)
    if in_shape.size() != out.size() and (in_shape.is_fixed and out.is_fixed):
        ctx.unsupported(f"cannot reshape {in_shape} to {out} (element counts differ)")
    r = ctx.raw_input(0)
    if isinstance(r, Known):
        return known_apply(r, lambda a: a.reshape(out.fixed_dims()))
    return ctx.graph.view(r, out)


@onnx_op("Reshape")
def reshape(ctx: NodeContext) -> Result:
    in_shape = ctx.input_shape(0)
    if ctx.opset < 5:
        ctx.ignore_attrs("consumed_inputs")
        target = [Size(d) for d in ctx.attr_ints("shape") or []]
    elif at_run_time(ctx, 1):  # a shape from data inside a Loop body
        return dynamic_reshape(ctx, ctx.attr_bool("allowzero", False))
    else:
        target = ctx.input_sizes(1, "the target shape")
    allowzero = ctx.attr_bool("allowzero", False)
    dims: list[Size | None] = []
    for i, d in enumerate(target):
        if d == Size(0) and not allowzero:
            if i >= in_shape.rank:
                ctx.unsupported(
                    f"target dim {i} is 0 (copy) but the input has rank {in_shape.rank}"
                )
            dims.append(in_shape[i])
        elif d == Size(-1):
            dims.append(None)
        elif d.bounds()[1] < 0:
            ctx.unsupported(f"invalid target dim {d}")
        else:
            dims.append(d)
    if dims.count(None) > 1:
        ctx.unsupported("more than one -1 in the target shape")
    if None in dims:
        rest = Size(1)
        for known_dim in dims:
            if known_dim is not None:
                rest = rest * known_dim
        if rest == Size(0):
            ctx.unsupported("-1 in a target shape that has a zero dim")
        total = in_shape.size()
        inferred = total // rest
        if not rest.divides(total):
            ctx.graph.add_guard(
                total % rest,
                "==",
                0,
                f"the -1 of Reshape to {[str(d) for d in target]}: "
                f"{total} elements must divide by {rest}",
            )
        dims[dims.index(None)] = inferred
    return _reshape_to(ctx, Shape(tuple(d for d in dims if d is not None)))


@onnx_op("Flatten")
def flatten(ctx: NodeContext) -> Result:
    shape = ctx.input_shape(0)
    axis = ctx.attr_int("axis", 1)
    axis = axis + shape.rank if axis < 0 else axis
    if not 0 <= axis <= shape.rank:
        ctx.unsupported(f"axis {axis} out of range for rank {shape.rank}")
    out = Shape.of(Shape(shape.dims[:axis]).size(), Shape(shape.dims[axis:]).size())
    return _reshape_to(ctx, out)


@onnx_op("Squeeze")
def squeeze(ctx: NodeContext) -> Result:
    shape = ctx.input_shape(0)
    axes = _axes(ctx, 1, 13)
    if axes == []:
        ctx.unsupported("empty axes: onnxruntime squeezes every size-1 axis, the reference none")
    if axes is None:
        if not shape.is_fixed:
            ctx.needs_fixed_sizes(
                f"squeeze without axes on symbolic shape {shape} (a size may be 1)"
            )
        drop = {i for i, d in enumerate(shape) if d == Size(1)}
    else:
        drop = {axis_of(ctx, a, shape.rank) for a in axes}
        for a in sorted(drop):
            if shape[a].is_fixed and shape[a] != Size(1):
                ctx.unsupported(f"axis {a} of shape {shape} is not of size 1")
        out = Shape(tuple(d for i, d in enumerate(shape) if i not in drop))
        symbolic = sorted(a for a in drop if not shape[a].is_fixed)
        if symbolic and not isinstance(ctx.tensor_input(0), Known):
            # 1 only for the inputs the model is meant for (a streaming chunk): assumed, and
            # checked at every binding with an error naming the node and the size
            x = ctx.input(0)
            for a in symbolic:
                what = f"Squeeze '{ctx.name}': axis {a} of the input ({shape[a]}) must be 1"
                x = ctx.graph.assume_size(x, a, 1, what)
            return ctx.graph.view(x, out)
    return _reshape_to(ctx, Shape(tuple(d for i, d in enumerate(shape) if i not in drop)))


@onnx_op("Unsqueeze")
def unsqueeze(ctx: NodeContext) -> Result:
    shape = ctx.input_shape(0)
    axes = _axes(ctx, 1, 13)
    if axes is None:
        ctx.unsupported("axes are required")
    rank = shape.rank + len(axes)
    norm = sorted(ctx.axis(a, rank) for a in axes)
    if len(set(norm)) != len(norm):
        ctx.unsupported(f"repeated axes {axes}")
    dims = list(shape.dims)
    for a in norm:
        dims.insert(a, Size(1))
    return _reshape_to(ctx, Shape(tuple(dims)))


@onnx_op("Transpose")
def transpose(ctx: NodeContext) -> Result:
    rank = ctx.input_rank(0)
    perm = ctx.attr_ints("perm") or list(range(rank))[::-1]
    if sorted(perm) != list(range(rank)):
        ctx.unsupported(f"perm {perm} is not a permutation of rank {rank}")
    r = ctx.raw_input(0)
    if isinstance(r, Known):
        return known_apply(r, lambda a: a.transpose(perm))
    return ctx.graph.permute(r, perm)


# -- joining and splitting -------------------------------------------------------------------------
@onnx_op("Concat")
def concat(ctx: NodeContext) -> Result:
    rank = ctx.input_rank(0)
    axis = axis_of(ctx, ctx.attr_int("axis", 0 if ctx.opset < 4 else None), rank)
    ks = all_known(ctx)
    if ks is not None and all(_off_axis(k.shape, axis) == _off_axis(ks[0].shape, axis) for k in ks):
        return known(np.concatenate([k.data.astype(object) for k in ks], axis=axis), ks[0].dtype)
    return ctx.graph.concat(ctx.inputs(), axis)


def _off_axis(shape: tuple[int, ...], axis: int) -> tuple[int, ...] | None:
    """The dims besides `axis` (None for another rank), which Concat operands must share."""
    return shape[:axis] + shape[axis + 1 :] if len(shape) > axis else None


def _split_sizes(ctx: NodeContext, dim: Size, n_out: int) -> list[Size]:
    """The chunk sizes: given (attribute or input), `num_outputs` (last chunk smaller), or equal."""
    given: list[Size] | None = None
    if ctx.opset < 13:
        ints = ctx.attr_ints("split")
        given = None if ints is None else [Size(s) for s in ints]
    elif ctx.has_input(1):
        given = ctx.input_sizes(1, "split")  # may be symbolic: [seq, 0] in rotary exports
    if given is not None:
        shown = [str(s) for s in given]
        if len(given) != n_out or any(s.bounds()[1] < 0 for s in given):
            ctx.unsupported(f"split {shown} does not give {n_out} non-negative sizes")
        total = Size(0)
        for s in given:
            total = total + s
        if total != dim:
            ctx.unsupported(f"split {shown} does not add up to the axis size {dim}")
        return given
    if ctx.opset >= 18:
        n = ctx.attr_int("num_outputs", n_out)
        if n != n_out or n < 1:
            ctx.unsupported(f"num_outputs {n} but the node has {n_out} outputs")
        if dim.is_fixed:
            chunk = -(-dim.as_int() // n)
            # as onnxruntime: 4 into 3 is 2, 2 and an empty chunk
            return [Size(min(chunk, max(dim.as_int() - i * chunk, 0))) for i in range(n)]
        if Size(n).divides(dim):
            return [dim // n] * n
        # chunks of ceil(dim / n), the last one smaller (possibly empty); a size for which an
        # earlier chunk would be short too (1 into 3) is refused at binding by the guard
        chunk = (dim + (n - 1)) // n
        last = dim - chunk * (n - 1)
        ctx.graph.add_guard(last, ">=", 0, f"split of axis size {dim} into {n} chunks")
        return [chunk] * (n - 1) + [last]
    if not Size(n_out).divides(dim):
        ctx.graph.add_guard(
            dim % n_out, "==", 0, f"split of axis size {dim} into {n_out} equal parts"
        )
    return [dim // n_out] * n_out


@onnx_op("Split")
def split(ctx: NodeContext) -> list[Result]:
    shape = ctx.input_shape(0)
    axis = axis_of(ctx, ctx.attr_int("axis", 0), shape.rank)
    n_out = len(ctx.node.output)
    sizes = _split_sizes(ctx, shape[axis], n_out)
    r = ctx.raw_input(0)
    out: list[Result] = []
    start = Size(0)
    for s in sizes:
        if isinstance(r, Known):
            out.append(known_take(r, np.arange(start.as_int(), (start + s).as_int()), axis))
        else:
            out.append(ctx.graph.slice_raw(r, axis, start, 1, s))
        start = start + s
    return out


# -- broadcasting and repetition -------------------------------------------------------------------
@onnx_op("Expand")
def expand(ctx: NodeContext) -> Result:
    if at_run_time(ctx, 1):
        return dynamic_expand(ctx)
    target = ctx.input_sizes(1, "the target shape")
    if any(d.bounds()[1] < 0 for d in target):
        ctx.unsupported(f"negative size in the target shape {[str(d) for d in target]}")
    out = broadcast_shapes(
        ctx.input_shape(0), Shape(tuple(target)), equate=ctx.graph._equate_or_none()
    )
    r = ctx.raw_input(0)
    if isinstance(r, Known) and _small(out):
        return known_apply(r, lambda a: np.broadcast_to(a, out.fixed_dims()))
    g = ctx.graph
    return g.broadcast(g._conform(ctx.input(0), out) if g.equate else ctx.input(0), out)


@onnx_op("Tile")
def tile(ctx: NodeContext) -> Result:
    if at_run_time(ctx, 1):
        return dynamic_tile(ctx)
    shape = ctx.input_shape(0)
    reps = ctx.input_sizes(1, "repeats")  # may be symbolic: [B, 1, 1] in exports
    if len(reps) != shape.rank or any(n.bounds()[1] < 0 for n in reps):
        ctx.unsupported(f"repeats {[str(n) for n in reps]} do not match rank {shape.rank}")
    r = ctx.raw_input(0)
    out = Shape(tuple(d * n for d, n in zip(shape, reps, strict=True)))
    if isinstance(r, Known) and _small(out) and all(n.is_fixed for n in reps):
        return known_apply(r, lambda a: np.tile(a, [n.as_int() for n in reps]))
    x = ctx.input(0)
    for axis, n in enumerate(reps):
        if n != Size(1):
            x = ctx.graph.repeat(x, axis, n)
    return x


@onnx_op("ConstantOfShape")
def constant_of_shape(ctx: NodeContext) -> Result:
    value = ctx.attr_tensor("value")
    if value is None:
        value = np.zeros(1, np.float32)
    if value.size != 1:
        ctx.unsupported(f"value must hold one element, found shape {list(value.shape)}")
    if at_run_time(ctx, 0):
        return dynamic_constant_of_shape(ctx, value)
    dims = ctx.input_sizes(0, "the shape")
    if any(d.bounds()[1] < 0 for d in dims):
        ctx.unsupported(f"negative size in the shape {[str(d) for d in dims]}")
    dtype = DType.from_np(value.dtype)
    out = Shape(tuple(dims))
    if not dtype.is_float and _small(out):
        return known(np.full(out.fixed_dims(), value.reshape(-1)[0], dtype.np), dtype)
    return ctx.graph.full(value.reshape(-1)[0].item(), out, dtype)


# -- blocks and channels ----------------------------------------------------------------------------
def _nchw(ctx: NodeContext) -> tuple[Size, Size, Size, Size, int]:
    shape = ctx.input_shape(0)
    if shape.rank != 4:
        ctx.unsupported(f"expected a 4-d NCHW input, found {shape}")
    b = ctx.attr_int("blocksize")
    if b < 1:
        ctx.unsupported(f"blocksize {b}")
    n, c, h, w = shape.dims
    return n, c, h, w, b


@onnx_op("DepthToSpace")
def depth_to_space(ctx: NodeContext) -> Result:
    n, c, h, w, b = _nchw(ctx)
    mode = ctx.attr_str("mode", "DCR")
    g = ctx.graph
    x = ctx.input(0)
    match mode:
        case "DCR":
            y = g.permute(g.view(x, Shape.of(n, b, b, c // (b * b), h, w)), (0, 3, 4, 1, 5, 2))
        case "CRD":
            y = g.permute(g.view(x, Shape.of(n, c // (b * b), b, b, h, w)), (0, 1, 4, 2, 5, 3))
        case _:
            ctx.unsupported(f"mode '{mode}'")
    return g.view(y, Shape.of(n, c // (b * b), h * b, w * b))


@onnx_op("SpaceToDepth")
def space_to_depth(ctx: NodeContext) -> Result:
    n, c, h, w, b = _nchw(ctx)
    mode = ctx.attr_str("mode", "DCR")
    g = ctx.graph
    blocks = g.view(ctx.input(0), Shape.of(n, c, h // b, b, w // b, b))
    match mode:
        case "DCR":
            y = g.permute(blocks, (0, 3, 5, 1, 2, 4))
        case "CRD":
            y = g.permute(blocks, (0, 1, 3, 5, 2, 4))
        case _:
            ctx.unsupported(f"mode '{mode}'")
    return g.view(y, Shape.of(n, c * b * b, h // b, w // b))


RANGE_CONSTANT_LIMIT = 1 << 20
"""A Range with fixed bounds up to this many elements is a load-time constant; a longer one is
computed by the graph (an iota), so a declared length of 2^31 costs no memory at load time."""

_STASH: dict[int, type] = {1: np.float32, 11: np.float64}
"""Range's stash_type (ONNX element types FLOAT, DOUBLE) → the NumPy type to compute in."""


# -- Range -----------------------------------------------------------------------------------------
def _range_scalar(ctx: NodeContext, i: int, what: str) -> Size | np.generic:
    """A Range bound: a (possibly symbolic) Size for integer Knowns, else a NumPy scalar."""
    k = ctx.input_known(i)
    if k is not None and k.dtype.is_int:
        if k.data.size != 1:
            ctx.unsupported(f"{what} must be a scalar, found shape {list(k.shape)}")
        return k.sizes()[0]
    r = ctx.raw_input(i)
    if isinstance(r, Value) and r in ctx.loader.value_sizes:
        return ctx.loader.value_sizes[r]
    arr = np.asarray(ctx.input_static(i, what))
    if arr.size != 1:
        ctx.unsupported(f"{what} must be a scalar, found shape {list(arr.shape)}")
    return arr.reshape(-1)[0]


@onnx_op("Range")
def range_(ctx: NodeContext) -> Result:
    if at_run_time(ctx, 0, 1, 2):
        return dynamic_range(ctx)
    dtype = ctx.input_dtype(0)
    start, limit, delta = (
        _range_scalar(ctx, i, w) for i, w in enumerate(("start", "limit", "delta"))
    )
    if any(isinstance(v, Size) and not v.is_fixed for v in (start, limit, delta)):
        # symbolic float bounds: integer-valued constants join the size arithmetic
        conv = []
        for v in (start, limit, delta):
            if not isinstance(v, Size):
                f = float(v.item())
                if not f.is_integer():
                    ctx.unsupported(f"a Range over a symbolic size with fractional bound {f}")
                v = Size(int(f))
            conv.append(v)
        start, limit, delta = conv
    if not all(isinstance(v, Size) for v in (start, limit, delta)):
        # float range: computed here exactly as the reference does (in float64, then cast)
        lo, hi, d = (
            float(v.as_int("a float Range bound")) if isinstance(v, Size) else float(v.item())
            for v in (start, limit, delta)
        )
        if not all(math.isfinite(x) for x in (lo, hi, d)):
            ctx.unsupported(f"Range bounds must be finite, found {lo}, {hi}, {d}")
        if d == 0:
            ctx.unsupported("delta is zero")
        half = dtype is DType.F16 and ctx.has_attr("stash_type")
        stash = _STASH.get(ctx.attr_int("stash_type")) if half else None
        ctx.ignore_attrs("stash_type")
        span = (hi - lo) / d
        if not math.isfinite(span) or span >= 2.0**62:
            ctx.unsupported(f"Range({lo}, {hi}, {d}) has too many elements ({span:.3g})")
        count = max(math.ceil(span), 0)
        if count == 0:  # NumPy refuses some empty ranges (0 to -3.4e38)
            return ctx.graph.constant(np.zeros(0, dtype.np))
        if count > RANGE_CONSTANT_LIMIT:  # too long for a constant: the graph computes it
            g = ctx.graph
            wide = DType.F64 if stash is None else DType.from_np(np.dtype(stash))
            ramp = g.add(g.mul(g.iota(Shape.of(count), 0, wide), d), lo)
            return g.cast(ramp, dtype)
        if stash is not None:  # half precision computed in a wider type, as the reference does
            return ctx.graph.constant(
                np.arange(stash(lo).item(), hi, d, dtype=stash).astype(dtype.np)
            )
        return ctx.graph.constant(np.arange(lo, hi, d).astype(dtype.np))
    assert isinstance(start, Size) and isinstance(limit, Size) and isinstance(delta, Size)
    step = delta.as_int("delta")
    if step == 0:
        ctx.unsupported("delta is zero")
    if start.is_fixed and limit.is_fixed:
        first, end = start.as_int(), limit.as_int()
        count = max(-((first - end) // step), 0)
        info = np.iinfo(dtype.np) if dtype.is_int else np.iinfo(np.int64)
        ends = (first, first + (count - 1) * step) if count else (0, 0)
        if not all(info.min <= v <= info.max for v in ends):
            ctx.unsupported(f"Range({first}, {end}, {step}) leaves the range of {dtype}")
        if count <= RANGE_CONSTANT_LIMIT:
            wide = not -(2**63) <= end < 2**63  # NumPy's arange takes int64 bounds only
            arr = (
                np.fromiter(range(first, end, step), np.int64, count)
                if wide
                else np.arange(first, end, step, dtype=np.int64)
            )
            return (
                known(arr, dtype)
                if arr.size <= KNOWN_LIMIT
                else ctx.graph.constant(arr.astype(dtype.np))
            )
        # too long for a constant (a declared length of 2^31): the graph computes it
        g = ctx.graph
        ramp = g.mul(g.iota(Shape.of(count), 0, dtype), step)
        return g.add(ramp, first) if first else ramp
    # symbolic length: iota·delta + start, max(ceil((limit - start) / delta), 0) elements
    n = Size.max((limit - start).ceildiv(step) if step > 0 else (start - limit).ceildiv(-step), 0)
    g = ctx.graph
    ramp = g.mul(g.iota(Shape.of(n), 0, dtype), step)
    return g.add(ramp, scalar_operand(ctx, start, dtype)) if start != Size(0) else ramp
