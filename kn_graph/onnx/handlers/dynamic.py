"""Ops whose result sizes depend on data: NonZero, TopK, NonMaxSuppression, Unique (and the data
condition of Compress). Each becomes an IR `Dynamic` op whose unknown sizes are fresh run-time
symbols; with inputs known at load time they are computed here instead."""

from __future__ import annotations

import numpy as np

from kn_graph.dtype import DType
from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.shape import axis_of
from kn_graph.ops import Value
from kn_graph.shape import Shape, Size


def results(ctx: NodeContext, values: list[Value]) -> list[Result]:
    """Dynamic results as loader results: constants the builder computed stay load-time Knowns."""
    out: list[Result] = []
    for v in values:
        arr = ctx.graph.const_value(v)
        out.append(ctx.loader.result_of_array(arr) if arr is not None else v)
    return out


def nonzero_indices(ctx: NodeContext, x: Value) -> Value:
    """i64[rank, n]: the coordinates of the non-zero elements of x, n a run-time size."""
    g = ctx.graph
    n = g.fresh_symbol("nonzero")
    (idx,) = g.dynamic("nonzero", [x], (), [Shape.of(g[x].rank, n)], [DType.I64])
    return idx


@onnx_op("NonZero")
def nonzero(ctx: NodeContext) -> Result:
    x = ctx.input(0)
    if ctx.graph[x].rank == 0:
        x = ctx.graph.view(x, [1])  # onnxruntime treats a scalar as one element
    return results(ctx, [nonzero_indices(ctx, x)])[0]


def _size_arg(ctx: NodeContext, i: int, what: str) -> tuple[Value, Size]:
    """A one-element integer input as (graph value, size): the size is its load-time value
    (possibly symbolic) or a fresh run-time symbol."""
    k = ctx.input_known(i)
    if k is not None:
        if k.data.size != 1:
            ctx.unsupported(f"{what} must have one element, found shape {list(k.shape)}")
        size = k.sizes()[0]
        return ctx.size_value(size, DType.I64) if k.is_symbolic else ctx.input(i), size
    v = ctx.input(i)
    if ctx.graph[v].shape.size() != Size(1):
        ctx.unsupported(f"{what} must have one element, found shape {ctx.graph[v].shape}")
    return v, ctx.graph.fresh_symbol(ctx.op_type.lower())


@onnx_op("TopK")
def topk(ctx: NodeContext) -> list[Result]:
    g = ctx.graph
    shape = ctx.input_shape(0)
    axis = axis_of(ctx, ctx.attr_int("axis", -1), shape.rank)
    largest = ctx.attr_bool("largest", True)
    sorted_ = ctx.attr_bool("sorted", True)
    if ctx.opset < 10:
        kk = ctx.attr_int("k")
        kv, k = g.constant(np.array([kk], np.int64)), Size(kk)
    else:
        kv, k = _size_arg(ctx, 1, "k")
    kv = g.view(g.cast(kv, DType.I64), [1])
    n = shape[axis]
    if k.is_fixed and n.is_fixed and k.as_int() > n.as_int():
        ctx.unsupported(f"k = {k} is larger than axis {axis} ({n})")
    g.add_guard(n, ">=", k, "TopK: k must not exceed the axis length")
    out = shape.replace(axis, k)
    x = ctx.input(0)
    vals = g.dynamic("topk", [x, kv], (axis, largest, sorted_), [out, out], [g[x].dtype, DType.I64])
    return results(ctx, vals)


@onnx_op("NonMaxSuppression")
def non_max_suppression(ctx: NodeContext) -> Result:
    g = ctx.graph
    boxes, scores = ctx.input(0), ctx.input(1)
    bs, ss = g[boxes].shape, g[scores].shape
    if bs.rank != 3 or ss.rank != 3:
        ctx.unsupported(f"boxes {bs} and scores {ss} must have rank 3")
    g.guard_equal(bs[0], ss[0], "NonMaxSuppression: batch of boxes and scores")
    g.guard_equal(bs[1], ss[2], "NonMaxSuppression: box count of boxes and scores")
    if bs[2] != Size(4):
        ctx.unsupported(f"boxes {bs} must have 4 coordinates on the last axis")
    center = ctx.attr_int("center_point_box", 0)
    if center not in (0, 1):
        ctx.unsupported(f"center_point_box must be 0 or 1, found {center}")
    args = [boxes, scores]
    present = []
    for i, dt in ((2, DType.I64), (3, DType.F32), (4, DType.F32)):
        present.append(ctx.has_input(i))
        if ctx.has_input(i):
            v = ctx.input(i)
            if ctx.graph[v].shape.size() != Size(1):
                ctx.unsupported(f"input {i} must have one element, found {ctx.graph[v].shape}")
            args.append(g.cast(v, dt) if g[v].dtype != dt else v)
    n = g.fresh_symbol("nms")
    (sel,) = g.dynamic("nms", args, (bool(center), *present), [Shape.of(n, 3)], [DType.I64])
    return results(ctx, [sel])[0]


@onnx_op("Unique")
def unique(ctx: NodeContext) -> list[Result]:
    g = ctx.graph
    x = ctx.input(0)
    shape = g[x].shape
    sorted_ = ctx.attr_bool("sorted", True)
    u = g.fresh_symbol("unique")
    if ctx.has_attr("axis"):
        axis = axis_of(ctx, ctx.attr_int("axis"), shape.rank)
        y = shape.replace(axis, u)
        inverse = Shape.of(shape[axis])
    else:
        axis = None
        y, inverse = Shape.of(u), Shape.of(shape.size())
    i64 = DType.I64
    outs = g.dynamic(
        "unique",
        [x],
        (axis, sorted_),
        [y, Shape.of(u), inverse, Shape.of(u)],
        [g[x].dtype, i64, i64, i64],
    )
    return results(ctx, outs)
