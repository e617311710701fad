"""Sequences whose length is known at load time (`Seq`: a tuple of results) and optionals that
hold a tensor: SequenceConstruct/Empty/Length/At/Insert/Erase, SplitToSequence,
ConcatFromSequence, SequenceMap, Optional, OptionalHasElement, OptionalGetElement.

Exporters build these around a fixed number of tensors (a list of feature maps, a tuple of
cache entries), so the sequence ops run at load time and leave plain tensors in the graph.
"""

from __future__ import annotations

import numpy as np

from kn_graph.dtype import DType
from kn_graph.onnx.context import Known, NodeContext, Result, Seq, onnx_dtype, onnx_op
from kn_graph.onnx.handlers.shape import axis_of
from kn_graph.ops import Value
from kn_graph.shape import Shape, Size


def _seq(ctx: NodeContext, i: int, stacked_ok: bool = True) -> Seq:
    r = ctx.raw_input(i)
    if not isinstance(r, Seq):
        ctx.unsupported(f"input {i} ('{ctx.input_name(i)}') must be a sequence")
    if not stacked_ok:
        _items(ctx, r)
    return r


def _dtype_of(ctx: NodeContext, r: Result) -> DType:
    if isinstance(r, Seq):
        ctx.unsupported("a sequence of sequences")
    return r.dtype if isinstance(r, Known) else ctx.graph[r].dtype


def _position(ctx: NodeContext, i: int, n: int, insert: bool) -> int:
    """A load-time position in a sequence of n, negatives counted from the end."""
    pos = int(np.asarray(ctx.input_static(i, "position")).reshape(-1)[0])
    hi = n if insert else n - 1
    p = pos + n if pos < 0 else pos
    if not 0 <= p <= hi:
        ctx.unsupported(f"position {pos} is outside a sequence of {n}")
    return p


@onnx_op("SequenceConstruct")
def sequence_construct(ctx: NodeContext) -> Result:
    items = tuple(ctx.tensor_input(i) for i in range(ctx.num_inputs))
    dts = {_dtype_of(ctx, r) for r in items}
    if len(dts) > 1:
        ctx.unsupported(f"elements of different types {sorted(str(d) for d in dts)}")
    return Seq(items, dts.pop() if dts else None)


@onnx_op("SequenceEmpty")
def sequence_empty(ctx: NodeContext) -> Result:
    dt = onnx_dtype(ctx.attr_int("dtype", 1), ctx.name)
    return Seq((), dt)


def _items(ctx: NodeContext, s: Seq) -> tuple[Result, ...]:
    if s.stacked is not None:
        ctx.unsupported("a sequence whose length is only known at run time, used element-wise")
    return s.items


@onnx_op("SequenceLength")
def sequence_length(ctx: NodeContext) -> Result:
    s = _seq(ctx, 0)
    if s.stacked is not None:
        return ctx.size_value(ctx.graph[s.stacked].shape[0], DType.I64)
    return Known(np.array(len(s.items), np.int64), DType.I64)


@onnx_op("SequenceAt")
def sequence_at(ctx: NodeContext) -> Result:
    s = _seq(ctx, 0)
    items = _items(ctx, s)
    return items[_position(ctx, 1, len(items), insert=False)]


@onnx_op("SequenceInsert")
def sequence_insert(ctx: NodeContext) -> Result:
    s = _seq(ctx, 0, stacked_ok=False)
    t = ctx.tensor_input(1)
    if s.dtype is not None and _dtype_of(ctx, t) != s.dtype:
        ctx.unsupported(f"inserting {_dtype_of(ctx, t)} into a sequence of {s.dtype}")
    n = len(s.items)
    p = _position(ctx, 2, n, insert=True) if ctx.has_input(2) else n
    return Seq((*s.items[:p], t, *s.items[p:]), _dtype_of(ctx, t))


@onnx_op("SequenceErase")
def sequence_erase(ctx: NodeContext) -> Result:
    s = _seq(ctx, 0, stacked_ok=False)
    n = len(s.items)
    p = _position(ctx, 1, n, insert=False) if ctx.has_input(1) else n - 1
    if p < 0:
        ctx.unsupported("erasing from an empty sequence")
    return Seq((*s.items[:p], *s.items[p + 1 :]), s.dtype)


@onnx_op("SplitToSequence")
def split_to_sequence(ctx: NodeContext) -> Result:
    g = ctx.graph
    x = ctx.input(0)
    shape = g[x].shape
    axis = axis_of(ctx, ctx.attr_int("axis", 0), shape.rank)
    keepdims = ctx.attr_bool("keepdims", True)
    dim = shape[axis]
    if ctx.has_input(1):
        split = np.asarray(ctx.input_static(1, "split")).astype(np.int64)
        if split.ndim > 1:
            ctx.unsupported(f"split must be a scalar or 1-D, found shape {list(split.shape)}")
        n = dim.as_int() if split.ndim == 0 else None
        if split.ndim == 0:
            step = int(split)
            if step <= 0:
                ctx.unsupported(f"split {step} must be positive")
            sizes = [min(step, n - k) for k in range(0, n, step)]
        else:
            sizes = [int(v) for v in split]
            if any(v < 0 for v in sizes):
                ctx.unsupported(f"negative split sizes {sizes}")
            g.guard_equal(dim, Size(sum(sizes)), "SplitToSequence: split sizes and axis length")
        keepdims = True  # keepdims applies only without `split`
    else:
        sizes = [1] * dim.as_int()
    items = []
    start: Size = Size(0)
    for k in sizes:
        part = g.slice_raw(x, axis, start, 1, k)
        start = start + k
        items.append(part if keepdims else g.view(part, g[part].shape.remove(axis)))
    return Seq(tuple(items), g[x].dtype)


@onnx_op("ConcatFromSequence")
def concat_from_sequence(ctx: NodeContext) -> Result:
    g = ctx.graph
    s = _seq(ctx, 0)
    if s.stacked is not None:
        return _concat_stacked(ctx, s.stacked)
    if not s.items:
        ctx.unsupported("concatenating an empty sequence")
    vals = [ctx.loader.as_value(r) for r in s.items]
    rank = g[vals[0]].rank
    new_axis = ctx.attr_bool("new_axis", False)
    axis = ctx.axis(ctx.attr_int("axis"), rank + 1 if new_axis else rank)
    if new_axis:
        vals = [g.view(v, g[v].shape.insert(axis, 1)) for v in vals]
    return g.concat(vals, axis)


@onnx_op("SequenceMap")
def sequence_map(ctx: NodeContext) -> list[Result]:
    body = ctx.attr_graph("body")
    if body is None or len(body.input) != ctx.num_inputs:
        ctx.unsupported("the body must take one input per node input")
    first = _seq(ctx, 0, stacked_ok=False)
    n = len(first.items)
    args = [ctx.raw_input(i) for i in range(ctx.num_inputs)]
    for i, a in enumerate(args):
        if isinstance(a, Seq) and len(a.items) != n:
            ctx.unsupported(f"input {i} has {len(a.items)} elements, input 0 has {n}")
    outs: list[list[Result]] = [[] for _ in body.output]
    for k in range(n):
        bound = {
            vi.name: (a.items[k] if isinstance(a, Seq) else a)
            for vi, a in zip(body.input, args, strict=True)
        }
        for j, r in enumerate(ctx.loader.inline_graph(body, ctx, bound)):
            outs[j].append(r)
    return [Seq(tuple(items), _dtype_of(ctx, items[0]) if items else None) for items in outs]


@onnx_op("Optional")
def optional(ctx: NodeContext) -> Result:
    if not ctx.has_input(0):
        ctx.unsupported("an empty optional")
    return ctx.raw_input(0)


@onnx_op("OptionalGetElement")
def optional_get_element(ctx: NodeContext) -> Result:
    return ctx.raw_input(0)


@onnx_op("OptionalHasElement")
def optional_has_element(ctx: NodeContext) -> Result:
    # an optional here always holds its value (empty optionals are refused where they are made)
    present = ctx.has_input(0)
    if present:
        ctx.raw_input(0)
    return Known(np.array(present), DType.BOOL)


def _concat_stacked(ctx: NodeContext, st: Value) -> Result:
    """ConcatFromSequence of a stack [L, *element]: with new_axis the element axis `axis` gets
    L in front of it (a permute); without, L merges into the element's axis `axis` (a view)."""
    g = ctx.graph
    shape = g[st].shape
    rank = shape.rank - 1
    new_axis = ctx.attr_bool("new_axis", False)
    axis = ctx.axis(ctx.attr_int("axis"), rank + 1 if new_axis else rank)
    perm = [*range(1, axis + 1), 0, *range(axis + 1, rank + 1)]
    moved = g.permute(st, perm)
    if new_axis:
        return moved
    dims = list(g[moved].shape.dims)
    merged = dims[axis] * dims[axis + 1]
    return g.view(moved, Shape((*dims[:axis], merged, *dims[axis + 2 :])))
