"""Affine fusion (chains of Add/Sub/Mul/Div by constants, folded into convolutions when exact)
and div→mul: golden printouts, numerical equality with the unoptimized graph, and the cases
where they must not fire."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph import DType, Graph, Shape, Size
from kn_graph.ops import UnaryOp, Value
from kn_graph.optimizer import optimize
from tests.kn_graph.optimizer.util import assert_same, only, op_counts

B = Size.sym("B")
AFFINE = only("fold_constants", "fuse_affine")
DIV = only("fold_constants", "div_to_mul")


def _channel(g: Graph, values: list[float]) -> Value:
    """A per-channel constant [C, 1, 1], as ONNX exporters write conv biases and BN stats."""
    return g.view(g.constant(np.asarray(values, np.float32)), [len(values), 1, 1])


def _lines(*lines: str) -> str:
    return "\n".join(lines)


def _filter(g: Graph, k: int, c: int, seed: int = 0) -> Value:
    return g.constant(np.random.default_rng(seed).standard_normal((k, c, 3, 3)).astype(np.float32))


# -- chains without a convolution ------------------------------------------------------------------
def _scalar_chain() -> Graph:
    g = Graph()
    x = g.input(Shape.of(B, 4), DType.F32, "x")
    g.add_output(g.div(g.sub(g.mul(g.add(x, 1.0), 2.0), 3.0), 4.0), "y")
    return g


def test_scalar_chain_collapses_to_one_mul_and_one_add() -> None:
    """((x + 1)·2 - 3)/4 = x·0.5 - 0.25."""
    assert str(optimize(_scalar_chain(), AFFINE)) == _lines(
        '%0: f32[B,4] = input #0 "x"',
        "%1: f32[1,1] = const [0.5]",
        "%2: f32[B,4] = broadcast(%1)",
        "%3: f32[B,4] = mul(%0, %2)",
        "%4: f32[1,1] = const [-0.25]",
        "%5: f32[B,4] = broadcast(%4)",
        "%6: f32[B,4] = add(%3, %5)",
        'outputs: %6 "y"',
    )


def test_per_channel_chain_keeps_compact_constants() -> None:
    """(x + [1,2,3])·2 + 0.5: an all-equal scale prints as one element, the bias stays [1,3]."""
    g = Graph()
    x = g.input(Shape.of(B, 3), DType.F32, "x")
    y = g.mul(
        g.add(x, g.constant(np.array([1, 2, 3], np.float32))), g.constant(np.full(3, 2, np.float32))
    )
    g.add_output(g.add(y, 0.5), "y")
    o = optimize(g, AFFINE)
    assert str(o) == _lines(
        '%0: f32[B,3] = input #0 "x"',
        "%1: f32[1,1] = const [2.0]",
        "%2: f32[B,3] = broadcast(%1)",
        "%3: f32[B,3] = mul(%0, %2)",
        "%4: f32[1,3] = const [2.5,4.5,6.5]",
        "%5: f32[B,3] = broadcast(%4)",
        "%6: f32[B,3] = add(%3, %5)",
        'outputs: %6 "y"',
    )
    assert_same(g, o, {"B": 3})


def test_constant_minus_x_chain() -> None:
    """(1 - x)·3 + 2 = x·(-3) + 5."""
    g = Graph()
    x = g.input(Shape.of(5), DType.F32, "x")
    g.add_output(g.add(g.mul(g.sub(1.0, x), 3.0), 2.0), "y")
    o = optimize(g, AFFINE)
    assert op_counts(o)["mul"] == 1 and op_counts(o)["add"] == 1 and op_counts(o)["sub"] == 0
    assert_same(g, o)


def test_canonical_mul_then_add_is_left_alone() -> None:
    g = Graph()
    x = g.input(Shape.of(B, 4), DType.F32, "x")
    g.add_output(g.add(g.mul(x, 2.0), 1.0), "y")
    assert str(optimize(g, AFFINE)) == str(optimize(g, only("fold_constants")))


def test_chain_stops_at_a_value_with_another_user() -> None:
    """x + 1 is also an output: (x + 1)·2 - 3 keeps x + 1 and collapses only ·2 - 3 (which is
    already one mul and one add, so nothing changes)."""
    g = Graph()
    x = g.input(Shape.of(4), DType.F32, "x")
    t = g.add(x, 1.0)
    g.add_output(g.sub(g.mul(t, 2.0), 3.0), "y")
    g.add_output(t, "t")
    o = optimize(g, AFFINE)
    assert op_counts(o)["add"] == 1 and op_counts(o)["mul"] == 1 and op_counts(o)["sub"] == 1
    assert_same(g, o)


def test_chain_does_not_cross_a_non_constant_operand() -> None:
    g = Graph()
    x = g.input(Shape.of(4), DType.F32, "x")
    z = g.input(Shape.of(4), DType.F32, "z")
    g.add_output(g.add(g.mul(g.add(g.mul(x, 2.0), z), 3.0), 1.0), "y")
    o = optimize(g, AFFINE)
    assert op_counts(o)["mul"] == 2 and op_counts(o)["add"] == 2
    assert_same(g, o)


def test_integer_chains_are_left_alone() -> None:
    """Integer Div truncates: not affine."""
    g = Graph()
    x = g.input(Shape.of(4), DType.I64, "x")
    g.add_output(g.div(g.add(g.mul(x, 3), 1), 2), "y")
    assert op_counts(optimize(g, AFFINE)) == op_counts(optimize(g, only("fold_constants")))


# -- after a convolution ---------------------------------------------------------------------------
def _conv_bn(padding: int = 1, extra_user: bool = False) -> Graph:
    """conv (padding 1) + bias + BatchNormalization as the ONNX loader lowers it."""
    g = Graph()
    x = g.input(Shape.of(B, 2, 5, 5), DType.F32, "x")
    y = g.conv(x, _filter(g, 2, 2), padding=[padding, padding])
    c = y
    y = g.add(y, _channel(g, [0.5, 1.0]))
    y = g.div(g.sub(y, _channel(g, [1.0, 2.0])), g.sqrt(g.add(_channel(g, [4.0, 0.25]), 0.0)))
    y = g.add(g.mul(y, _channel(g, [3.0, 5.0])), _channel(g, [0.5, -0.5]))
    g.add_output(y, "y")
    if extra_user:
        g.add_output(c, "conv")
    return g


def test_batchnorm_after_conv_folds_into_filter_and_one_add() -> None:
    """scale = gamma / sqrt(var) = [1.5, 10]; bias = (b - mean)·scale + beta = [-0.25, -10.5]."""
    g = _conv_bn()
    o = optimize(g, AFFINE)
    assert str(o) == _lines(
        '%0: f32[B,2,5,5] = input #0 "x"',
        "%1: f32[2,2,3,3] = const <36 values>",
        "%2: f32[B,2,5,5] = conv(%0, %1) s=1 p=1",
        "%3: f32[1,2,1,1] = const [-0.25,-10.5]",
        "%4: f32[B,2,5,5] = broadcast(%3)",
        "%5: f32[B,2,5,5] = add(%2, %4)",
        'outputs: %5 "y"',
    )
    w = next(g.const_value(v) for v in g.values() if g[v].shape == Shape.of(2, 2, 3, 3))
    w_new = o.const_value(next(v for v in o.values() if o[v].shape == Shape.of(2, 2, 3, 3)))
    np.testing.assert_allclose(
        w_new, w * np.array([1.5, 10.0], np.float32)[:, None, None, None], rtol=1e-6
    )
    assert_same(g, o, {"B": 2})


def test_conv_with_another_user_keeps_its_filter() -> None:
    g = _conv_bn(extra_user=True)
    o = optimize(g, AFFINE)
    convs = [v for v in o.values() if o[v].op.NAME == "conv"]
    assert len(convs) == 1  # never computed twice
    assert op_counts(o)["mul"] == 1 and op_counts(o)["add"] == 1  # the chain still collapses
    assert_same(g, o, {"B": 2})


def test_spatially_varying_scale_is_not_folded_into_the_filter() -> None:
    g = Graph()
    x = g.input(Shape.of(B, 2, 4, 4), DType.F32, "x")
    y = g.conv(x, _filter(g, 2, 2), padding=[1, 1])
    ramp = g.constant(np.linspace(1, 2, 16, dtype=np.float32).reshape(4, 4))
    g.add_output(g.add(g.mul(g.add(y, 1.0), ramp), 2.0), "y")
    o = optimize(g, AFFINE)
    assert op_counts(o)["mul"] == 1 and op_counts(o)["add"] == 1
    assert_same(g, o, {"B": 2})


# -- before a convolution --------------------------------------------------------------------------
def _pre_conv(padding: int, bias: list[float] | None, groups: int = 1) -> Graph:
    g = Graph()
    c_in = 4 if groups > 1 else 2
    x = g.input(Shape.of(B, c_in, 6, 6), DType.F32, "x")
    y = g.mul(x, _channel(g, [2.0, 3.0, 4.0, 5.0][:c_in]))
    if bias is not None:
        y = g.add(y, _channel(g, bias))
    k = 4 if groups > 1 else 2
    y = g.conv(y, _filter(g, k, c_in // groups), padding=[padding, padding], groups=groups)
    g.add_output(y, "y")
    return g


def test_affine_before_unpadded_conv_folds_into_filter_and_bias() -> None:
    g = _pre_conv(0, [1.0, -2.0])
    o = optimize(g, AFFINE)
    assert str(o) == _lines(
        '%0: f32[B,2,6,6] = input #0 "x"',
        "%1: f32[2,2,3,3] = const <36 values>",
        "%2: f32[B,2,4,4] = conv(%0, %1) s=1 p=0",
        "%3: f32[1,2,1,1] = const [16.572078704833984,5.485166072845459]",  # Σ w·b per filter
        "%4: f32[B,2,4,4] = broadcast(%3)",
        "%5: f32[B,2,4,4] = add(%2, %4)",
        'outputs: %5 "y"',
    )
    w = g.const_value(next(v for v in g.values() if g[v].shape == Shape.of(2, 2, 3, 3)))
    bias = (w * np.array([1.0, -2.0])[None, :, None, None]).sum(axis=(1, 2, 3))
    np.testing.assert_allclose(o.const_value(Value(3, o.id)).reshape(-1), bias, rtol=1e-6)
    assert_same(g, o, {"B": 2})


def test_affine_before_padded_conv_is_not_folded() -> None:
    """Padding would turn the bias into a border of the wrong values: the chain stays before it."""
    g = _pre_conv(1, [1.0, -2.0])
    o = optimize(g, AFFINE)
    assert str(o) == _lines(
        '%0: f32[B,2,6,6] = input #0 "x"',
        "%1: f32[1,2,1,1] = const [2.0,3.0]",
        "%2: f32[B,2,6,6] = broadcast(%1)",
        "%3: f32[B,2,6,6] = mul(%0, %2)",
        "%4: f32[1,2,1,1] = const [1.0,-2.0]",
        "%5: f32[B,2,6,6] = broadcast(%4)",
        "%6: f32[B,2,6,6] = add(%3, %5)",
        "%7: f32[2,2,3,3] = const <36 values>",
        "%8: f32[B,2,6,6] = conv(%6, %7) s=1 p=1",
        'outputs: %8 "y"',
    )
    assert_same(g, o, {"B": 2})


def test_scale_before_padded_conv_folds() -> None:
    """Zero padding of x·s is s times zero-padded x: a pure scale folds whatever the padding."""
    g = _pre_conv(1, None)
    o = optimize(g, AFFINE)
    assert op_counts(o)["mul"] == 0 and op_counts(o)["add"] == 0 and op_counts(o)["conv"] == 1
    assert_same(g, o, {"B": 2})


@pytest.mark.parametrize("padding", [0, 1])
def test_grouped_conv_folds_per_group(padding: int) -> None:
    bias = [1.0, -2.0, 0.5, 3.0] if padding == 0 else None
    g = _pre_conv(padding, bias, groups=2)
    o = optimize(g, AFFINE)
    assert op_counts(o)["mul"] == 0 and op_counts(o)["conv"] == 1
    assert_same(g, o, {"B": 3})


def test_affine_on_both_sides_of_a_conv() -> None:
    """x·s + b before an unpadded conv and a batchnorm after it: one conv and one add remain."""
    g = Graph()
    x = g.input(Shape.of(B, 2, 6, 6), DType.F32, "x")
    y = g.add(g.mul(x, _channel(g, [2.0, 3.0])), _channel(g, [1.0, -1.0]))
    y = g.conv(y, _filter(g, 3, 2))
    y = g.div(g.sub(y, _channel(g, [1.0, 2.0, 3.0])), _channel(g, [2.0, 4.0, 8.0]))
    g.add_output(g.add(g.mul(y, _channel(g, [3.0, 5.0, 7.0])), 1.0), "y")
    o = optimize(g, AFFINE)
    assert sorted(op_counts(o).elements()) == [
        "add",
        "broadcast",
        "const",
        "const",
        "conv",
        "input",
    ]
    assert_same(g, o, {"B": 2})


def test_pre_conv_chain_with_another_user_is_not_folded() -> None:
    g = Graph()
    x = g.input(Shape.of(B, 2, 6, 6), DType.F32, "x")
    y = g.add(g.mul(x, _channel(g, [2.0, 3.0])), _channel(g, [1.0, -1.0]))
    g.add_output(g.conv(y, _filter(g, 2, 2)), "y")
    g.add_output(y, "pre")
    o = optimize(g, AFFINE)
    assert op_counts(o)["mul"] == 1 and op_counts(o)["add"] == 1
    assert_same(g, o, {"B": 2})


# -- div → mul -------------------------------------------------------------------------------------
def test_division_by_scalar_becomes_multiplication_by_reciprocal() -> None:
    g = Graph()
    x = g.input(Shape.of(B, 4), DType.F32, "x")
    g.add_output(g.div(x, 8.0), "y")
    o = optimize(g, DIV)
    assert str(o) == _lines(
        '%0: f32[B,4] = input #0 "x"',
        "%1: f32[1,1] = const [0.125]",
        "%2: f32[B,4] = broadcast(%1)",
        "%3: f32[B,4] = mul(%0, %2)",
        'outputs: %3 "y"',
    )
    assert_same(g, o, {"B": 3})


def test_division_by_per_channel_constant_keeps_it_compact() -> None:
    g = Graph()
    x = g.input(Shape.of(B, 3, 4, 4), DType.F32, "x")
    g.add_output(g.div(x, _channel(g, [2.0, 4.0, 0.5])), "y")
    o = optimize(g, DIV)
    assert str(o) == _lines(
        '%0: f32[B,3,4,4] = input #0 "x"',
        "%1: f32[1,3,1,1] = const [0.5,0.25,2.0]",
        "%2: f32[B,3,4,4] = broadcast(%1)",
        "%3: f32[B,3,4,4] = mul(%0, %2)",
        'outputs: %3 "y"',
    )
    assert_same(g, o, {"B": 2})


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.F64])
def test_div_to_mul_is_numerically_equal(dtype: DType) -> None:
    g = Graph()
    x = g.input(Shape.of(B, 5), dtype, "x")
    g.add_output(g.div(x, g.constant(np.array([3.0, 7.0, -0.1, 1e-3, 9.0], dtype.np))), "y")
    o = optimize(g, DIV)
    assert op_counts(o)["div"] == 0
    assert_same(g, o, {"B": 4}, rel=1e-3 if dtype is DType.F16 else 1e-6)


def test_division_by_non_constant_or_integers_is_kept() -> None:
    g = Graph()
    x = g.input(Shape.of(4), DType.F32, "x")
    z = g.input(Shape.of(4), DType.F32, "z")
    i = g.input(Shape.of(4), DType.I32, "i")
    g.add_output(g.div(x, z), "a")
    g.add_output(g.div(i, 3), "b")
    g.add_output(g.div(2.0, x), "c")
    assert op_counts(optimize(g, DIV))["div"] == 3


def test_chain_under_an_unfolded_constant_collapses_without_folding() -> None:
    """With folding off, ·sqrt(4) is not a constant operand: the chain below it is complete and
    still collapses."""
    g = Graph()
    x = g.input(Shape.of(4), DType.F32, "x")
    y = g.add(g.mul(g.add(x, 1.0), 2.0), 3.0)
    g.add_output(g.mul(y, g.sqrt(g.constant(np.float32(4.0)))), "y")
    o = optimize(g, only("fuse_affine"))
    assert op_counts(o)["add"] == 1 and op_counts(o)["mul"] == 2
    assert_same(g, o)


def _random_chain(
    g: Graph, y: Value, rng: np.random.Generator, channels: int, spatial: int
) -> Value:
    """1-4 random per-channel or scalar Add/Sub/Mul/Div links, constants on either side."""
    for _ in range(int(rng.integers(1, 5))):
        shape = [channels] + [1] * spatial if rng.random() < 0.7 else []
        c = g.constant(
            (rng.uniform(0.5, 2.0, shape) * rng.choice([-1, 1], shape)).astype(g[y].dtype.np)
        )
        match int(rng.integers(0, 5)):
            case 0:
                y = g.add(y, c) if rng.random() < 0.5 else g.add(c, y)
            case 1:
                y = g.sub(y, c)
            case 2:
                y = g.sub(c, y)
            case 3:
                y = g.mul(y, c) if rng.random() < 0.5 else g.mul(c, y)
            case _:
                y = g.div(y, c)
    return y


@pytest.mark.parametrize("seed", range(12))
def test_random_chains_around_random_convs(seed: int) -> None:
    """Chains before and after 1-d/2-d/3-d convolutions with random padding, stride, groups and
    dtype: the optimized graph always matches, and folding never leaves more ops than it found."""
    rng = np.random.default_rng(seed)
    nd = int(rng.integers(1, 4))
    dtype = [DType.F32, DType.F64][seed % 2]
    groups = int(rng.choice([1, 2]))
    c_in, k = 2 * groups, 2 * groups
    g = Graph()
    x = g.input(Shape.of(B, c_in, *([5] * nd)), dtype, "x")
    y = _random_chain(g, x, rng, c_in, nd)
    w = g.constant(rng.standard_normal((k, c_in // groups, *([3] * nd))).astype(dtype.np))
    pad = [int(rng.integers(0, 2))] * nd
    y = g.conv(y, w, stride=[int(rng.integers(1, 3))] * nd, padding=pad, groups=groups)
    y = _random_chain(g, y, rng, k, nd)
    g.add_output(y, "y")
    o = optimize(g, AFFINE)
    counts, before = op_counts(o), op_counts(g)
    assert counts["conv"] == 1
    assert counts["mul"] + counts["div"] + counts["sub"] + counts["add"] <= 4
    assert (
        counts["mul"] + counts["add"]
        <= before["mul"] + before["add"] + before["sub"] + before["div"]
    )
    assert_same(g, o, {"B": 2}, rel=1e-5 if dtype is DType.F32 else 1e-12)


def _quantize(g: Graph, y: Value, scale: float, zero: float) -> Value:
    """QuantizeLinear as the loader builds it: round(y / scale) + zero, saturated to u8."""
    q = g.add(g.unary(UnaryOp.ROUND, g.div(y, scale)), zero)
    return g.cast(g.minimum(g.maximum(q, 0.0), 255.0), DType.U8)


def test_a_quantization_keeps_its_division_and_its_chain() -> None:
    """x / s feeding a Round stays a division, and a dequantize-requantize chain feeding it
    stays as written: a reciprocal multiply or a collapsed chain moves values at rounding ties
    by one unit (the case below has 0.3 / 0.1 in it: a tie in one form, not in the other)."""
    g = Graph()
    q = g.input(Shape.of(256), DType.U8, "q")
    y = g.mul(g.sub(g.cast(q, DType.F32), 3.0), 0.05)  # DequantizeLinear
    g.add_output(_quantize(g, y, 0.1, 7.0), "requantized")
    x = g.input(Shape.of(4096), DType.F32, "x")
    g.add_output(_quantize(g, x, 0.1, 0.0), "quantized")
    o = optimize(g)
    assert op_counts(o)["div"] == 2
    ties = (np.arange(4096, dtype=np.float32) - 2048) * np.float32(
        0.05
    )  # k·0.05: half of them ties
    assert_same(g, o, rel=0.0, inputs=[np.arange(256, dtype=np.uint8), ties])
