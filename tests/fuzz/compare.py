"""The fuzzer's oracle check: the outputs of the product (`Device.cpu()`, the plan run as C and
oneDNN) against the reference executor's (`Device.cpu(reference=True)`), and the edge values
(INT_MIN, -1, 0, max; NaN, ±Inf, ±0) mixed into some cases' inputs.

`difference(got, want, loosest)` is None when they agree, else a short description of the first
output that does not: same count, shapes and dtypes; integers and bools exactly; floats within
the tolerance of the parity tests (`tests.kn_cuda_eval.helpers.TOL`, relative to max(1, max |ref|))
of their dtype, or `loosest` when that is larger: `graph_tolerance`, the tolerance of the least
precise float type the graph computes in (an f64 output of f32 math is as exact as f32); NaN
exactly where the reference has NaN and infinities equal.

`localize(graph, feed)` finds the first value of a disagreeing graph that differs, and whether
that is round-off: its operands agree and the reference computes the product's value from the
product's operands (a division by a near-zero, an argmax of near-ties: the op amplified the two
executors' rounding), or a fused step differs before a discrete op (argmax, a comparison, a
float -> int cast, TopK ...) that round-off can flip."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kn_graph.graph import Graph
from kn_graph.ops import (
    Binary,
    BinaryOp,
    Broadcast,
    Constant,
    Dynamic,
    Input,
    Iota,
    Reduce,
    Slice,
    Unary,
    UnaryOp,
    Value,
    View,
)
from kn_graph.optimizer.core import copy_op
from kn_runtime import Device
from tests.kn_cuda_eval.helpers import TOL

__all__ = ["difference", "graph_tolerance", "localize", "with_edge_values"]


def _show(a: np.ndarray) -> str:
    """The first and last few elements (flattened: the shape is said beside it)."""
    return np.array2string(a.reshape(-1), threshold=8, edgeitems=3, precision=6)


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape))


def _array_difference(got: np.ndarray, want: np.ndarray, loosest: float = 0.0) -> str | None:
    if got.shape != want.shape:
        return f"shape {list(got.shape)} != reference {list(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != reference {want.dtype}"
    if want.dtype.kind != "f":
        bad = got != want
        if not bad.any():
            return None
        at = _first(bad)
        return (
            f"{int(bad.sum())} of {bad.size} elements differ (exact dtype {want.dtype}); "
            f"first at {at}: {got[at]!r} vs reference {want[at]!r}"
        )
    nan_g, nan_w = np.isnan(got), np.isnan(want)
    if (nan_g != nan_w).any():
        at = _first(nan_g != nan_w)
        return (
            f"NaN positions differ ({int(nan_g.sum())} NaN vs {int(nan_w.sum())} in the "
            f"reference); first at {at}: {got[at]!r} vs reference {want[at]!r}"
        )
    inf_w = np.isinf(want)
    bad_inf = (inf_w | np.isinf(got)) & (got != want)
    if bad_inf.any():
        at = _first(bad_inf)
        return f"infinities differ; first at {at}: {got[at]!r} vs reference {want[at]!r}"
    fin = np.isfinite(want)
    if not fin.any():
        return None
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    err = np.zeros(want.shape)
    err[fin] = np.abs(g64[fin] - w64[fin])  # got is finite there too (checked above)
    scale = max(1.0, float(np.max(np.abs(w64[fin]))))
    tol = max(TOL["f"][want.dtype.itemsize], loosest)
    worst = float(np.max(err)) / scale
    if worst <= tol:
        return None
    at = _first(err > tol * scale)
    return (
        f"max |d| / max(1, max |ref|) = {worst:.3g} > {tol:g} ({want.dtype}); first at {at}: "
        f"{got[at]!r} vs reference {want[at]!r}"
    )


def graph_tolerance(graph: Graph) -> float:
    """The float tolerance of the least precise float type among the graph's values (0: none)."""
    sizes = {info.dtype.size for info in graph.value_infos() if info.dtype.is_float}
    return max((TOL["f"][n] for n in sizes), default=0.0)


def difference(got: Any, want: Any, loosest: float = 0.0) -> str | None:
    """None when the product's outputs `got` agree with the reference's `want` (lists of arrays;
    a sequence output is itself a list), else what differs, with both values. Floats within
    their dtype's tolerance or `loosest`, whichever is larger."""
    stack: list[tuple[str, Any, Any]] = [("outputs", got, want)]
    while stack:
        where, g, w = stack.pop()
        if isinstance(w, list | tuple):
            if not isinstance(g, list | tuple):
                return f"{where}: {type(g).__name__} where the reference has a sequence"
            if len(g) != len(w):
                return f"{where}: {len(g)} values != reference {len(w)}"
            pairs = list(enumerate(zip(g, w, strict=True)))
            stack += [(f"{where}[{k}]", a, b) for k, (a, b) in reversed(pairs)]
            continue
        if not isinstance(g, np.ndarray):
            return f"{where}: {type(g).__name__} where the reference has an array"
        diff = _array_difference(g, np.asarray(w), loosest)
        if diff is not None:
            return f"{where}: {diff}\n  product:   {_show(g)}\n  reference: {_show(np.asarray(w))}"
    return None


_DISCRETE_UNARY = frozenset({UnaryOp.FLOOR, UnaryOp.CEIL, UnaryOp.ROUND, UnaryOp.SIGN})
_SELECTIONS = frozenset({"nonzero", "topk", "nms", "unique"})


def _discrete(graph: Graph, v: Value) -> bool:
    """Whether `v` is a discrete function of float operands (a comparison, a float mod,
    argmin/argmax, floor/ceil/round/sign, a float -> int or bool cast, a data-dependent
    selection): round-off in its operands may flip it whole."""
    match graph[v].op:
        case Unary(x, UnaryOp.CAST):
            return graph[x].dtype.is_float and not graph[v].dtype.is_float
        case Unary(x, op):
            return graph[x].dtype.is_float and op in _DISCRETE_UNARY
        case Binary(a, _, op):
            return graph[a].dtype.is_float and (
                op.is_comparison or op in (BinaryOp.MOD, BinaryOp.FMOD)
            )
        case Reduce(x, _, op):
            return graph[x].dtype.is_float and op.is_arg
        case Dynamic(kind=kind):
            return kind in _SELECTIONS
    return False


def _recomputed(graph: Graph, v: Value, operands: Mapping[int, np.ndarray]) -> np.ndarray | None:
    """`v`'s op applied by the reference to the arrays `operands` (by value index), or None for
    the ops that are not rebuilt alone (views, inputs, constants, data-dependent ops)."""
    info = graph[v]
    if isinstance(info.op, Input | Constant | View | Broadcast | Slice | Iota | Dynamic):
        return None
    g, feed, new = Graph(), {}, {}
    for x in dict.fromkeys(info.op.inputs):
        a = operands[x.index]
        new[x.index] = g.input(list(a.shape), graph[x].dtype, f"x{x.index}")
        feed[f"x{x.index}"] = a
    g.add_output(copy_op(g, info, info.op.map_inputs(lambda x: new[x.index])))
    return np.asarray(Device.cpu(reference=True).prepare(g).eval(feed)[0])


def localize(graph: Graph, feed: Mapping[str, np.ndarray], threads: int = 1) -> tuple[str, bool]:
    """Make every value of `graph` an output (it is changed), evaluate it on both executors and
    find the first value, in index order, that differs (within `graph_tolerance`): (what
    differs there, whether it is round-off). Round-off: the value's operands agree and the
    reference computes the product's value from the product's operands, or (for a discrete
    op) could flip on such differences. A difference that vanishes with every value an output
    was made inside a fused step (which may keep f16 intermediates in f32, or contract a*b + c):
    round-off when the graph has a discrete op it may have flipped."""
    loosest = graph_tolerance(graph)
    originals = list(graph.outputs)
    for v in graph.values():
        if v not in graph.outputs:
            graph.add_output(v)
    want = Device.cpu(reference=True).prepare(graph).eval(dict(feed))
    got = Device.cpu(threads).prepare(graph).eval(dict(feed))
    pairs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for v, a, b in zip(graph.outputs, got, want, strict=True):
        pairs.setdefault(v.index, (np.asarray(a), np.asarray(b)))
    for index in sorted(pairs):
        diff = _array_difference(*pairs[index], loosest)
        if diff is None:
            continue
        v = graph.value(index)
        what = f"first differing value {graph.format_value(v)}: {diff}"
        operands = [x for x in graph[v].op.inputs if x.index in pairs]
        if any(_array_difference(*pairs[x.index], loosest) is not None for x in operands):
            return what + " (an operand differs too)", False  # not reached in index order
        if _discrete(graph, v):
            return what + "; its operands agree: a discrete op flipped on round-off", True
        again = _recomputed(graph, v, {x.index: pairs[x.index][0] for x in operands})
        if again is not None and _array_difference(pairs[index][0], again, loosest) is None:
            return what + "; its operands agree and give the product's value: round-off", True
        return what + "; its operands agree: the product computes it differently", False
    what = "no value differs with every value an output: the difference is in a fused step"
    discrete = [v for v in _ancestors(graph, originals) if _discrete(graph, v)]
    if discrete:  # e.g. an argmax over f16 sums a fused step keeps in f32 (the reference rounds)
        what += f", before {graph.format_value(discrete[0])}, which round-off may flip"
    return what, bool(discrete)


def _ancestors(graph: Graph, outputs: list[Value]) -> list[Value]:
    """The values `outputs` depend on (themselves included), in index order."""
    needed = {v.index for v in outputs}
    for index in range(len(graph) - 1, -1, -1):  # operands come before their users
        if index in needed:
            needed.update(x.index for x in graph[graph.value(index)].op.inputs)
    return [graph.value(i) for i in sorted(needed)]


def _edge_pool(dt: np.dtype) -> np.ndarray | None:
    if dt.kind == "f":
        return np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        vals = {int(info.min), 0, 1, int(info.max)} | ({-1} if dt.kind == "i" else set())
        return np.array(sorted(vals), dt)
    return None


def with_edge_values(a: np.ndarray, rng: np.random.Generator, fraction: float) -> np.ndarray:
    """A copy of `a` with about `fraction` of its elements replaced by edge values of its dtype:
    INT_MIN, -1, 0, 1 and the maximum for integers; NaN, ±Inf and ±0 for floats (bools as
    they are)."""
    pool = _edge_pool(a.dtype)
    if pool is None or a.size == 0:
        return a
    out = np.array(a, copy=True)
    mask = rng.random(out.shape) < fraction
    out[mask] = pool[rng.integers(len(pool), size=int(mask.sum()))]
    return out
