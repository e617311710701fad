"""Block-quantized weights: com.microsoft MatMulNBits (made by onnxruntime's own 4-bit quantizer,
and hand-packed 2- and 8-bit blobs), GatherBlockQuantized, and int4 / uint4 initializers, against
onnxruntime on the reference executor and Device.cpu()."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kn_graph.errors import KnError
from kn_graph.onnx import load_onnx
from kn_runtime import Device
from tests.kn_graph.onnx.helpers import model, ours, reference

RNG = np.random.default_rng(5)


def _com(m: onnx.ModelProto) -> onnx.ModelProto:
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return m


def _check(m: onnx.ModelProto, feed: dict[str, np.ndarray], rtol: float = 1e-5) -> None:
    want = reference(m, feed)
    g = load_onnx(m)
    cpu = Device.cpu().prepare(g).eval({n: feed[n] for n in g.input_names})
    for got in (ours(m, feed), cpu):
        for a, b in zip(got, want, strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-4)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("k", [64, 80])  # 80: the last block is partial
def test_matmul_nbits_from_onnxruntimes_quantizer(symmetric: bool, k: int) -> None:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    n = 24
    w = RNG.standard_normal((k, n)).astype(np.float32)
    x = RNG.standard_normal((3, 2, k)).astype(np.float32)
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": x}, inits={"w": w}, opset=17)
    q = MatMulNBitsQuantizer(m, block_size=32, is_symmetric=symmetric)
    q.process()
    qm = q.model.model
    assert [nd.op_type for nd in qm.graph.node] == ["MatMulNBits"]
    _check(qm, {"x": x})


def _pack(vals: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned `bits`-bit values along the last axis, low-order bits first."""
    per = 8 // bits
    v = vals.reshape(*vals.shape[:-1], -1, per).astype(np.uint16)
    return (v << (np.arange(per) * bits)).sum(-1).astype(np.uint8)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_matmul_nbits_packed_zero_points_and_bias(bits: int) -> None:
    k, n, block = 64, 8, 16
    blocks = k // block
    q = RNG.integers(0, 2**bits, (n, blocks, block))
    zeros = RNG.integers(0, 2**bits, (n, blocks))
    per_row = -(-blocks * bits // 8)
    zpad = np.zeros((n, per_row * 8 // bits), np.int64)
    zpad[:, :blocks] = zeros
    inits = {
        "b": _pack(q, bits),
        "s": RNG.uniform(0.01, 0.1, (n, blocks)).astype(np.float32),
        "z": _pack(zpad, bits),
        "bias": RNG.standard_normal(n).astype(np.float32),
    }
    x = RNG.standard_normal((5, k)).astype(np.float32)
    nd = helper.make_node(
        "MatMulNBits",
        ["x", "b", "s", "z", "", "bias"],
        ["y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=bits,
        block_size=block,
    )
    _check(_com(model([nd], {"x": x}, inits=inits)), {"x": x})


@pytest.mark.parametrize("zeros", [True, False])
def test_gather_block_quantized_uint8_packed_4_bit(zeros: bool) -> None:
    """onnxruntime-genai's 4-bit embedding layout: the table stays packed in the graph (no
    float table of rows x cols), the gathered rows are dequantized when they are read."""
    from kn_graph.ops import Constant

    rows, cols, block = 10, 64, 32
    vals = RNG.integers(0, 16, (rows, cols))
    inits = {
        "data": _pack(vals, 4),
        "s": RNG.uniform(0.01, 0.1, (rows, cols // block)).astype(np.float32),
    }
    inits["s"][9, 1] = np.nan  # row 9's second block: NaN there, row 9's first block not
    if zeros:
        inits["z"] = _pack(RNG.integers(0, 16, (rows, cols // block)), 4)
    idx = np.array([[3, 0], [9, -1], [-rows, rows - 1]], np.int64)  # both ends, both signs
    nd = helper.make_node(
        "GatherBlockQuantized",
        ["data", "idx", "s", *(["z"] if zeros else [])],
        ["y"],
        domain="com.microsoft",
        bits=4,
        block_size=block,
        gather_axis=0,
        quantize_axis=1,
    )
    g = load_onnx(_com(model([nd], {"idx": idx}, inits=inits)))
    tables = [g[v].op.tensor.array for v in g.values() if isinstance(g[v].op, Constant)]
    assert max(a.nbytes for a in tables) == rows * cols // 2  # the packed bytes, no floats
    _check(_com(model([nd], {"idx": idx}, inits=inits)), {"idx": idx})


def test_gather_block_quantized_int4_table() -> None:
    rows, cols, block = 6, 32, 16
    vals = RNG.integers(-8, 8, (rows, cols))
    data = helper.make_tensor("data", TensorProto.INT4, [rows, cols], vals.reshape(-1).tolist())
    scales = numpy_helper.from_array(RNG.uniform(0.01, 0.1, (rows, 2)).astype(np.float32), "s")
    idx = np.array([5, 1, 1], np.int64)
    nd = helper.make_node(
        "GatherBlockQuantized",
        ["data", "idx", "s"],
        ["y"],
        domain="com.microsoft",
        block_size=block,
        gather_axis=0,
        quantize_axis=1,
    )
    m = model([nd], {"idx": idx})
    m.graph.initializer.extend([data, scales])
    _check(_com(m), {"idx": idx})


@pytest.mark.parametrize("elem", [TensorProto.INT4, TensorProto.UINT4])
def test_dequantize_linear_of_a_4_bit_initializer(elem: int) -> None:
    lo, hi = (-8, 8) if elem == TensorProto.INT4 else (0, 16)
    vals = RNG.integers(lo, hi, (4, 6))
    w = helper.make_tensor("w", elem, [4, 6], vals.reshape(-1).tolist())
    z = helper.make_tensor("z", elem, [4], RNG.integers(lo, hi, 4).tolist())
    s = numpy_helper.from_array(RNG.uniform(0.1, 1, 4).astype(np.float32), "s")
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], axis=0),
        helper.make_node("MatMul", ["x", "wf"], ["y"]),
    ]
    m = model(nodes, {"x": x}, opset=21)
    m.graph.initializer.extend([w, z, s])
    _check(m, {"x": x})


def test_matmul_nbits_with_b_of_the_wrong_shape_names_the_node() -> None:
    x = RNG.standard_normal((2, 32)).astype(np.float32)
    inits = {"b": np.zeros((8, 2, 8), np.uint8), "s": np.ones((8, 2), np.float32)}
    nd = helper.make_node(
        "MatMulNBits",
        ["x", "b", "s"],
        ["y"],
        domain="com.microsoft",
        name="mnb",
        K=32,
        N=8,
        bits=4,
        block_size=32,
    )
    with pytest.raises(KnError, match=r"mnb.*B must be uint8 \[8, 1, 16\]"):
        load_onnx(_com(model([nd], {"x": x}, inits=inits)))
