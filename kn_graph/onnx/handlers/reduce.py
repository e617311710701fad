"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare, ArgMax/ArgMin,
CumSum and CumProd.

The composite reductions are an elementwise map, one IR Reduce, and an elementwise finish, so
reducing over no axes (noop_with_empty_axes) keeps the map and the finish, as ONNX specifies.
Scans have no IR op: a fixed-length axis is scanned in log₂(n) shifted adds (or muls), a
symbolic one through a triangular mask and one Reduce.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kn_graph.errors import GraphError
from kn_graph.graph import Graph
from kn_graph.onnx.context import Known, NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.elementwise import Undecidable, known_binary
from kn_graph.onnx.handlers.shape import axis_of, static_ints
from kn_graph.ops import BinaryOp, ReduceOp, UnaryOp, Value
from kn_graph.shape import Size

Map = Callable[[Graph, Value], Value]


@dataclass(frozen=True, slots=True)
class _Reduction:
    """`finish(reduce(op, pre(x)))`; `axes_input_since` is the opset where axes became an input."""

    op: ReduceOp
    axes_input_since: int = 18
    pre: Map | None = None
    finish: Map | None = None


def _square(g: Graph, x: Value) -> Value:
    return g.mul(x, x)


_REDUCTIONS: dict[str, _Reduction] = {
    "ReduceSum": _Reduction(ReduceOp.SUM, axes_input_since=13),
    "ReduceMean": _Reduction(ReduceOp.MEAN),
    "ReduceMax": _Reduction(ReduceOp.MAX),
    "ReduceMin": _Reduction(ReduceOp.MIN),
    "ReduceProd": _Reduction(ReduceOp.PROD),
    "ReduceL1": _Reduction(ReduceOp.SUM, pre=lambda g, x: g.unary(UnaryOp.ABS, x)),
    "ReduceL2": _Reduction(ReduceOp.SUM, pre=_square, finish=lambda g, x: g.sqrt(x)),
    "ReduceSumSquare": _Reduction(ReduceOp.SUM, pre=_square),
    "ReduceLogSum": _Reduction(ReduceOp.SUM, finish=lambda g, x: g.log(x)),
}


def _reduce_axes(ctx: NodeContext, rank: int, axes_input_since: int) -> tuple[int, ...]:
    """The normalised axes; no axes means all of them, or none with noop_with_empty_axes."""
    noop = ctx.attr_bool("noop_with_empty_axes", False)
    axes: list[int] | None
    if ctx.opset >= axes_input_since:
        axes = None
        if ctx.has_input(1):
            axes = static_ints(ctx, 1, "the reduction axes")
    else:
        axes = ctx.attr_ints("axes")
    if not axes:
        return () if noop else tuple(range(rank))
    norm = tuple(ctx.axis(a, rank) for a in axes)
    if len(set(norm)) != len(norm):
        ctx.unsupported(f"repeated reduction axes {axes}")
    return norm


_KNOWN_PAIRS = {
    ReduceOp.SUM: BinaryOp.ADD,
    ReduceOp.PROD: BinaryOp.MUL,
    ReduceOp.MAX: BinaryOp.MAX,
    ReduceOp.MIN: BinaryOp.MIN,
}
_NUMPY_REDUCE = {
    ReduceOp.SUM: np.sum,
    ReduceOp.PROD: np.prod,
    ReduceOp.MAX: np.max,
    ReduceOp.MIN: np.min,
}


def _known_reduce(op: ReduceOp, k: Known, axes: tuple[int, ...], keepdims: bool) -> Known | None:
    """Sum/Prod/Max/Min of a shape tensor at load time, when every partial result is a size."""
    pair = _KNOWN_PAIRS.get(op)
    if pair is None or k.dtype.is_bool or any(k.shape[a] == 0 for a in axes):
        return None
    if not k.is_symbolic:
        out = _NUMPY_REDUCE[op](k.data, axis=axes, keepdims=keepdims)
        return Known(np.asarray(out).astype(k.dtype.np), k.dtype)
    data = k.data
    try:
        for a in sorted(axes, reverse=True):
            parts = [Known.of(np.take(data, i, axis=a), k.dtype) for i in range(data.shape[a])]
            acc = parts[0]
            for p in parts[1:]:
                acc = known_binary(pair, acc, p)
            data = acc.data
    except (Undecidable, GraphError, ValueError):  # the graph computes it at run time
        return None
    if keepdims:
        data = np.expand_dims(data, axes)
    return Known.of(data, k.dtype) if data.dtype == object else Known(np.asarray(data), k.dtype)


@onnx_op(*_REDUCTIONS)
def reduce(ctx: NodeContext) -> Result:
    spec = _REDUCTIONS[ctx.op_type]
    keepdims = ctx.attr_bool("keepdims", True)
    axes = _reduce_axes(ctx, ctx.input_rank(0), spec.axes_input_since)
    k = ctx.input_known(0)
    if k is not None and spec.pre is None and spec.finish is None:
        known = _known_reduce(spec.op, k, axes, keepdims)
        if known is not None:
            return known
    g = ctx.graph
    x = ctx.input(0)
    if spec.finish is not None or spec.op is ReduceOp.MEAN:
        _require_float(ctx, x)  # sqrt, log and mean of integers would need a rounding rule
    if spec.pre is not None:
        x = spec.pre(g, x)
    y = g.reduce(x, axes, spec.op, keepdims)
    return spec.finish(g, y) if spec.finish is not None else y


def _require_float(ctx: NodeContext, x: Value) -> None:
    dt = ctx.graph.dtype(x)
    if not dt.is_float:
        ctx.unsupported(f"{ctx.op_type} of {dt} input (float only here)")


@onnx_op("ReduceLogSumExp")
def reduce_log_sum_exp(ctx: NodeContext) -> Result:
    """m + log Σ exp(x - m) with m the (finite) maximum: no overflow for large inputs."""
    keepdims = ctx.attr_bool("keepdims", True)
    axes = _reduce_axes(ctx, ctx.input_rank(0), 18)
    g, x = ctx.graph, ctx.input(0)
    _require_float(ctx, x)
    m = g.reduce(x, axes, ReduceOp.MAX, keepdims=True)
    m = g.select(g.binary(BinaryOp.LT, g.unary(UnaryOp.ABS, m), math.inf), m, 0.0)
    total = g.reduce(g.exp(g.sub(x, m)), axes, ReduceOp.SUM, keepdims)
    if not keepdims:
        m = g.view(m, g.shape(total))
    return g.add(g.log(total), m)


# -- ArgMax / ArgMin -------------------------------------------------------------------------------
@onnx_op("ArgMax", "ArgMin")
def arg_reduce(ctx: NodeContext) -> Result:
    """select_last_index flips the axis and maps the index i back to n - 1 - i."""
    op = ReduceOp.ARGMAX if ctx.op_type == "ArgMax" else ReduceOp.ARGMIN
    g, x = ctx.graph, ctx.input(0)
    axis = axis_of(ctx, ctx.attr_int("axis", 0), g[x].rank)
    if g.shape(x)[axis] == Size(0):
        ctx.unsupported(f"{ctx.op_type} over the empty axis {axis} of {g.shape(x)}")
    keepdims = ctx.attr_bool("keepdims", True)
    if not ctx.attr_bool("select_last_index", False):
        return g.reduce(x, [axis], op, keepdims)
    n = g.shape(x)[axis].as_int(f"select_last_index: size of axis {axis}")
    return g.sub(n - 1, g.reduce(g.flip(x, axis), [axis], op, keepdims))


# -- CumSum / CumProd ------------------------------------------------------------------------------
def _shift(g: Graph, x: Value, axis: int, k: int, fill: float | int) -> Value:
    """x moved k places forward along axis; the k leading places get `fill`."""
    pads = [(0, 0)] * g[x].rank
    pads[axis] = (k, -k)
    return g.pad(x, pads, value=fill)


def _scan_fixed(
    g: Graph, x: Value, axis: int, op: BinaryOp, exclusive: bool, reverse: bool
) -> Value:
    """Hillis-Steele: after the step with shift k every element holds the combination of the
    2k elements ending at it."""
    fill = 0 if op is BinaryOp.ADD else 1
    n = g.shape(x)[axis].as_int("scan axis size")
    if reverse:
        x = g.flip(x, axis)
    if exclusive and n > 0:
        x = _shift(g, x, axis, 1, fill)
    k = 1
    while k < n:
        x = g.binary(op, x, _shift(g, x, axis, k, fill))
        k *= 2
    return g.flip(x, axis) if reverse else x


def _scan_symbolic(
    g: Graph, x: Value, axis: int, op: BinaryOp, exclusive: bool, reverse: bool
) -> Value:
    """out[i] = combination of x[j] over j ≤ i (< i, ≥ i, > i): a triangular mask over a
    broadcast [.., n_i, n_j, ..] and one Reduce over j; works for any (symbolic) length."""
    shape = g.shape(x)
    full = shape.insert(axis, shape[axis])
    xj = g.broadcast(g.unsqueeze(x, [axis]), full)
    i, j = g.iota(full, axis), g.iota(full, axis + 1)
    cmp = {
        (False, False): BinaryOp.LE,
        (True, False): BinaryOp.LT,
        (False, True): BinaryOp.GE,
        (True, True): BinaryOp.GT,
    }[(exclusive, reverse)]
    fill = 0 if op is BinaryOp.ADD else 1
    masked = g.select(g.binary(cmp, j, i), xj, fill)
    return g.reduce(masked, [axis + 1], ReduceOp.SUM if op is BinaryOp.ADD else ReduceOp.PROD)


@onnx_op("CumSum", "CumProd")
def cumulative(ctx: NodeContext) -> Result:
    op = BinaryOp.ADD if ctx.op_type == "CumSum" else BinaryOp.MUL
    g, x = ctx.graph, ctx.input(0)
    axis_arr = static_ints(ctx, 1, "the axis")
    if len(axis_arr) != 1:
        ctx.unsupported(f"axis must be one integer, found {axis_arr}")
    axis = axis_of(ctx, axis_arr[0], g[x].rank)
    exclusive = ctx.attr_bool("exclusive", False)
    reverse = ctx.attr_bool("reverse", False)
    if g.dtype(x).is_bool:
        ctx.unsupported("bool input")
    if g.shape(x)[axis].is_fixed:
        return _scan_fixed(g, x, axis, op, exclusive, reverse)
    return _scan_symbolic(g, x, axis, op, exclusive, reverse)
