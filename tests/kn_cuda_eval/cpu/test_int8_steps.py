"""The CPU backend's integer steps (`PlanSettings.integer_steps`): the planner emits
`steps.IntMatMul` / `steps.IntConv`, the emulator runs them exactly, and `Device.cpu()` runs
them through oneDNN's int8 primitives where those are exact here, else the emulator's step —
every result equal to the reference executor's, bit for bit. Which path ran is asked of the
library on this machine (`onednn.has_vnni`), never assumed: 7-bit weights take oneDNN on every
CPU, full-range ones only with VNNI (`kn_cuda_eval.cpu.onednn.int8`)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kn_cuda_eval import PlanSettings, emulate, plan
from kn_cuda_eval.cpu import onednn
from kn_cuda_eval.cpu.executor import HostExecutor, host_plan_settings
from kn_cuda_eval.planning import steps as pst
from kn_graph import DType, Graph, Shape
from kn_graph.onnx import load_onnx
from kn_graph.ops import Value
from kn_graph.reference import evaluate
from kn_runtime import Device

RNG = np.random.default_rng(11)
HAVE = onednn.available() is None
LIMITS = {"7bit": onednn.SAFE_WEIGHT, "full": 124}


def _range(dt: DType) -> tuple[int, int]:
    return (0, 256) if dt is DType.U8 else (-128, 128)


def _source(dt: DType, shape: tuple[int, ...]) -> np.ndarray:
    lo, hi = _range(dt)
    return RNG.integers(lo, hi, shape).astype(dt.np)


def _weights(
    dt: DType, shape: tuple[int, ...], zeros: np.ndarray, lim: int, axis: int
) -> np.ndarray:
    """Weights of dtype dt whose shift by `zeros` (one per index of `axis`) spans [-lim, lim],
    both ends reached."""
    z = zeros.astype(np.int64).reshape([-1 if a == axis else 1 for a in range(len(shape))])
    delta = RNG.integers(-lim, lim + 1, shape)
    delta.reshape(-1)[:2] = (lim, -lim)
    return (z + delta).astype(dt.np)


def _zero_points(dt: DType, n: int, per: bool) -> np.ndarray:
    mid = 128 if dt is DType.U8 else 0
    return (mid + (RNG.integers(-3, 4, n) if per else np.full(n, 3))).astype(dt.np)


def _check(g: Graph, feed: list[np.ndarray], onednn_steps: int) -> None:
    """Device.cpu() and the executor of the plan it makes equal the reference exactly, and
    exactly `onednn_steps` integer steps ran in oneDNN (the others in the emulator)."""
    want = evaluate(g, feed)
    got = Device.cpu(threads=2).prepare(g).eval(feed)
    for name, a, b in zip(g.output_names, got, want, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    p = plan(g, settings=host_plan_settings(g))
    assert p.steps and host_plan_settings(g).integer_steps
    ex = HostExecutor(p, threads=2)
    for a, b in zip(ex.eval(feed), want, strict=True):
        assert np.array_equal(a, b)
    ran = [n for n in ex.names if n.startswith("onednn int8")]
    assert len(ran) == (onednn_steps if HAVE else 0), ex.names


CONV = int(onednn.conv_enabled())
"""Integer convolutions run on oneDNN unless KN_INT8_CONV=0 (int8.conv_enabled)."""


def _taken(lim: int) -> int:
    """1 when oneDNN runs a product whose shifted constant weights reach ±lim, here."""
    return int(lim <= onednn.SAFE_WEIGHT or bool(onednn.has_vnni()))


# -- planning and emulation ------------------------------------------------------------------
def _small_graph() -> tuple[Graph, list[np.ndarray]]:
    g = Graph()
    a = g.input(Shape.of(2, 5, 33), DType.U8, "a")
    zb = _zero_points(DType.I8, 7, True)
    b = g.constant(_weights(DType.I8, (2, 33, 7), zb, 120, 2))
    za = g.constant(RNG.integers(0, 100, (2, 5, 1)).astype(np.uint8))  # per row
    g.add_output(g.int_matmul(a, b, za, g.constant(zb)), "y")
    x = g.input(Shape.of(1, 6, 7, 9), DType.I8, "x")
    zw = _zero_points(DType.U8, 9, True)
    w = g.constant(_weights(DType.U8, (9, 2, 3, 3), zw, 120, 0))
    c = g.int_conv(x, w, g.scalar(-5, DType.I8), g.constant(zw), (2, 1), (1, 1), (1, 2), 3)
    g.add_output(c, "c")
    return g, [_source(DType.U8, (2, 5, 33)), _source(DType.I8, (1, 6, 7, 9))]


def test_planner_emits_integer_steps_only_when_asked() -> None:
    g, _ = _small_graph()
    text = str(plan(g, settings=PlanSettings(integer_steps=True)))
    assert "int_matmul  i32[2,5,7]" in text and "int_conv    i32[1,9,4,7]" in text, text
    assert "- u8[2,5,1]:(5,1,1)" in text and "g=3" in text, text
    lowered = str(plan(g))
    assert "int_" not in lowered and "f64" in lowered, lowered


def test_emulator_runs_integer_steps_exactly() -> None:
    g, feed = _small_graph()
    got = emulate(plan(g, settings=PlanSettings(integer_steps=True)), feed)
    for a, b in zip(got, evaluate(g, feed), strict=True):
        assert a.dtype == np.int32 and np.array_equal(a, b)


def test_per_row_source_zero_falls_back_exactly() -> None:
    g, feed = _small_graph()  # the matmul's a_zero differs per row: no oneDNN form
    # the conv's weights are full range
    _check(g, feed, 1 if onednn.has_vnni() and onednn.conv_enabled() else 0)


# -- matmul ----------------------------------------------------------------------------------
@pytest.mark.parametrize("ta", [DType.U8, DType.I8])
@pytest.mark.parametrize("tb", [DType.U8, DType.I8])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("weights", ["7bit", "full"])
def test_int_matmul_on_the_cpu(ta: DType, tb: DType, per_column: bool, weights: str) -> None:
    batch, m, k, n = (3, 7, 70, 19) if per_column else (1, 33, 130, 24)
    g = Graph()
    a = g.input(Shape.of(batch, m, k), ta, "a")
    zb = _zero_points(tb, n, per_column)
    b = g.constant(_weights(tb, (batch, k, n), zb, LIMITS[weights], 2))
    za = g.scalar(9 if ta is DType.U8 else -9, ta)
    g.add_output(g.int_matmul(a, b, za, g.constant(zb.reshape(1, 1, n))), "y")
    _check(g, [_source(ta, (batch, m, k))], _taken(LIMITS[weights]))


@pytest.mark.parametrize("w", [64, -64, 65, -65, 127, -128])
def test_extreme_products_are_exact(w: int) -> None:
    """Every source at its largest shifted value times uniform weights: the pairs oneDNN adds
    in int16 without VNNI reach 2·255·|w| — exact up to 64, clipped from 65 (so refused)."""
    for ta, top in ((DType.U8, 255), (DType.I8, 127)):
        g = Graph()
        a = g.input(Shape.of(1, 4, 64), ta, "a")
        b = g.constant(np.full((1, 64, 8), w, np.int8))
        g.add_output(g.int_matmul(a, b, g.scalar(0, ta), g.scalar(0, DType.I8)), "y")
        _check(g, [np.full((1, 4, 64), top, ta.np)], _taken(abs(w)))


def test_source_zero_point_computed_at_run_time() -> None:
    """A zero point the graph computes (dynamic quantization) is converted by a reorder at
    every run; a constant weight zero point of per-column values folds into the weights."""
    g = Graph()
    a = g.input(Shape.of(2, 9, 40), DType.U8, "a")
    za = g.input(Shape.of(), DType.U8, "za")
    zb = _zero_points(DType.I8, 12, True)
    b = g.constant(_weights(DType.I8, (1, 40, 12), zb, 64, 2))
    bb = g.broadcast(b, Shape.of(2, 40, 12))
    g.add_output(g.int_matmul(a, bb, g.view(za, Shape.of(1, 1, 1)), g.constant(zb)), "y")
    for z in (0, 131):
        _check(g, [_source(DType.U8, (2, 9, 40)), np.array(z, np.uint8)], 1)


@pytest.mark.parametrize("zero", [0, 3])
def test_weights_computed_at_run_time(zero: int) -> None:
    """Weights the graph computes cannot be shifted or checked once: oneDNN takes them only as
    s8 with a zero point of 0 on a VNNI CPU; otherwise the emulator's exact step runs."""
    g = Graph()
    a = g.input(Shape.of(1, 6, 50), DType.U8, "a")
    b = g.input(Shape.of(1, 50, 10), DType.I8, "b")
    g.add_output(g.int_matmul(a, b, g.scalar(4, DType.U8), g.scalar(zero, DType.I8)), "y")
    feed = [_source(DType.U8, (1, 6, 50)), _source(DType.I8, (1, 50, 10))]
    _check(g, feed, int(zero == 0 and bool(onednn.has_vnni())))


# -- convolution -----------------------------------------------------------------------------
CONVS = {  # x shape, k, kernel, stride, padding, dilation, groups
    "3x3": ((2, 8, 9, 11), 12, (3, 3), (1, 1), (1, 1), (1, 1), 1),
    "strided": ((1, 8, 9, 11), 16, (3, 3), (2, 2), (1, 1), (1, 1), 1),
    "dilated": ((1, 8, 9, 11), 8, (3, 2), (1, 1), (2, 1), (2, 1), 1),
    "grouped": ((1, 16, 7, 7), 16, (3, 3), (1, 1), (1, 1), (1, 1), 2),
    "depthwise": ((2, 8, 9, 9), 8, (3, 3), (1, 2), (1, 1), (1, 1), 8),
    "pointwise": ((1, 32, 6, 6), 16, (1, 1), (1, 1), (0, 0), (1, 1), 1),
    "1d": ((2, 6, 17), 10, (3,), (1,), (2,), (2,), 1),
    # 8 channels fill half of an AVX-512 block: the s8 source's shifted reorder into it went
    # wrong on 2 threads (int8.conv_enabled)
    "partial block": ((2, 8, 32, 32), 8, (3, 3), (1, 1), (1, 1), (1, 1), 1),
}


@pytest.mark.parametrize("tx", [DType.U8, DType.I8])
@pytest.mark.parametrize("tw", [DType.U8, DType.I8])
@pytest.mark.parametrize("case", sorted(CONVS))
def test_int_conv_on_the_cpu(tx: DType, tw: DType, case: str) -> None:
    shape, k, ks, stride, pad, dil, groups = CONVS[case]
    per = case != "pointwise"
    for weights in ("7bit", "full") if case == "3x3" else ("7bit",):
        g = Graph()
        x = g.input(Shape.of(*shape), tx, "x")
        zw = _zero_points(tw, k, per)
        w = g.constant(_weights(tw, (k, shape[1] // groups, *ks), zw, LIMITS[weights], 0))
        zx = g.scalar(6 if tx is DType.U8 else -6, tx)
        g.add_output(g.int_conv(x, w, zx, g.constant(zw), stride, pad, dil, groups), "y")
        _check(g, [_source(tx, shape)], _taken(LIMITS[weights]) * CONV)


def test_int_conv_source_zero_computed_at_run_time() -> None:
    for tx in (DType.U8, DType.I8):
        g = Graph()
        x = g.input(Shape.of(1, 8, 10, 10), tx, "x")
        zx = g.input(Shape.of(), tx, "zx")
        w = g.constant(_weights(DType.I8, (8, 8, 3, 3), np.zeros(8, np.int8), 64, 0))
        g.add_output(g.int_conv(x, w, zx, g.scalar(0, DType.I8), None, (1, 1)), "y")
        _check(
            g, [_source(tx, (1, 8, 10, 10)), np.array(-7 if tx is DType.I8 else 200, tx.np)], CONV
        )


def test_int_conv_output_feeds_float_steps() -> None:
    """A QLinearConv-shaped chain: the i32 sums scaled to f32 by the next (fused) step."""
    g = Graph()
    x = g.input(Shape.of(1, 4, 8, 8), DType.U8, "x")
    w = g.constant(_weights(DType.I8, (6, 4, 3, 3), np.zeros(6, np.int8), 60, 0))
    y = g.int_conv(x, w, g.scalar(128, DType.U8), g.scalar(0, DType.I8), None, (1, 1))
    s: Value = g.mul(g.cast(y, DType.F32), 0.01)
    g.add_output(g.relu(s), "y")
    _check(g, [_source(DType.U8, (1, 4, 8, 8))], CONV)


def _qdq_chain(act: DType, per_channel: bool) -> tuple[onnx.ModelProto, list[np.ndarray]]:
    """Three ConvIntegers the way a quantized CNN chains them: each i32 output requantized
    (a scale per channel or per tensor, then QuantizeLinear to `act`) into the next, a residual
    add of two dequantized activations between, the last output both a plan output and pooled.
    Per tensor, the requantization is one flat step over the whole tensor (i32 in, 8 bits out);
    per channel, one over [C, H*W] with the scales broadcast."""
    rng = np.random.default_rng(5)
    tt = {DType.U8: TensorProto.UINT8, DType.I8: TensorProto.INT8}[act]
    zero = 7 if act is DType.U8 else -3
    scales = (1, 32, 1, 1) if per_channel else ()

    def conv_w(k: int, c: int, ks: int) -> np.ndarray:
        w = rng.integers(-64, 65, (k, c, ks, ks)).astype(np.int8)
        w.reshape(-1)[:2] = (64, -64)
        return w

    init = [
        numpy_helper.from_array(conv_w(32, 16, 3), "w1"),
        numpy_helper.from_array(conv_w(32, 32, 1), "w2"),
        numpy_helper.from_array(conv_w(24, 32, 3), "w3"),
        numpy_helper.from_array(np.array(zero, act.np), "z"),
        numpy_helper.from_array(np.array(0.4, np.float32), "s"),
        numpy_helper.from_array((rng.random(scales) * 0.01).astype(np.float32), "c1"),
        numpy_helper.from_array((rng.random(scales) * 0.02).astype(np.float32), "c2"),
    ]
    nodes = [
        helper.make_node("ConvInteger", ["x", "w1", "z"], ["y1"], pads=[1, 1, 1, 1]),
        helper.make_node("Cast", ["y1"], ["f1"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["f1", "c1"], ["g1"]),
        helper.make_node("QuantizeLinear", ["g1", "s", "z"], ["q1"]),
        helper.make_node("ConvInteger", ["q1", "w2", "z"], ["y2"]),
        helper.make_node("Cast", ["y2"], ["f2"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["f2", "c2"], ["g2"]),
        helper.make_node("QuantizeLinear", ["g2", "s", "z"], ["q2"]),
        helper.make_node("DequantizeLinear", ["q1", "s", "z"], ["d1"]),
        helper.make_node("DequantizeLinear", ["q2", "s", "z"], ["d2"]),
        helper.make_node("Add", ["d1", "d2"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "s", "z"], ["q3"]),
        helper.make_node(
            "ConvInteger", ["q3", "w3", "z"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2]
        ),
        helper.make_node("DequantizeLinear", ["q3", "s", "z"], ["d3"]),
        helper.make_node("GlobalAveragePool", ["d3"], ["pooled"]),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq_chain",
        [helper.make_tensor_value_info("x", tt, [1, 16, 12, 12])],
        [
            helper.make_tensor_value_info("y", TensorProto.INT32, None),
            helper.make_tensor_value_info("pooled", TensorProto.FLOAT, None),
        ],
        init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    lo, hi = _range(act)
    return model, [rng.integers(lo, hi, (1, 16, 12, 12)).astype(act.np)]


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("act", [DType.U8, DType.I8])
def test_a_chain_of_integer_convolutions_stays_channels_last(act: DType, per_channel: bool) -> None:
    """The layout pass keeps the activations between integer convolutions channels last
    (oneDNN's int8 layout): the requantizing steps, the residual add and the pool read and
    write them through permuted strides, and the convolution in the middle runs with no
    reorder. Exact against the reference either way; the chain forms where oneDNN takes the
    source as it is (u8 everywhere, s8 with VNNI: `onednn.int8.source_shift`)."""
    model, feed = _qdq_chain(act, per_channel)
    g = load_onnx(model)
    want = evaluate(g, feed)
    # the pool's mean of 144 float32s summed in another order: off by at most 144 ulps of the
    # largest magnitude a dequantized value has (255 steps of 0.4)
    atol = 144 * 2.0**-24 * 255 * 0.4
    ex = HostExecutor(plan(g, settings=host_plan_settings(g)), threads=2)
    for got in (Device.cpu(threads=2).prepare(g).eval(feed), ex.eval(feed)):
        assert got[0].dtype == np.int32 and np.array_equal(got[0], want[0])
        np.testing.assert_allclose(got[1], want[1], rtol=0, atol=atol)
    convs = [k for k, s in enumerate(ex.steps) if isinstance(s, pst.IntConv)]
    assert len(convs) == 3
    names = [ex.names[k] for k in convs]
    chained = HAVE and CONV and not onednn.int8.source_shift(act)
    if not chained:
        assert all("channels" not in n for n in names), names
        return
    # the first reads the plan's input, the last writes the plan's output: one reorder each
    assert all(n.startswith("onednn int8") for n in names), names
    assert [n.endswith("+1 reorders") for n in names] == [True, False, True], names
    assert "reorders" not in names[1], names
    mid = ex.steps[convs[1]]
    c, hw = mid.x.shape[1], mid.x.shape[2] * mid.x.shape[3]
    assert mid.x.strides[1] == 1 and mid.x.strides[3] == c and mid.out.strides[1] == 1, mid
    assert hw > 1


def test_extreme_s8_convolution_sums_are_exact() -> None:
    """Every source at -128 or 127 times weights at -128 or 127 over a 3x3x64 window: the
    largest sums an s8 convolution makes (oneDNN shifts s8 sources internally where it takes
    them as they are)."""
    for x_val, w_val in ((-128, -128), (127, -128), (-128, 127)):
        g = Graph()
        x = g.input(Shape.of(1, 64, 6, 6), DType.I8, "x")
        w = g.constant(np.full((16, 64, 3, 3), w_val, np.int8))
        g.add_output(
            g.int_conv(x, w, g.scalar(0, DType.I8), g.scalar(0, DType.I8), None, (1, 1)), "y"
        )
        feed = [np.full((1, 64, 6, 6), x_val, np.int8)]
        _check(g, feed, CONV * _taken(128))
