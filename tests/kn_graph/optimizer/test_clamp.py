"""Clamp fusion: chains of Min/Max with scalar constants become at most one Min and one Max."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph import DType, Graph, Shape, Size
from kn_graph.ops import Value
from kn_graph.optimizer import optimize
from kn_graph.reference import evaluate
from tests.kn_graph.optimizer.util import assert_same, only, op_counts

B = Size.sym("B")
CLAMP = only("fold_constants", "fuse_clamp")


def _graph(dtype: DType = DType.F32) -> tuple[Graph, Value]:
    g = Graph()
    return g, g.input(Shape.of(B, 8), dtype, "x")


def test_relu_then_clip_becomes_one_min_and_one_max() -> None:
    """relu, then ONNX Clip(0, 6) = max(min(·, 6), 0): three ops, two needed."""
    g, x = _graph()
    g.add_output(g.clamp(g.relu(x), 0.0, 6.0), "y")
    o = optimize(g, CLAMP)
    assert str(o) == "\n".join(
        [
            '%0: f32[B,8] = input #0 "x"',
            "%1: f32[1,1] = const [0.0]",
            "%2: f32[1,1] = const [6.0]",
            "%3: f32[B,8] = broadcast(%2)",
            "%4: f32[B,8] = min(%0, %3)",
            "%5: f32[B,8] = broadcast(%1)",
            "%6: f32[B,8] = max(%4, %5)",
            'outputs: %6 "y"',
        ]
    )
    assert_same(g, o, {"B": 3})


def test_two_mins_merge_into_the_tighter_one() -> None:
    """min(min(max(x, -1), 4), 3) = max(min(x, 3), -1)."""
    g, x = _graph()
    g.add_output(g.minimum(g.minimum(g.maximum(x, -1.0), 4.0), 3.0), "y")
    o = optimize(g, CLAMP)
    assert str(o) == "\n".join(
        [
            '%0: f32[B,8] = input #0 "x"',
            "%1: f32[1,1] = const [-1.0]",
            "%2: f32[1,1] = const [3.0]",
            "%3: f32[B,8] = broadcast(%2)",
            "%4: f32[B,8] = min(%0, %3)",
            "%5: f32[B,8] = broadcast(%1)",
            "%6: f32[B,8] = max(%4, %5)",
            'outputs: %6 "y"',
        ]
    )


def test_contradictory_bounds_give_the_constant_of_the_last_max() -> None:
    """max(min(x, -2), 5) is 5 everywhere; the two-op form keeps that (and the NaNs)."""
    g, x = _graph()
    g.add_output(g.maximum(g.maximum(g.minimum(x, -2.0), 5.0), 1.0), "y")
    o = optimize(g, CLAMP)
    assert op_counts(o)["min"] == 1 and op_counts(o)["max"] == 1
    xs = np.array([[-np.inf, -3, 0, 4, 7, np.inf, np.nan, 1]] * 2, np.float32)
    assert_same(g, o, inputs=[xs])
    np.testing.assert_array_equal(evaluate(o, [xs])[0][0, :6], 5.0)


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.I32, DType.I64])
def test_long_random_chains_match_the_original(dtype: DType) -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        g, x = _graph(dtype)
        y = x
        n = int(rng.integers(2, 7))
        for _ in range(n):
            c = int(rng.integers(-4, 5))
            y = g.minimum(y, c) if rng.random() < 0.5 else g.maximum(y, c)
        g.add_output(y, "y")
        o = optimize(g, CLAMP)
        counts = op_counts(o)
        assert counts["min"] <= 1 and counts["max"] <= 1
        xs = (rng.standard_normal((3, 8)) * 4).astype(dtype.np)
        if dtype.is_float:
            xs[0, :3] = [np.nan, np.inf, -np.inf]
        assert_same(g, o, inputs=[xs])


def test_chain_stops_at_a_value_with_another_user() -> None:
    """relu(x) is also an output: it is kept, and the two ops above it are already minimal."""
    g, x = _graph()
    r = g.relu(x)
    g.add_output(g.maximum(g.minimum(r, 6.0), 0.0), "y")
    g.add_output(r, "relu")
    o = optimize(g, CLAMP)
    assert op_counts(o)["max"] == 2 and op_counts(o)["min"] == 1
    assert_same(g, o, {"B": 2})


def test_non_scalar_bounds_are_not_fused() -> None:
    g, x = _graph()
    lo = g.constant(np.linspace(-1, 0, 8, dtype=np.float32))
    g.add_output(g.maximum(g.minimum(g.maximum(x, lo), 6.0), 0.0), "y")
    o = optimize(g, CLAMP)
    assert op_counts(o)["max"] == 2 and op_counts(o)["min"] == 1


def test_non_constant_bounds_are_not_fused() -> None:
    g, x = _graph()
    z = g.input(Shape.of(B, 8), DType.F32, "z")
    g.add_output(g.maximum(g.maximum(g.minimum(x, z), 0.0), 1.0), "y")
    o = optimize(g, CLAMP)
    assert op_counts(o)["max"] == 1 and op_counts(o)["min"] == 1  # the two maxes do merge
    assert_same(g, o, {"B": 2})


def test_chain_under_a_non_scalar_bound_still_merges() -> None:
    """min(min(x, 3), 4) feeds a max with a per-element bound (not a link): the two mins are
    the whole chain and still become one."""
    g, x = _graph()
    lo = g.constant(np.linspace(-1, 0, 8, dtype=np.float32))
    g.add_output(g.maximum(g.minimum(g.minimum(x, 3.0), 4.0), lo), "y")
    o = optimize(g, CLAMP)
    assert op_counts(o)["min"] == 1 and op_counts(o)["max"] == 1
    assert_same(g, o, {"B": 2})
