"""Indexing ONNX ops: Slice, Gather, GatherElements, GatherND, Compress, ReverseSequence, Pad,
CenterCropPad, Trilu, OneHot, EyeLike and Scatter (static indices).

All of them lower to the IR's Slice/Gather/Concat/Select/Iota: element indexing becomes one Gather
over the flattened operand with linear indices (computed here when the indices are constants,
with iota arithmetic when they are runtime values).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kn_graph.dtype import DType
from kn_graph.onnx.context import Known, NodeContext, Result, onnx_dtype, onnx_op
from kn_graph.onnx.handlers.dynamic import nonzero_indices
from kn_graph.onnx.handlers.reverse_prefix import reverse_prefixes
from kn_graph.onnx.handlers.shape import axis_of, known_take, scalar_operand, static_ints
from kn_graph.ops import BinaryOp, Value
from kn_graph.shape import Shape, Size

INT_BIG = 2**31 - 1
"""Slice ends at or beyond this mean "to the end" (exporters write INT32_MAX or INT64_MAX)."""


# -- Slice ------------------------------------------------------------------------------------------
def _fixed_bounds(n: int, start: int, end: int, step: int) -> tuple[int, int]:
    """ONNX Slice clamping on an axis of n elements: (first index, element count)."""
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), n), min(max(end, 0), n)
        length = max(0, -(-(end - start) // step))
    else:
        start, end = min(max(start, 0), n - 1), min(max(end, -1), n - 1)
        length = max(0, -(-(start - end) // -step))
    length = length if n > 0 else 0
    return (start if length else 0), length


def _slice_axis(ctx: NodeContext, x: Value, axis: int, start: Size, end: Size, step: int) -> Value:
    g = ctx.graph
    dim = g.shape(x)[axis]
    if dim.is_fixed and start.is_fixed and end.is_fixed:
        first, length = _fixed_bounds(dim.as_int(), start.as_int(), end.as_int(), step)
        return g.slice_raw(x, axis, first, step, length)
    # symbolic: bounds normalised and assumed on the axis, with guards (`Graph.slice`)
    return g.slice(x, axis, start, end, step)


def _slice_args(
    ctx: NodeContext,
) -> tuple[list[Size], list[Size], list[int] | None, list[int] | None]:
    if ctx.opset < 10:
        starts = [Size(v) for v in ctx.attr_ints("starts") or []]
        ends = [Size(v) for v in ctx.attr_ints("ends") or []]
        return starts, ends, ctx.attr_ints("axes"), None
    axes = static_ints(ctx, 3, "axes") if ctx.has_input(3) else None
    steps = static_ints(ctx, 4, "steps") if ctx.has_input(4) else None
    return ctx.input_sizes(1, "starts"), ctx.input_sizes(2, "ends"), axes, steps


def _data_bounds(ctx: NodeContext) -> bool:
    """Slice bounds computed from data inside a subgraph (a Loop's iteration number)."""
    if ctx.opset < 10 or not ctx.in_subgraph:
        return False
    return any(
        ctx.input_known(i) is None and ctx.graph.const_value(ctx.input(i)) is None for i in (1, 2)
    )


def _dynamic_slice(ctx: NodeContext) -> Result:
    """Slice with bounds from data: a Dynamic op; the sliced lengths are run-time sizes."""
    g = ctx.graph
    x = ctx.input(0)
    shape = g[x].shape
    starts, ends = (g.cast(ctx.input(i), DType.I64) for i in (1, 2))
    n = g[starts].shape.size()
    if n != g[ends].shape.size() or not n.is_fixed:
        ctx.unsupported(f"starts {g[starts].shape} and ends {g[ends].shape} must match")
    axes = static_ints(ctx, 3, "axes") if ctx.has_input(3) else list(range(n.as_int()))
    steps = static_ints(ctx, 4, "steps") if ctx.has_input(4) else [1] * n.as_int()
    norm = tuple(axis_of(ctx, a, shape.rank) for a in axes)
    if len(set(norm)) != len(norm) or 0 in steps or len(steps) != len(norm):
        ctx.unsupported(f"axes {axes} and steps {steps} do not fit")
    out = shape
    for a in norm:
        out = out.replace(a, g.fresh_symbol("slice"))
    (y,) = g.dynamic(
        "slice",
        [x, g.view(starts, [len(norm)]), g.view(ends, [len(norm)])],
        (norm, tuple(steps)),
        [out],
        [g[x].dtype],
    )
    return y


@onnx_op("Slice")
def slice_(ctx: NodeContext) -> Result:
    rank = ctx.input_rank(0)
    if _data_bounds(ctx):
        return _dynamic_slice(ctx)
    starts, ends, axes, steps = _slice_args(ctx)
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        ctx.unsupported("starts, ends, axes and steps differ in length")
    norm = [axis_of(ctx, a, rank) for a in axes]
    if len(set(norm)) != len(norm) or 0 in steps:
        ctx.unsupported(f"repeated axes {axes} or a zero step {steps}")
    for e, st in zip(ends, steps, strict=True):
        if st < 0 and e.is_fixed and e.as_int() >= INT_BIG:
            # the spec clamps it to the last element (an empty slice), onnxruntime reads "to the
            # start": refuse rather than pick one
            ctx.unsupported(f"end {e} with negative step {st} (implementations disagree)")
    r = ctx.raw_input(0)
    fixed = all(s.is_fixed for s in starts + ends)
    if isinstance(r, Known) and fixed:
        for a, s, e, st in zip(norm, starts, ends, steps, strict=True):
            first, length = _fixed_bounds(r.shape[a], s.as_int(), e.as_int(), st)
            r = known_take(r, first + st * np.arange(length), a)
        return r
    x = ctx.input(0)
    for a, s, e, st in zip(norm, starts, ends, steps, strict=True):
        x = _slice_axis(ctx, x, a, s, e, st)
    return x


# -- Gather family ----------------------------------------------------------------------------------
def _static_indices(ctx: NodeContext, i: int) -> np.ndarray | None:
    """Integer indices known at load time (never symbolic), else None."""
    k = ctx.input_known(i)
    if k is None:
        return None
    if k.is_symbolic:
        ctx.unsupported(f"indices (input {i}) hold symbolic sizes {k.data.tolist()}")
    if not k.dtype.is_int:
        ctx.unsupported(f"indices must be integers, found {k.dtype}")
    return k.data.astype(np.int64)


def _normalise(ctx: NodeContext, idx: np.ndarray, n: int, what: str) -> np.ndarray:
    bad = (idx < -n) | (idx >= n)
    if bad.any():
        ctx.unsupported(f"{what} index {idx[bad][0]} out of range for size {n}")
    return np.where(idx < 0, idx + n, idx)


def _wrap_runtime(ctx: NodeContext, idx: Value, n: Size) -> Value:
    """Runtime indices as i64 with negatives wrapped: select(idx < 0, idx + n, idx)."""
    g = ctx.graph
    idx = g.cast(idx, DType.I64)
    wrapped = g.add(idx, scalar_operand(ctx, n, DType.I64))
    return g.select(g.binary(BinaryOp.LT, idx, 0), wrapped, idx)


def _take_flat(ctx: NodeContext, x: Value, axis: int, flat: Value, out: Shape) -> Value:
    g = ctx.graph
    return g.view(g.gather(x, axis, flat), out)


@onnx_op("Gather")
def gather(ctx: NodeContext) -> Result:
    shape = ctx.input_shape(0)
    axis = axis_of(ctx, ctx.attr_int("axis", 0), shape.rank)
    dim = shape[axis]
    idx = _static_indices(ctx, 1)
    r = ctx.raw_input(0)
    if isinstance(r, Known) and idx is not None:
        return known_take(r, _normalise(ctx, idx, r.shape[axis], "gather"), axis)
    g = ctx.graph
    x = ctx.input(0)
    idx_shape = ctx.input_shape(1)
    out = Shape(shape.dims[:axis]) + idx_shape + Shape(shape.dims[axis + 1 :])
    if idx is not None:
        flat = idx.reshape(-1)
        if dim.is_fixed:
            return _take_flat(
                ctx, x, axis, g.constant(_normalise(ctx, flat, dim.as_int(), "gather")), out
            )
        if (flat >= 0).all():
            return _take_flat(ctx, x, axis, g.constant(flat), out)
        indices = _wrap_runtime(ctx, g.constant(flat), dim)
    else:
        indices = g.view(ctx.input(1), Shape.of(idx_shape.size()))
        if ctx.input_dtype(1).is_signed:
            indices = _wrap_runtime(ctx, indices, dim)
    return _take_flat(ctx, x, axis, indices, out)


def _static_coords(idx: np.ndarray, axis: int, along: np.ndarray) -> list[np.ndarray]:
    """Per-axis coordinates of every index element, `along` replacing those on `axis`."""
    coords = [np.asarray(c) for c in np.indices(idx.shape)]
    coords[axis] = along
    return coords


def _ravel(coords: Sequence[np.ndarray], dims: Sequence[int]) -> np.ndarray:
    """Flat i64 positions of (in-range) coordinates in row-major `dims`."""
    if not coords or coords[0].size == 0:
        return np.zeros(0, np.int64)
    return np.ravel_multi_index(tuple(coords), tuple(dims)).reshape(-1).astype(np.int64)


def _linear(
    ctx: NodeContext, coords: Sequence[Value], dims: Sequence[Size], checked: set[int]
) -> Value:
    """Σ coordᵢ·strideᵢ (row-major strides of `dims`) in i64: a flat index into those dims.

    Coordinates whose position is in `checked` come from runtime indices: where any of them is out
    of range the flat index is -1, so the Gather raises instead of reading a neighbouring row."""
    g = ctx.graph
    total: Value | None = None
    bad: Value | None = None
    stride = Size(1)
    for i in reversed(range(len(coords))):
        c, d = coords[i], dims[i]
        term = g.mul(c, scalar_operand(ctx, stride, DType.I64))
        total = term if total is None else g.add(total, term)
        stride = stride * d
        if i in checked:
            out = g.binary(
                BinaryOp.OR,
                g.binary(BinaryOp.LT, c, 0),
                g.binary(BinaryOp.GE, c, scalar_operand(ctx, d, DType.I64)),
            )
            bad = out if bad is None else g.binary(BinaryOp.OR, bad, out)
    if total is None:
        ctx.unsupported("no index coordinates")
    return total if bad is None else g.select(bad, -1, total)


@onnx_op("GatherElements")
def gather_elements(ctx: NodeContext) -> Result:
    shape, idx_shape = ctx.input_shape(0), ctx.input_shape(1)
    axis = axis_of(ctx, ctx.attr_int("axis", 0), shape.rank)
    if idx_shape.rank != shape.rank:
        ctx.unsupported(f"indices rank {idx_shape.rank} differs from data rank {shape.rank}")
    g = ctx.graph
    for i, (n, d) in enumerate(zip(idx_shape, shape, strict=True)):
        if i == axis or n == d:
            continue
        if n.is_fixed and d.is_fixed and n.as_int() > d.as_int():
            ctx.unsupported(f"indices {idx_shape} do not fit in data {shape} on axis {i}")
        # symbolic: decided per binding, as onnxruntime decides it per run
        g.add_guard(d, ">=", n, f"indices {idx_shape} fit in data {shape} on axis {i}")
    x = g.view(ctx.input(0), Shape.of(shape.size()))
    idx = _static_indices(ctx, 1)
    if idx is not None and shape.is_fixed:
        static = _static_coords(
            idx, axis, _normalise(ctx, idx, shape[axis].as_int(), "gather_elements")
        )
        return _take_flat(ctx, x, 0, g.constant(_ravel(static, shape.fixed_dims())), idx_shape)
    along = _wrap_runtime(ctx, ctx.input(1), shape[axis])
    coords = [along if i == axis else g.iota(idx_shape, i) for i in range(shape.rank)]
    flat = g.view(_linear(ctx, coords, list(shape), {axis}), Shape.of(idx_shape.size()))
    return _take_flat(ctx, x, 0, flat, idx_shape)


@onnx_op("GatherND")
def gather_nd(ctx: NodeContext) -> Result:
    shape, idx_shape = ctx.input_shape(0), ctx.input_shape(1)
    b = ctx.attr_int("batch_dims", 0)
    if idx_shape.rank < 1 or not 0 <= b < min(shape.rank, idx_shape.rank):
        ctx.unsupported(f"batch_dims {b} invalid for data {shape} and indices {idx_shape}")
    k = idx_shape[-1].as_int("the index depth")
    if b + k == 0 or b + k > shape.rank:
        ctx.unsupported(f"indices {idx_shape} do not address data {shape} with batch_dims {b}")
    g = ctx.graph
    for i in range(b):  # the batch axes of data and indices are one axis
        g.same_size(shape[i], idx_shape[i], f"GatherND batch axis {i} of data and indices")
    lead = Shape(shape.dims[: b + k])
    rest = Shape(shape.dims[b + k :])
    rows = g.view(ctx.input(0), Shape.of(lead.size()) + rest)
    prefix = Shape(idx_shape.dims[:-1])
    out = prefix + rest
    idx = _static_indices(ctx, 1)
    if idx is not None and lead.is_fixed:
        dims = lead.fixed_dims()
        batch = [np.asarray(c) for c in np.indices(idx.shape[:-1])][:b]
        comps = [_normalise(ctx, idx[..., j], dims[b + j], "gather_nd") for j in range(k)]
        return _take_flat(ctx, rows, 0, g.constant(_ravel(batch + comps, dims)), out)
    iv = ctx.input(1)
    coords = [g.iota(prefix, i) for i in range(b)]
    for j in range(k):
        comp = g.view(g.slice_raw(iv, -1, j, 1, 1), prefix)
        coords.append(_wrap_runtime(ctx, comp, shape[b + j]))
    flat = g.view(_linear(ctx, coords, list(lead), set(range(b, b + k))), Shape.of(prefix.size()))
    return _take_flat(ctx, rows, 0, flat, out)


@onnx_op("Compress")
def compress(ctx: NodeContext) -> Result:
    shape = ctx.input_shape(0)
    g = ctx.graph
    x = ctx.input(0)
    if ctx.has_attr("axis"):
        axis = axis_of(ctx, ctx.attr_int("axis"), shape.rank)
    else:
        x, axis = g.view(x, Shape.of(shape.size())), 0
    known = ctx.input_known(1)
    if known is None and g.const_value(ctx.input(1)) is None:  # a data condition
        c = ctx.input(1)
        if g[c].rank != 1:
            ctx.unsupported(f"the condition must have rank 1, found {g[c].shape}")
        idx = nonzero_indices(ctx, c)
        return g.gather(x, axis, g.view(idx, Shape.of(g[idx].shape[1])))
    cond = np.asarray(ctx.input_static(1, "condition")).reshape(-1).astype(bool)
    dim = g.shape(x)[axis]
    if dim.is_fixed and cond.size > dim.as_int():
        ctx.unsupported(f"condition of length {cond.size} is longer than the axis ({dim})")
    return g.gather(x, axis, g.constant(np.nonzero(cond)[0].astype(np.int64)))


@onnx_op("ReverseSequence")
def reverse_sequence(ctx: NodeContext) -> Result:
    """One Gather with iota-computed rows (`reverse_prefixes`): the lengths may be data."""
    shape = ctx.input_shape(0)
    batch_axis = axis_of(ctx, ctx.attr_int("batch_axis", 1), shape.rank)
    time_axis = axis_of(ctx, ctx.attr_int("time_axis", 0), shape.rank)
    if batch_axis == time_axis or batch_axis > 1 or time_axis > 1:
        ctx.unsupported(f"batch_axis {batch_axis} and time_axis {time_axis}: expected 0 and 1")
    g = ctx.graph
    lens = ctx.input(1)
    if g[lens].rank != 1 or not g.dtype(lens).is_int:
        ctx.unsupported(
            f"sequence_lens must be a 1-D integer tensor, found {g.dtype(lens)}{g.shape(lens)}"
        )
    g.guard_equal(g.shape(lens)[0], shape[batch_axis], "ReverseSequence: sequence_lens")
    known = g.const_value(lens)
    steps = shape[time_axis].fixed_value()
    if known is not None and steps is not None and np.any((known < 0) | (known > steps)):
        ctx.unsupported(f"sequence_lens {known.tolist()} out of range [0, {steps}]")
    return reverse_prefixes(g, ctx.input(0), lens, time_axis, batch_axis)


# -- padding and cropping ---------------------------------------------------------------------------
def _pad_value(ctx: NodeContext, dtype: DType) -> float | int | bool:
    if ctx.opset < 11:
        value: float | int | bool = ctx.attr_float("value", 0.0)
    elif ctx.has_input(2):
        arr = np.asarray(ctx.input_static(2, "constant_value"))
        if arr.size != 1:
            ctx.unsupported(f"constant_value must be a scalar, found shape {list(arr.shape)}")
        value = arr.reshape(-1)[0].item()
    else:
        value = 0
    return np.array(value).astype(dtype.np).item()


@onnx_op("Pad")
def pad(ctx: NodeContext) -> Result:
    rank = ctx.input_rank(0)
    mode = ctx.attr_str("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        ctx.unsupported(f"mode '{mode}'")
    if ctx.opset < 11:
        pads = ctx.attr_ints("pads" if ctx.opset >= 2 else "paddings") or []
        axes = list(range(rank))
    else:
        pads = static_ints(ctx, 1, "pads")
        axes = static_ints(ctx, 3, "axes") if ctx.has_input(3) else list(range(rank))
    if len(pads) != 2 * len(axes):
        ctx.unsupported(f"{len(pads)} pads for {len(axes)} axes")
    per_axis = [(0, 0)] * rank
    for i, a in enumerate(axes):
        per_axis[axis_of(ctx, a, rank)] = (pads[i], pads[i + len(axes)])
    shape = ctx.input_shape(0)
    for axis, (before, after) in enumerate(per_axis):
        if shape[axis].is_fixed and shape[axis].as_int() - max(-before, 0) - max(-after, 0) < 0:
            ctx.unsupported(
                f"pads {before, after} crop more than the {shape[axis]} elements of axis {axis}"
            )
    value = _pad_value(ctx, ctx.input_dtype(0))
    return ctx.graph.pad(ctx.input(0), per_axis, mode, value)  # type: ignore[arg-type]


@onnx_op("CenterCropPad")
def center_crop_pad(ctx: NodeContext) -> Result:
    shape = ctx.input_shape(0)
    target = static_ints(ctx, 1, "shape")
    axes = [axis_of(ctx, a, shape.rank) for a in ctx.attr_ints("axes") or range(shape.rank)]
    if len(target) != len(axes):
        ctx.unsupported(f"shape {target} does not match axes {axes}")
    g = ctx.graph
    x = ctx.input(0)
    for a, want in zip(axes, target, strict=True):
        if Size(want) == shape[a]:
            continue
        n = shape[a].as_int(f"axis {a} size")
        if want < n:
            x = g.slice_raw(x, a, (n - want) // 2, 1, want)
        else:
            before = (want - n) // 2
            pads = [(0, 0)] * shape.rank
            pads[a] = (before, want - n - before)
            x = g.pad(x, pads)
    return x


# -- masks and one-hot encodings --------------------------------------------------------------------
def _band(ctx: NodeContext, rows: Size, cols: Size, k: int, op: BinaryOp) -> Value:
    """The bool [rows, cols] mask `col op row + k` (Trilu: GE for upper, LE for lower)."""
    g = ctx.graph
    r = g.iota(Shape.of(rows, cols), 0)
    c = g.iota(Shape.of(rows, cols), 1)
    return g.binary(op, c, g.add(r, k))


@onnx_op("Trilu")
def trilu(ctx: NodeContext) -> Result:
    shape = ctx.input_shape(0)
    if shape.rank < 2:
        ctx.unsupported(f"input rank {shape.rank} < 2")
    upper = ctx.attr_bool("upper", True)
    op = BinaryOp.GE if upper else BinaryOp.LE
    if ctx.has_input(1) and _data_k(ctx):
        # k from data (a graph input, a Loop's step): the sizes do not depend on it, so the
        # mask compares col - row with it at run time; no load per value of k
        g = ctx.graph
        kv = ctx.input(1)
        if g[kv].shape.size() != Size(1):
            ctx.unsupported(f"k must be a scalar, found shape {g[kv].shape}")
        rows, cols = shape[-2], shape[-1]
        diag = g.sub(g.iota(Shape.of(rows, cols), 1), g.iota(Shape.of(rows, cols), 0))
        mask = g.binary(op, diag, g.view(g.cast(kv, DType.I64), Shape.of()))
        return g.select(mask, ctx.input(0), 0)
    k = 0
    if ctx.has_input(1):
        ks = static_ints(ctx, 1, "k")
        if len(ks) != 1:
            ctx.unsupported(f"k must be a scalar, found {ks}")
        k = ks[0]
    mask = _band(ctx, shape[-2], shape[-1], k, op)
    return ctx.graph.select(mask, ctx.input(0), 0)


def _data_k(ctx: NodeContext) -> bool:
    """Trilu's k is not a load-time value (a constant or a shape tensor)."""
    return ctx.input_known(1) is None and ctx.graph.const_value(ctx.input(1)) is None


@onnx_op("EyeLike")
def eye_like(ctx: NodeContext) -> Result:
    shape = ctx.input_shape(0)
    if shape.rank != 2:
        ctx.unsupported(f"input rank {shape.rank}, expected 2")
    ctx.raw_input(0)
    dtype = ctx.input_dtype(0)
    if ctx.has_attr("dtype"):
        dtype = onnx_dtype(ctx.attr_int("dtype"), ctx.name)
    g = ctx.graph
    mask = _band(ctx, shape[0], shape[1], ctx.attr_int("k", 0), BinaryOp.EQ)
    if dtype.is_bool:
        return mask
    return g.select(mask, g.scalar(1, dtype), g.scalar(0, dtype))


@onnx_op("OneHot")
def one_hot(ctx: NodeContext) -> Result:
    idx_shape = ctx.input_shape(0)
    depth_arr = np.asarray(ctx.input_static(1, "depth")).reshape(-1)
    if (
        depth_arr.size != 1
        or not np.isfinite(depth_arr[0])
        or depth_arr[0] != int(depth_arr[0])
        or depth_arr[0] < 1
    ):
        ctx.unsupported(f"depth must be one positive integer, found {depth_arr.tolist()}")
    depth = int(depth_arr[0])
    axis = ctx.axis(ctx.attr_int("axis", -1), idx_shape.rank + 1)
    if ctx.input_shape(2) != Shape.of(2):
        ctx.unsupported(f"values must have shape [2], found {ctx.input_shape(2)}")
    g = ctx.graph
    values = ctx.input(2)
    off, on = (g.view(g.slice_raw(values, 0, i, 1, 1), Shape.of()) for i in (0, 1))
    idx = _wrap_runtime(ctx, ctx.input(0), Size(depth))
    out = idx_shape.insert(axis, depth)
    hit = g.binary(BinaryOp.EQ, g.iota(out, axis), g.view(idx, idx_shape.insert(axis, 1)))
    return g.select(hit, on, off)


# -- scatter (static indices) -----------------------------------------------------------------------
def _write_rounds(
    targets: np.ndarray, n: int, last_only: bool
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(mask [n], source update [n]) per round: round r holds each position's r-th write."""
    order = np.argsort(targets, kind="stable")
    sorted_t = targets[order]
    first = np.r_[0, np.flatnonzero(np.diff(sorted_t)) + 1]
    counts = np.diff(np.r_[first, sorted_t.size])
    rank = np.arange(sorted_t.size) - np.repeat(first, counts)
    if last_only:  # without reduction, the last write wins
        keep = np.repeat(counts - 1, counts) == rank
        rank = np.where(keep, 0, -1)
    rounds = []
    for r in range(int(rank.max()) + 1):
        sel = rank == r
        mask = np.zeros(n, bool)
        src = np.zeros(n, np.int64)
        mask[sorted_t[sel]] = True
        src[sorted_t[sel]] = order[sel]
        rounds.append((mask, src))
    return rounds


def _scatter(ctx: NodeContext, targets: np.ndarray, reduction: str) -> Value:
    """Write updates (flattened) to the flat data positions `targets[u]`, in order.

    Built as rounds of gather + select: round r applies every position's r-th write, so repeated
    positions accumulate exactly as the sequential reference does."""
    g = ctx.graph
    shape = ctx.input_shape(0)
    out = ctx.input(0)
    n = math.prod(shape.fixed_dims())
    updates = ctx.input(2)
    u_count = targets.size
    if u_count == 0:
        return out
    flat_upd = g.view(updates, Shape.of(u_count))
    for mask, src in _write_rounds(targets, n, reduction == "none"):
        upd = g.view(g.gather(flat_upd, 0, g.constant(src)), shape)
        match reduction:
            case "none":
                new = upd
            case "add":
                new = g.add(out, upd)
            case "mul":
                new = g.mul(out, upd)
            case "max":
                new = g.maximum(out, upd)
            case "min":
                new = g.minimum(out, upd)
            case _:
                ctx.unsupported(f"reduction '{reduction}'")
        out = g.select(g.view(g.constant(mask), shape), new, out)
    return out


def _scatter_shapes(ctx: NodeContext) -> tuple[tuple[int, ...], np.ndarray]:
    dims = ctx.input_shape(0).fixed_dims("scatter data shape")
    idx = np.asarray(ctx.input_static(1, "indices"))
    if idx.dtype.kind not in "iu":
        ctx.unsupported(f"indices must be integers, found {idx.dtype}")
    return dims, idx.astype(np.int64)


def _data_indices(ctx: NodeContext) -> bool:
    """Scatter indices computed from data (not known at load time)."""
    return ctx.input_known(1) is None and ctx.graph.const_value(ctx.input(1)) is None


def _dynamic_scatter(ctx: NodeContext, kind: str, params: tuple[object, ...]) -> Result:
    """Scatter with indices from data: a Dynamic op (the writes are data-dependent; the result
    has the data's shape), indices checked when it runs."""
    g = ctx.graph
    data, idx, upd = ctx.input(0), ctx.input(1), ctx.input(2)
    if g[idx].dtype.np.kind not in "iu":
        ctx.unsupported(f"indices must be integers, found {g[idx].dtype}")
    if g[upd].dtype != g[data].dtype:
        ctx.unsupported(f"updates are {g[upd].dtype}, data {g[data].dtype}")
    (out,) = g.dynamic(
        kind, [data, g.cast(idx, DType.I64), upd], params, [g[data].shape], [g[data].dtype]
    )
    return out


@onnx_op("Scatter", "ScatterElements")
def scatter_elements(ctx: NodeContext) -> Result:
    if _data_indices(ctx):
        axis = axis_of(ctx, ctx.attr_int("axis", 0), ctx.input_rank(0))
        return _dynamic_scatter(ctx, "scatter_elements", (axis, ctx.attr_str("reduction", "none")))
    dims, idx = _scatter_shapes(ctx)
    axis = axis_of(ctx, ctx.attr_int("axis", 0), len(dims))
    reduction = ctx.attr_str("reduction", "none")
    if idx.ndim != len(dims) or ctx.input_shape(2) != Shape.of(*idx.shape):
        ctx.unsupported(f"indices {list(idx.shape)} and updates {ctx.input_shape(2)} must match")
    bad = [i for i, (s, d) in enumerate(zip(idx.shape, dims, strict=True)) if s > d and i != axis]
    if bad:
        ctx.unsupported(f"indices {list(idx.shape)} exceed data {list(dims)} on axes {bad}")
    targets = _ravel(_static_coords(idx, axis, _normalise(ctx, idx, dims[axis], "scatter")), dims)
    return _scatter(ctx, targets, reduction)


@onnx_op("ScatterND")
def scatter_nd(ctx: NodeContext) -> Result:
    if _data_indices(ctx):
        return _dynamic_scatter(ctx, "scatter_nd", (ctx.attr_str("reduction", "none"),))
    dims, idx = _scatter_shapes(ctx)
    reduction = ctx.attr_str("reduction", "none")
    if idx.ndim < 1 or idx.shape[-1] > len(dims):
        ctx.unsupported(f"indices {list(idx.shape)} do not address data {list(dims)}")
    k = idx.shape[-1]
    want = Shape.of(*idx.shape[:-1], *dims[k:])
    if ctx.input_shape(2) != want:
        ctx.unsupported(f"updates {ctx.input_shape(2)}, expected {want}")
    comps = tuple(_normalise(ctx, idx[..., j], dims[j], "scatter_nd") for j in range(k))
    rows = _ravel(comps, dims[:k]) if k else np.zeros(math.prod(idx.shape[:-1]), np.int64)
    inner = math.prod(dims[k:])
    targets = (rows[:, None] * inner + np.arange(inner)[None, :]).reshape(-1)
    return _scatter(ctx, targets, reduction)


@onnx_op("TensorScatter")
def tensor_scatter(ctx: NodeContext) -> Result:
    """The KV-cache write: present = past with update written at write_indices[b] along `axis`
    (modulo the cache length in circular mode). Each cache position reads update position
    p - w (wrapped into [0, L) when circular) where that lies in [0, S)."""
    g = ctx.graph
    past, update = ctx.input(0), ctx.input(1)
    cs, us = g[past].shape, g[update].shape
    if cs.rank != us.rank or cs.rank < 2:
        ctx.unsupported(f"past {cs} and update {us} must have one rank of at least 2")
    axis = axis_of(ctx, ctx.attr_int("axis", -2), cs.rank)
    if axis == 0:
        ctx.unsupported("axis 0 is the batch axis")
    mode = ctx.attr_str("mode", "linear")
    if mode not in ("linear", "circular"):
        ctx.unsupported(f"mode '{mode}'")
    for i, (c, u) in enumerate(zip(cs, us, strict=True)):
        if i != axis:
            g.guard_equal(c, u, f"TensorScatter: axis {i} of past and update")
    length, seq = cs[axis], us[axis]
    d = g.iota(cs, axis)
    if ctx.has_input(2):
        w = g.cast(ctx.input(2), DType.I64)
        w = g.broadcast(g.view(w, Shape.of(cs[0], *([1] * (cs.rank - 1)))), cs)
        d = g.sub(d, w)
    if mode == "circular":  # p, w in [0, L): p - w in (-L, L)
        d = g.select(
            g.binary(BinaryOp.LT, d, 0), g.add(d, scalar_operand(ctx, length, DType.I64)), d
        )
    valid = g.binary(
        BinaryOp.AND,
        g.binary(BinaryOp.GE, d, 0),
        g.binary(BinaryOp.LT, d, scalar_operand(ctx, seq, DType.I64)),
    )
    coords = [g.select(valid, d, 0) if i == axis else g.iota(cs, i) for i in range(cs.rank)]
    flat = g.view(_linear(ctx, coords, list(us), set()), Shape.of(cs.size()))
    written = _take_flat(ctx, g.view(update, Shape.of(us.size())), 0, flat, cs)
    return g.select(valid, written, past)
