"""GELU (erf and tanh forms) and SiLU detection: the exporters' arithmetic becomes one Unary."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kn_graph import DType, Graph, Shape, Size
from kn_graph.ops import UnaryOp, Value
from kn_graph.optimizer import optimize
from tests.kn_graph.optimizer.util import assert_same, only, op_counts

B = Size.sym("B")
ACT = only("fold_constants", "detect_gelu_silu")
SQRT2 = 1.4142135381698608  # what TorchScript writes for √2 in f32


def gelu_erf(g: Graph, x: Value, order: str) -> Value:
    """0.5·x·(1 + erf(x/√2)) in the orders exporters use."""
    match order:
        case "torchscript":  # ((x · (erf(x/√2) + 1)) · 0.5)
            return g.mul(g.mul(x, g.add(g.unary(UnaryOp.ERF, g.div(x, SQRT2)), 1.0)), 0.5)
        case "half_first":  # (x · 0.5) · (1 + erf(x · 1/√2))
            return g.mul(
                g.mul(x, 0.5), g.add(1.0, g.unary(UnaryOp.ERF, g.mul(x, 0.7071067690849304)))
            )
        case "half_left":  # 0.5 · (x · (1 + erf(x/√2)))
            return g.mul(0.5, g.mul(g.add(1.0, g.unary(UnaryOp.ERF, g.div(x, SQRT2))), x))
        case "half_inner":  # x · ((1 + erf(x/√2)) · 0.5)
            return g.mul(x, g.mul(g.add(g.unary(UnaryOp.ERF, g.div(x, SQRT2)), 1.0), 0.5))
    raise AssertionError(order)


def gelu_tanh(g: Graph, x: Value, cube: str) -> Value:
    """HF "gelu_new": 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))."""
    x3 = g.pow(x, 3.0) if cube == "pow" else g.mul(x, g.mul(x, x))
    inner = g.mul(math.sqrt(2 / math.pi), g.add(x, g.mul(0.044715, x3)))
    return g.mul(g.mul(0.5, x), g.add(1.0, g.unary(UnaryOp.TANH, inner)))


def _graph(dtype: DType = DType.F32) -> tuple[Graph, Value]:
    g = Graph()
    return g, g.input(Shape.of(B, 8), dtype, "x")


def test_torchscript_erf_gelu_golden() -> None:
    g, x = _graph()
    g.add_output(gelu_erf(g, x, "torchscript"), "y")
    o = optimize(g, ACT)
    assert str(o) == "\n".join(
        [
            '%0: f32[B,8] = input #0 "x"',
            "%1: f32[B,8] = gelu(%0)",
            'outputs: %1 "y"',
        ]
    )
    assert_same(g, o, {"B": 3})


@pytest.mark.parametrize("order", ["torchscript", "half_first", "half_left", "half_inner"])
@pytest.mark.parametrize("dtype", [DType.F32, DType.F16])
def test_erf_gelu_orders_are_detected(order: str, dtype: DType) -> None:
    g, x = _graph(dtype)
    g.add_output(gelu_erf(g, x, order), "y")
    o = optimize(g, ACT)
    assert sorted(op_counts(o).elements()) == ["gelu", "input"]
    assert_same(g, o, {"B": 5}, rel=2e-3 if dtype is DType.F16 else 1e-6)


def test_tanh_gelu_golden() -> None:
    g, x = _graph()
    g.add_output(gelu_tanh(g, x, "pow"), "y")
    o = optimize(g, ACT)
    assert str(o) == "\n".join(
        [
            '%0: f32[B,8] = input #0 "x"',
            "%1: f32[B,8] = gelu_tanh(%0)",
            'outputs: %1 "y"',
        ]
    )
    assert_same(g, o, {"B": 3})


def test_tanh_gelu_with_cube_as_products() -> None:
    g, x = _graph()
    g.add_output(gelu_tanh(g, x, "mul"), "y")
    o = optimize(g, ACT)
    assert sorted(op_counts(o).elements()) == ["gelu_tanh", "input"]
    assert_same(g, o, {"B": 3})


@pytest.mark.parametrize("sigmoid_first", [False, True])
def test_silu_golden(sigmoid_first: bool) -> None:
    g, x = _graph()
    s = g.unary(UnaryOp.SIGMOID, x)
    g.add_output(g.mul(s, x) if sigmoid_first else g.mul(x, s), "y")
    o = optimize(g, ACT)
    assert str(o) == "\n".join(
        [
            '%0: f32[B,8] = input #0 "x"',
            "%1: f32[B,8] = silu(%0)",
            'outputs: %1 "y"',
        ]
    )
    assert_same(g, o, {"B": 3})


def test_shared_sigmoid_is_not_duplicated() -> None:
    """x·sigmoid(x) and sigmoid(x)·x share the sigmoid (hash-consing): fusing would compute it twice."""
    g, x = _graph()
    g.add_output(g.mul(x, g.unary(UnaryOp.SIGMOID, x)), "a")
    g.add_output(g.mul(g.unary(UnaryOp.SIGMOID, x), x), "b")
    assert op_counts(optimize(g, ACT))["silu"] == 0


def test_gelu_of_a_computed_value_keeps_its_other_users() -> None:
    """x = h + 1 feeds the gelu twice and is an output too: x stays, the gelu replaces the rest."""
    g = Graph()
    h = g.input(Shape.of(B, 8), DType.F32, "h")
    x = g.add(h, 1.0)
    g.add_output(gelu_erf(g, x, "torchscript"), "y")
    g.add_output(x, "x")
    o = optimize(g, ACT)
    assert op_counts(o)["gelu"] == 1 and op_counts(o)["erf"] == 0 and op_counts(o)["add"] == 1
    assert_same(g, o, {"B": 2})


def test_not_detected_when_erf_has_another_user() -> None:
    g, x = _graph()
    g.add_output(gelu_erf(g, x, "torchscript"), "y")
    g.add_output(g.unary(UnaryOp.ERF, g.div(x, SQRT2)), "erf")
    o = optimize(g, ACT)
    assert op_counts(o)["gelu"] == 0
    assert_same(g, o, {"B": 2})


@pytest.mark.parametrize("wrong", ["half", "sqrt2", "other_x"])
def test_not_detected_with_other_constants_or_values(wrong: str) -> None:
    g, x = _graph()
    z = g.input(Shape.of(B, 8), DType.F32, "z")
    half = 0.6 if wrong == "half" else 0.5
    root = 1.5 if wrong == "sqrt2" else SQRT2
    inner = z if wrong == "other_x" else x
    y = g.mul(g.mul(x, g.add(g.unary(UnaryOp.ERF, g.div(inner, root)), 1.0)), half)
    g.add_output(y, "y")
    o = optimize(g, ACT)
    assert op_counts(o)["gelu"] == 0
    assert_same(g, o, {"B": 2})


def test_sigmoid_of_another_value_is_not_silu() -> None:
    """CLIP's quick_gelu x·sigmoid(1.702·x) is not x·sigmoid(x)."""
    g, x = _graph()
    g.add_output(g.mul(x, g.unary(UnaryOp.SIGMOID, g.mul(x, 1.702))), "y")
    assert op_counts(optimize(g, ACT))["silu"] == 0


def test_silu_not_detected_when_sigmoid_has_another_user() -> None:
    g, x = _graph()
    s = g.unary(UnaryOp.SIGMOID, x)
    g.add_output(g.mul(x, s), "y")
    g.add_output(s, "s")
    assert op_counts(optimize(g, ACT))["silu"] == 0


def test_values_over_a_wide_range() -> None:
    """Large magnitudes, infinities and NaN go through the fused ops as through the arithmetic."""
    g, x = _graph()
    g.add_output(gelu_erf(g, x, "torchscript"), "gelu")
    g.add_output(g.mul(x, g.unary(UnaryOp.SIGMOID, x)), "silu")
    o = optimize(g, ACT)
    xs = np.array(
        [[-1e4, -30, -3, -0.5, 0, 0.5, 3, 30], [1e4, np.nan, 1e-8, -1e-8, 7, -7, 2, -2]], np.float32
    )
    assert_same(g, o, inputs=[xs], rel=1e-6)
