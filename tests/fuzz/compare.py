"""The fuzzer's oracle check: the outputs of the product (`Device.cpu()`, the plan run as C and
oneDNN) against the reference executor's (`Device.cpu(reference=True)`), and the edge values
(INT_MIN, -1, 0, max; NaN, ±Inf, ±0) mixed into some cases' inputs.

`difference(got, want)` is None when they agree, else a short description of the first output
that does not: same count, shapes and dtypes; integers and bools exactly; floats within the
tolerance of the parity tests (`tests.cuda_eval.helpers.TOL`, relative to max(1, max |ref|)),
NaN exactly where the reference has NaN and infinities equal.

`localize(graph, feed)` finds the first value of a disagreeing graph that differs, and whether
that is round-off (within tolerance in its operands) that a discrete op (a comparison, argmax,
floor, a float -> int cast, TopK ...) or a cast to a wider float made visible: the two executors
may round differently, so an argmax of near-ties or an f32 value cast to f64 may differ."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kn_graph.graph import Graph
from kn_graph.ops import Binary, BinaryOp, Dynamic, Reduce, Unary, UnaryOp, Value
from kn_runtime import Device
from tests.cuda_eval.helpers import TOL

__all__ = ["difference", "localize", "with_edge_values"]


def _show(a: np.ndarray) -> str:
    """The first and last few elements (flattened: the shape is said beside it)."""
    return np.array2string(a.reshape(-1), threshold=8, edgeitems=3, precision=6)


def _first(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape))


def _array_difference(got: np.ndarray, want: np.ndarray) -> str | None:
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
    tol = TOL["f"][want.dtype.itemsize]
    worst = float(np.max(err)) / scale
    if worst <= tol:
        return None
    at = _first(err > tol * scale)
    return (
        f"max |d| / max(1, max |ref|) = {worst:.3g} > {tol:g} ({want.dtype}); first at {at}: "
        f"{got[at]!r} vs reference {want[at]!r}"
    )


def difference(got: Any, want: Any) -> str | None:
    """None when the product's outputs `got` agree with the reference's `want` (lists of arrays;
    a sequence output is itself a list), else what differs, with both values."""
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
        diff = _array_difference(g, np.asarray(w))
        if diff is not None:
            return f"{where}: {diff}\n  product:   {_show(g)}\n  reference: {_show(np.asarray(w))}"
    return None


_DISCRETE_UNARY = frozenset({UnaryOp.FLOOR, UnaryOp.CEIL, UnaryOp.ROUND, UnaryOp.SIGN})
_SELECTIONS = frozenset({"nonzero", "topk", "nms", "unique"})


def _amplifies_round_off(graph: Graph, v: Value, widening: bool = True) -> bool:
    """Whether `v` is a discrete function of float operands (a comparison, a float mod,
    argmin/argmax, floor/ceil/round/sign, a float -> int or bool cast, a data-dependent
    selection) or (`widening`) a cast to a wider float: round-off in its operands may show in
    it whole (or beyond its own dtype's tolerance)."""
    match graph[v].op:
        case Unary(x, UnaryOp.CAST):
            src, dst = graph[x].dtype, graph[v].dtype
            return src.is_float and (not dst.is_float or (widening and dst.size > src.size))
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


def localize(graph: Graph, feed: Mapping[str, np.ndarray], threads: int = 1) -> tuple[str, bool]:
    """Make every value of `graph` an output (it is changed), evaluate it on both executors and
    find the first value, in index order, that differs: (what differs there, whether it is
    round-off: its operands agree and its op is one of `_amplifies_round_off`). A difference
    that vanishes with every value an output was made inside a fused step (which may keep f16
    intermediates in f32, or contract a*b + c): round-off too when the graph has such an op."""
    for v in graph.values():
        if v not in graph.outputs:
            graph.add_output(v)
    want = Device.cpu(reference=True).prepare(graph).eval(dict(feed))
    got = Device.cpu(threads).prepare(graph).eval(dict(feed))
    pairs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for v, a, b in zip(graph.outputs, got, want, strict=True):
        pairs.setdefault(v.index, (np.asarray(a), np.asarray(b)))
    for index in sorted(pairs):
        diff = _array_difference(*pairs[index])
        if diff is None:
            continue
        v = graph.value(index)
        agree = all(
            _array_difference(*pairs[x.index]) is None
            for x in graph[v].op.inputs
            if x.index in pairs
        )
        what = f"first differing value {graph.format_value(v)}: {diff}"
        return what, agree and _amplifies_round_off(graph, v)
    what = "no value differs with every value an output: the difference is in a fused step"
    discrete = [v for v in graph.values() if _amplifies_round_off(graph, v, widening=False)]
    if discrete:  # e.g. an argmax over f16 sums a fused step keeps in f32 (the reference rounds)
        what += f", before {graph.format_value(discrete[0])}, which round-off may flip"
    return what, bool(discrete)


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
