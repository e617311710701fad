"""Layernorm detection: the exporters' mean/sub/pow/mean/add-eps/sqrt/div arithmetic (and its
variants) becomes one Layernorm, the affine Mul/Add after it staying separate."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from kn_graph import DType, Graph, ReduceOp, Shape, Size
from kn_graph.ops import UnaryOp, Value
from kn_graph.optimizer import optimize
from tests.kn_graph.optimizer.util import assert_same, only, op_counts

B = Size.sym("B")
S = Size.sym("seq")
LN = only("fold_constants", "detect_layernorm")


def _mean(g: Graph, x: Value, axes: Sequence[int]) -> Value:
    """ONNX ReduceMean(keepdims=1) as the loader lowers it: Reduce MEAN + a keepdims View."""
    return g.reduce(x, list(axes), ReduceOp.MEAN, keepdims=True)


def layernorm_arith(
    g: Graph, x: Value, style: str = "div", axes: Sequence[int] = (-1,), eps: float = 1e-5
) -> Value:
    """(x - mean) / sqrt(var + eps) spelled the ways exporters spell it."""
    d = g.sub(x, _mean(g, x, axes))
    sq = g.mul(d, d) if style == "mul_dd" else g.pow(d, 2.0)
    e = g.add(_mean(g, sq, axes), eps) if style != "eps_first" else g.add(eps, _mean(g, sq, axes))
    match style:
        case "div" | "mul_dd" | "eps_first":
            return g.div(d, g.sqrt(e))
        case "reciprocal":
            return g.mul(d, g.unary(UnaryOp.RECIPROCAL, g.sqrt(e)))
        case "one_over":
            return g.mul(g.div(1.0, g.sqrt(e)), d)
        case "rsqrt_pow":
            return g.mul(d, g.pow(e, -0.5))
    raise AssertionError(style)


def _bert_layernorm() -> Graph:
    """What TorchScript exports for nn.LayerNorm at opset < 17, with its affine part."""
    g = Graph()
    x = g.input(Shape.of(B, S, 8), DType.F32, "x")
    y = layernorm_arith(g, x)
    y = g.mul(y, g.constant(np.linspace(0.5, 2, 8, dtype=np.float32)))
    g.add_output(g.add(y, g.constant(np.linspace(-1, 1, 8, dtype=np.float32))), "y")
    return g


def test_torchscript_layernorm_becomes_one_op_and_keeps_its_affine() -> None:
    g = _bert_layernorm()
    o = optimize(g, LN)
    assert str(o) == "\n".join(
        [
            '%0: f32[B,seq,8] = input #0 "x"',
            "%1: f32[B,seq,8] = layernorm(%0) axis=2 eps=1e-05",
            "%2: f32[1,1,8] = const <8 values>",
            "%3: f32[B,seq,8] = broadcast(%2)",
            "%4: f32[B,seq,8] = mul(%1, %3)",
            "%5: f32[1,1,8] = const <8 values>",
            "%6: f32[B,seq,8] = broadcast(%5)",
            "%7: f32[B,seq,8] = add(%4, %6)",
            'outputs: %7 "y"',
        ]
    )
    assert_same(g, o, {"B": 2, "seq": 5})


@pytest.mark.parametrize(
    "style", ["div", "mul_dd", "eps_first", "reciprocal", "one_over", "rsqrt_pow"]
)
def test_exporter_variants_are_detected(style: str) -> None:
    g = Graph()
    x = g.input(Shape.of(B, 6), DType.F32, "x")
    g.add_output(layernorm_arith(g, x, style, eps=1e-3), "y")
    o = optimize(g, LN)
    assert sorted(op_counts(o).elements()) == ["input", "layernorm"]
    (eps,) = [o[v].op.eps for v in o.values() if o[v].op.NAME == "layernorm"]  # type: ignore[attr-defined]
    assert eps == pytest.approx(1e-3)
    assert_same(g, o, {"B": 4}, rel=1e-5)


def test_consecutive_axes_are_merged_by_a_view() -> None:
    """A normalisation over the last two axes (as for a group norm by reshape)."""
    g = Graph()
    x = g.input(Shape.of(B, 4, 3, 5), DType.F32, "x")
    g.add_output(layernorm_arith(g, x, axes=(2, 3)), "y")
    o = optimize(g, LN)
    assert str(o) == "\n".join(
        [
            '%0: f32[B,4,3,5] = input #0 "x"',
            "%1: f32[B,4,15] = view(%0)",
            "%2: f32[B,4,15] = layernorm(%1) axis=2 eps=1e-05",
            "%3: f32[B,4,3,5] = view(%2)",
            'outputs: %3 "y"',
        ]
    )
    assert_same(g, o, {"B": 2})


def test_a_single_middle_axis_is_normalised_in_place() -> None:
    g = Graph()
    x = g.input(Shape.of(B, 6, 3), DType.F64, "x")
    g.add_output(layernorm_arith(g, x, axes=(1,)), "y")
    o = optimize(g, LN)
    assert op_counts(o)["layernorm"] == 1 and op_counts(o)["view"] == 0
    assert_same(g, o, {"B": 2}, rel=1e-12)


def test_not_detected_when_the_centred_value_has_another_user() -> None:
    """x - mean is also an output: a Layernorm would have to compute it again."""
    g = Graph()
    x = g.input(Shape.of(B, 6), DType.F32, "x")
    y = layernorm_arith(g, x)
    centred = g.sub(x, _mean(g, x, [-1]))  # hash-consing: the very value inside the pattern
    g.add_output(y, "y")
    g.add_output(centred, "centred")
    o = optimize(g, LN)
    assert op_counts(o)["layernorm"] == 0
    assert_same(g, o, {"B": 3})


def test_not_detected_with_a_non_constant_eps() -> None:
    g = Graph()
    x = g.input(Shape.of(B, 6), DType.F32, "x")
    eps = g.input(Shape.of(B, 1), DType.F32, "eps")
    d = g.sub(x, _mean(g, x, [-1]))
    var = _mean(g, g.pow(d, 2.0), [-1])
    g.add_output(g.div(d, g.sqrt(g.add(var, eps))), "y")
    assert op_counts(optimize(g, LN))["layernorm"] == 0


def test_not_detected_when_the_statistics_use_different_axes() -> None:
    g = Graph()
    x = g.input(Shape.of(B, 4, 6), DType.F32, "x")
    d = g.sub(x, _mean(g, x, [-1]))
    var = _mean(g, g.pow(d, 2.0), [1, 2])
    g.add_output(g.div(d, g.sqrt(g.add(var, 1e-5))), "y")
    assert op_counts(optimize(g, LN))["layernorm"] == 0


def test_rms_norm_is_not_a_layernorm() -> None:
    """LLaMA's x·rsqrt(mean(x²) + eps) has no centring: it must stay as it is."""
    g = Graph()
    x = g.input(Shape.of(B, 6), DType.F32, "x")
    var = _mean(g, g.pow(x, 2.0), [-1])
    g.add_output(g.mul(x, g.unary(UnaryOp.RECIPROCAL, g.sqrt(g.add(var, 1e-6)))), "y")
    o = optimize(g, LN)
    assert op_counts(o)["layernorm"] == 0
    assert_same(g, o, {"B": 2})


def test_detection_is_off_with_its_flag() -> None:
    assert op_counts(optimize(_bert_layernorm(), only("fold_constants")))["layernorm"] == 0
