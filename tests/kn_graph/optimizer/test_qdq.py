"""QDQ fusion (kn_graph.optimizer.qdq): DequantizeLinear → Conv / MatMul / Gemm becomes the
integer product scaled once. Graphs are loaded from QDQ ONNX models as onnxruntime's quantizer
writes them; the fused graph must give onnxruntime's node-by-node outputs (what the unfused
graph computes) within one unit of the requantized output, and the rewrite must not fire where
its conditions fail."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from kn_graph.graph import Graph
from kn_graph.onnx import load_onnx
from kn_graph.optimizer import OptimizerSettings, optimize
from kn_graph.reference import evaluate
from tests.kn_graph.onnx.helpers import reference

RNG = np.random.default_rng(17)
FUSE = OptimizerSettings(fuse_qdq=True)


def _ops(g: Graph) -> collections.Counter[str]:
    return collections.Counter(g[v].op.NAME for v in g.values())


def _qdq_conv(per_channel: bool, w_bits: int = 8, pads: int = 1) -> onnx.ModelProto:
    k, c = 6, 4
    lim = 2 ** (w_bits - 1)
    w = RNG.integers(-lim, lim, (k, c, 3, 3)).astype(np.int8)
    ws = RNG.uniform(0.002, 0.01, k if per_channel else ()).astype(np.float32)
    inits = [
        numpy_helper.from_array(a, n)
        for a, n in (
            (np.array(0.05, np.float32), "xs"),
            (np.array(3, np.uint8), "xz"),
            (w, "w"),
            (ws, "ws"),
            (np.zeros(ws.shape, np.int8), "wz"),
            (RNG.standard_normal(k).astype(np.float32) * 0.1, "bias"),
            (np.array(0.04, np.float32), "ys"),
            (np.array(128, np.uint8), "yz"),
        )
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
        helper.make_node("Conv", ["xd", "wd", "bias"], ["c"], pads=[pads] * 4),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "ys", "yz"], ["yq"]),
        helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", c, 9, 9])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("per_channel", [False, True])
def test_dq_conv_becomes_an_integer_convolution(per_channel: bool) -> None:
    m = _qdq_conv(per_channel)
    fused = optimize(load_onnx(m), FUSE)
    ops = _ops(fused)
    assert ops["int_conv"] == 1 and ops["conv"] == 0, ops
    x = RNG.standard_normal((2, 4, 9, 9)).astype(np.float32)
    got, want = evaluate(fused, [x])[0], reference(m, {"x": x})[0]
    assert np.abs(got - want).max() <= 0.04 * 1.001  # one unit of y's scale, at a tie


def test_dq_conv_is_kept_when_off_or_when_weights_are_wider_than_allowed() -> None:
    g = load_onnx(_qdq_conv(True))
    assert _ops(optimize(g))["int_conv"] == 0  # off by default
    assert _ops(optimize(g, OptimizerSettings(fuse_qdq=True, qdq_weight_bits=7)))["int_conv"] == 0
    seven = load_onnx(_qdq_conv(True, w_bits=7))
    assert (
        _ops(optimize(seven, OptimizerSettings(fuse_qdq=True, qdq_weight_bits=7)))["int_conv"] == 1
    )


def _qdq_gemm(trans_b: int, per_channel: bool) -> onnx.ModelProto:
    n, k = 5, 12
    w = RNG.integers(-128, 128, (n, k) if trans_b else (k, n)).astype(np.int8)
    ws = RNG.uniform(0.002, 0.01, n if per_channel else ()).astype(np.float32)
    inits = [
        numpy_helper.from_array(a, name)
        for a, name in (
            (np.array(0.05, np.float32), "xs"),
            (np.array(-3, np.int8), "xz"),
            (w, "w"),
            (ws, "ws"),
            (np.zeros(ws.shape, np.int8), "wz"),
            (RNG.standard_normal(n).astype(np.float32), "bias"),
        )
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0 if trans_b else 1),
        helper.make_node("Gemm", ["xd", "wd", "bias"], ["y"], transB=trans_b),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", k])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("per_channel", [False, True])
def test_dq_gemm_becomes_an_integer_product(trans_b: int, per_channel: bool) -> None:
    m = _qdq_gemm(trans_b, per_channel)
    fused = optimize(load_onnx(m), FUSE)
    assert _ops(fused)["int_matmul"] == 1 and _ops(fused)["matmul"] == 0, _ops(fused)
    x = RNG.standard_normal((3, 12)).astype(np.float32)
    got, want = evaluate(fused, [x])[0], reference(m, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # no requantization: float only


def test_golden_printout_of_a_fused_convolution() -> None:
    from kn_graph import DType, Shape

    g = Graph()
    xq = g.input(Shape.of(1, 2, 4, 4), DType.U8, "xq")
    xd = g.mul(g.sub(g.cast(xq, DType.F32), 3.0), 0.5)
    wd = g.mul(
        g.cast(g.constant(np.arange(-9, 9, dtype=np.int8).reshape(1, 2, 3, 3)), DType.F32), 0.25
    )
    g.add_output(g.conv(xd, wd, padding=[1, 1]), "y")
    assert str(optimize(g, FUSE)) == "\n".join(
        [
            '%0: u8[1,2,4,4] = input #0 "xq"',
            "%1: i8[1,2,3,3] = const <18 values>",
            "%2: u8[] = const 3",
            "%3: i8[1] = const [0]",
            "%4: i32[1,1,4,4] = int_conv(%0, %1, %2, %3) s=1 p=1",
            "%5: f32[1,1,4,4] = cast_f32(%4)",
            "%6: f32[1,1,1,1] = const [0.125]",
            "%7: f32[1,1,4,4] = broadcast(%6)",
            "%8: f32[1,1,4,4] = mul(%5, %7)",
            'outputs: %8 "y"',
        ]
    )


@pytest.mark.parametrize(("largest", "fused"), [(64, 1), (-64, 1), (65, 0), (-65, 0)])
def test_seven_bit_weights_mean_at_most_64_in_magnitude(largest: int, fused: int) -> None:
    """qdq_weight_bits=7 admits |w - zw| <= 64: what reduce_range quantizers write and what
    oneDNN's non-VNNI int8 kernels sum exactly (2·255·64 <= 32767)."""
    from kn_graph import DType, Shape

    g = Graph()
    xq = g.input(Shape.of(1, 2, 4, 4), DType.U8, "xq")
    w = np.zeros((1, 2, 3, 3), np.int8)
    w.reshape(-1)[0] = largest
    xd = g.mul(g.cast(xq, DType.F32), 0.5)
    g.add_output(g.conv(xd, g.mul(g.cast(g.constant(w), DType.F32), 0.25)), "y")
    seven = OptimizerSettings(fuse_qdq=True, qdq_weight_bits=7)
    assert _ops(optimize(g, seven))["int_conv"] == fused
