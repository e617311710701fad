"""Helpers for the optimizer tests: isolate one rewrite family, count ops, and check that an
optimized graph computes what the original computes on the CPU executor (the reference)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

from kn_graph import Graph
from kn_graph.ops import Binary, Reduce, Unary
from kn_graph.optimizer import OptimizerSettings
from kn_graph.reference import evaluate

REWRITE_FLAGS = (
    "fold_constants",
    "fuse_affine",
    "fuse_clamp",
    "max_through_pool",
    "div_to_mul",
    "detect_layernorm",
    "detect_gelu_silu",
    "detect_attention",
)


def only(*flags: str) -> OptimizerSettings:
    """Settings with every rewrite family off except `flags` (golden printouts then show exactly
    what one family does)."""
    unknown = set(flags) - set(REWRITE_FLAGS)
    assert not unknown, unknown
    return dataclasses.replace(OptimizerSettings(), **{f: f in flags for f in REWRITE_FLAGS})


def op_counts(g: Graph) -> Counter[str]:
    """Ops by kind; Unary/Binary/Reduce by their sub-op ("mul", "erf", "reduce_mean")."""
    out: Counter[str] = Counter()
    for v in g.values():
        op = g[v].op
        match op:
            case Unary(_, u):
                out[u.value] += 1
            case Binary(_, _, b):
                out[b.value] += 1
            case Reduce(_, _, r):
                out[f"reduce_{r.value}"] += 1
            case _:
                out[op.NAME] += 1
    return out


def random_inputs(g: Graph, bindings: dict[str, int], seed: int = 0) -> list[np.ndarray]:
    """Standard-normal floats (ints in [0, 5)) for every input of `g`."""
    rng = np.random.default_rng(seed)
    out = []
    for v in g.inputs:
        shape = g[v].shape.eval(bindings)
        dt = g[v].dtype.np
        if np.issubdtype(dt, np.floating):
            out.append(rng.standard_normal(shape).astype(dt))
        else:
            out.append(rng.integers(0, 5, shape).astype(dt))
    return out


def assert_same(
    original: Graph,
    optimized: Graph,
    bindings: dict[str, int] | None = None,
    rel: float = 1e-5,
    inputs: list[np.ndarray] | None = None,
) -> None:
    """Both graphs give the same outputs (to `rel` of each output's largest magnitude), NaNs in
    the same places."""
    feed = inputs if inputs is not None else random_inputs(original, bindings or {})
    want = evaluate(original, feed)
    got = evaluate(optimized, feed)
    assert len(want) == len(got)
    for w, o in zip(want, got, strict=True):
        assert w.shape == o.shape and w.dtype == o.dtype, (w.shape, o.shape, w.dtype, o.dtype)
        assert np.array_equal(np.isnan(w), np.isnan(o))
        finite = np.isfinite(w)
        assert np.array_equal(w[~finite & ~np.isnan(w)], o[~finite & ~np.isnan(o)])
        scale = float(np.max(np.abs(w[finite]), initial=0.0)) or 1.0
        err = float(np.max(np.abs(w[finite].astype(np.float64) - o[finite]), initial=0.0))
        assert err <= rel * scale, f"max abs diff {err:.3g} vs scale {scale:.3g}"
