"""Range, ConstantOfShape, Expand, Reshape and Tile whose size inputs are data inside a subgraph
(a Loop body's step counter or a loop-carried length: an attention decoder's Range(0, step)).

Such a node becomes a `Dynamic` op (`kn_graph.dynamic` holds its NumPy semantics) whose unknown
sizes are fresh run-time symbols, bound each time the body runs. Sizes that can be read off the
graph (constant elements of a Concat'ed shape, a size of another value, an axis that broadcasting
keeps) stay what they are, so the rest of the body keeps fixed sizes where the model has them.
In the model's own graph these inputs are given values instead (value specialization,
`kn_graph.onnx.specialized`), which keeps every size of the graph fixed.
"""

from __future__ import annotations

import numpy as np

from kn_graph.dtype import DType
from kn_graph.errors import StaticInputRequiredError, SymbolicSizeError
from kn_graph.graph import Graph
from kn_graph.onnx.context import Known, NodeContext
from kn_graph.ops import Broadcast, Concat, Constant, Reduce, ReduceOp, Unary, UnaryOp, Value, View
from kn_graph.shape import Shape, Size

__all__ = [
    "at_run_time",
    "dynamic_constant_of_shape",
    "dynamic_expand",
    "dynamic_range",
    "dynamic_reshape",
    "dynamic_tile",
]

_MAX_LOOKS = 64
"""How many values `_elements` looks at behind one shape tensor."""


def at_run_time(ctx: NodeContext, *indices: int) -> bool:
    """Whether any of these inputs is data only a run gives, inside a subgraph: a value that
    is neither known at load time (a constant, a shape tensor, a size) nor computed from such."""
    if not ctx.in_subgraph:
        return False
    for i in indices:
        if not ctx.has_input(i):
            continue
        r = ctx.tensor_input(i)
        if isinstance(r, Known) or r in ctx.loader.value_sizes:
            continue
        try:
            ctx.input_static(i, "a size input")
        except (StaticInputRequiredError, SymbolicSizeError):
            return True
    return False


def _where(ctx: NodeContext) -> str:
    return f"{ctx.op_type} '{ctx.name}'"


def _elements(g: Graph, v: Value) -> list[Size | None]:
    """The elements of a small integer tensor as far as the graph tells them (None: data),
    looking back through views, casts and concats (an explicit stack, at most `_MAX_LOOKS`
    values) to constants and sizes."""
    out: list[Size | None] = []
    stack, looks = [v], 0
    while stack:
        x = stack.pop()
        info = g[x]
        n = info.shape.size().as_int()
        looks += 1
        same = g.scalar_value(x) if info.dtype.is_int else None
        match info.op:
            case _ if same is not None:
                out += [Size(int(same))] * n
            case _ if looks > _MAX_LOOKS or not info.dtype.is_int:
                out += [None] * n
            case Constant(t):
                out += [Size(int(e)) for e in t.array.reshape(-1)]
            case View(y) | Unary(y, UnaryOp.CAST) if g[y].dtype.is_int:
                stack.append(y)
            case Concat(xs, 0) if info.rank == 1:
                stack += reversed(xs)  # the first part is taken next
            case Reduce(y, (0,), ReduceOp.SUM) if _ones(g, y):
                out.append(g[y].shape[0])  # `Graph.size_value` of a symbol: a sum of ones
            case _:
                out += [None] * n
    return out


def _ones(g: Graph, v: Value) -> bool:
    return isinstance(g[v].op, Broadcast) and g[v].rank == 1 and g.scalar_value(v) == 1


def _shape_input(ctx: NodeContext, i: int, what: str) -> tuple[Value, list[Size | None]]:
    """Input i (a shape or repeats) as a 1-d int64 value of fixed length, with its elements as
    far as they are known."""
    g = ctx.graph
    v = ctx.input(i)
    shape = g[v].shape
    if shape.rank > 1 or not shape.is_fixed:
        ctx.unsupported(f"{what} (input {i}) must be 1-d of a fixed length, found {shape}")
    if not g[v].dtype.is_int:
        ctx.unsupported(f"{what} (input {i}) must be integers, found {g[v].dtype}")
    elements = _elements(g, v)
    v = g.view(g.cast(v, DType.I64) if g[v].dtype != DType.I64 else v, [len(elements)])
    return v, elements


def _size_or_fresh(ctx: NodeContext, e: Size | None, hint: str) -> Size:
    """A known non-negative element as the size, else a fresh run-time symbol."""
    if e is not None and e.bounds()[0] >= 0:
        return e
    return ctx.graph.fresh_symbol(hint)


def _dynamic(
    ctx: NodeContext, kind: str, args: list[Value], params: tuple, out: Shape, dt: DType
) -> Value:
    (y,) = ctx.graph.dynamic(kind, args, (*params, _where(ctx)), [out], [dt])
    return y


def dynamic_range(ctx: NodeContext) -> Value:
    """Range(start, limit, delta) with a bound from data: its length is a run-time size."""
    g = ctx.graph
    dt = ctx.input_dtype(0)
    args = []
    for i, what in enumerate(("start", "limit", "delta")):
        v = ctx.input(i)
        if g[v].shape.size() != Size(1):
            ctx.unsupported(f"{what} must be a scalar, found shape {g[v].shape}")
        args.append(g.view(g.cast(v, dt) if g[v].dtype != dt else v, [1]))
    ctx.ignore_attrs("stash_type")
    return _dynamic(ctx, "range", args, (), Shape.of(g.fresh_symbol("range")), dt)


def dynamic_constant_of_shape(ctx: NodeContext, value: np.ndarray) -> Value:
    """A tensor of one value, of a shape from data."""
    dt = DType.from_np(value.dtype)
    shape, elements = _shape_input(ctx, 0, "the shape")
    out = Shape(tuple(_size_or_fresh(ctx, e, "constant_of_shape") for e in elements))
    return _dynamic(ctx, "constant_of_shape", [shape], (value.reshape(-1)[0].item(),), out, dt)


def dynamic_expand(ctx: NodeContext) -> Value:
    """x broadcast with a target shape from data. An axis the target gives as a known size
    other than 1 takes it; a known 1 keeps x's size; where the target is data, an axis of x
    of a fixed size other than 1 keeps it (the target can only be 1 or equal there)."""
    g = ctx.graph
    x = ctx.input(0)
    xs = g[x].shape
    shape, elements = _shape_input(ctx, 1, "the shape")
    rank = max(xs.rank, len(elements))
    none: list[Size | None] = [None] * rank  # None: no such axis (x), data (the target)
    ext_x = none[: rank - xs.rank] + list(xs.dims)
    ext_t = none[: rank - len(elements)] + elements
    dims = []
    for k, (d, t) in enumerate(zip(ext_x, ext_t, strict=True)):
        if k < rank - len(elements) or t == Size(1):  # x's size stays
            dims.append(d if d is not None else Size(1))
        elif t is not None and t.bounds()[0] >= 0 and (d is None or d == t or t.is_fixed):
            dims.append(t)
        elif d is not None and d.is_fixed and d != Size(1):
            dims.append(d)
        else:
            dims.append(g.fresh_symbol("expand"))
    return _dynamic(ctx, "expand", [x, shape], (), Shape(tuple(dims)), g[x].dtype)


def dynamic_reshape(ctx: NodeContext, allowzero: bool) -> Value:
    """x reshaped to a shape from data (0 copies an axis of x unless `allowzero`, one -1 is
    inferred): a known element keeps its size; the others, and the -1, are run-time sizes."""
    g = ctx.graph
    x = ctx.input(0)
    xs = g[x].shape
    shape, elements = _shape_input(ctx, 1, "the shape")
    dims = []
    for k, e in enumerate(elements):
        if e == Size(0) and not allowzero and k < xs.rank:
            dims.append(xs[k])
        else:
            dims.append(_size_or_fresh(ctx, e, "reshape"))
    return _dynamic(ctx, "reshape", [x, shape], (allowzero,), Shape(tuple(dims)), g[x].dtype)


def dynamic_tile(ctx: NodeContext) -> Value:
    """x repeated along each axis a number of times from data."""
    g = ctx.graph
    x = ctx.input(0)
    xs = g[x].shape
    reps, elements = _shape_input(ctx, 1, "the repeats")
    if len(elements) != xs.rank:
        ctx.unsupported(f"{len(elements)} repeats for an input of rank {xs.rank}")
    dims = [
        d * e if e is not None and e.bounds()[0] >= 0 else g.fresh_symbol("tile")
        for d, e in zip(xs.dims, elements, strict=True)
    ]
    return _dynamic(ctx, "tile", [x, reps], (), Shape(tuple(dims)), g[x].dtype)
