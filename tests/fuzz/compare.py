"""The fuzzer's oracle check: the outputs of the product (`Device.cpu()`, the plan run as C and
oneDNN) against the reference executor's (`Device.cpu(reference=True)`), and the edge values
(INT_MIN, -1, 0, max; NaN, ±Inf, ±0) mixed into some cases' inputs.

`difference(got, want)` is None when they agree, else a short description of the first output
that does not: same count, shapes and dtypes; integers and bools exactly; floats within the
tolerance of the parity tests (`tests.cuda_eval.helpers.TOL`, relative to max(1, max |ref|)),
NaN exactly where the reference has NaN and infinities equal."""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.cuda_eval.helpers import TOL

__all__ = ["difference", "with_edge_values"]


def _show(a: np.ndarray) -> str:
    return np.array2string(a, threshold=8, edgeitems=3, precision=6)


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
