"""ConvInteger and MatMulInteger with uint8 weights over their whole range and a zero point
inside it (onnxruntime's early `quantize_dynamic`), whose shifted weights do not fit int8: the
optimizer splits each into an int8 step and a window / row sum (`optimizer.intweights`), so that
oneDNN's int8 kernels run it where they are exact (VNNI) instead of the emulator's float64 step.
Int32 outputs, so every result must equal onnxruntime's and the reference's exactly."""

from __future__ import annotations

import zlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from kn_cuda_eval.cpu import onednn
from kn_graph import DType, Graph, Shape
from kn_graph.onnx import load_onnx
from kn_graph.ops import IntConv, IntMatMul
from kn_graph.optimizer import OptimizerSettings, optimize
from kn_graph.reference import evaluate
from kn_runtime import Device

# Zero points inside the range but never 128: with weights at 0 and 255, w - 128 fits int8 and
# the single step needs no split. Every test draws from its own generator, so what it draws does
# not depend on which tests ran before it in the same (xdist) worker.
ZERO_POINTS = np.r_[90:120, 137:180]


def _rng(*key: object) -> np.random.Generator:
    return np.random.default_rng([23, zlib.crc32(repr(key).encode())])  # str hashes vary per run


def _conv_model(
    rng: np.random.Generator, c: int, k: int, groups: int, per_channel: bool
) -> onnx.ModelProto:
    w = rng.integers(0, 256, (k, c // groups, 3, 3)).astype(np.uint8)
    w.reshape(-1)[:2] = (0, 255)
    zw = rng.choice(ZERO_POINTS, k if per_channel else ()).astype(np.uint8)
    node = helper.make_node(
        "ConvInteger", ["x", "w", "zx", "zw"], ["y"], pads=[1, 1, 1, 1], strides=[2, 1],
        group=groups,
    )  # fmt: skip
    graph = helper.make_graph(
        [node],
        "conv_integer",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [2, c, 9, 7])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array(37, np.uint8), "zx"),
            numpy_helper.from_array(zw, "zw"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _matmul_model(rng: np.random.Generator, k: int, n: int, per_column: bool) -> onnx.ModelProto:
    b = rng.integers(0, 256, (k, n)).astype(np.uint8)
    b.reshape(-1)[:2] = (0, 255)
    zb = rng.choice(ZERO_POINTS, n if per_column else ()).astype(np.uint8)
    node = helper.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])
    graph = helper.make_graph(
        [node],
        "matmul_integer",
        [
            helper.make_tensor_value_info("a", TensorProto.UINT8, ["s", 5, k]),
            helper.make_tensor_value_info("za", TensorProto.UINT8, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(zb, "zb")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _ort(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feed)[0]


def _split_fires(g: Graph, op: type) -> bool:
    """Whether the device's optimizer split the step (two integer steps where there was one)."""
    before = sum(isinstance(g[v].op, op) for v in g.values())
    o = optimize(g, Device.cpu().optimizer_settings())
    return sum(isinstance(o[v].op, op) for v in o.values()) == 2 * before


def _split_expected() -> bool:
    """What the device asks for, whatever this CPU is: the split where it splits at all and its
    int8 steps take 8-bit weights (VNNI; oneDNN present, integer convolutions on)."""
    s = Device.cpu().optimizer_settings()
    return s.split_int_weights and s.qdq_weight_bits == 8


@pytest.mark.parametrize(("c", "k", "groups"), [(5, 7, 1), (6, 9, 3), (8, 8, 8)])
@pytest.mark.parametrize("per_channel", [False, True])
def test_conv_integer_with_full_range_uint8_weights(
    c: int, k: int, groups: int, per_channel: bool
) -> None:
    """Against onnxruntime per tensor; per filter (which onnxruntime's ConvInteger refuses:
    "Non per-tensor quantization is not supported") against the reference executor."""
    rng = _rng("conv", c, k, groups, per_channel)
    model = _conv_model(rng, c, k, groups, per_channel)
    x = rng.integers(0, 256, (2, c, 9, 7)).astype(np.uint8)
    x[0, :, :3] = 255  # the extremes, over whole windows: the largest sums either way
    x[1, :, :3] = 0
    g = load_onnx(model)
    want = evaluate(g, [x])[0]
    if not per_channel:
        assert np.array_equal(_ort(model, {"x": x}), want)
    (got,) = Device.cpu(threads=2).prepare(g).eval([x])
    assert got.dtype == np.int32 and np.array_equal(got, want)
    # VNNI: every u8 weight minus 128 is an exact int8 weight; without it only 7-bit ones are
    assert _split_fires(g, IntConv) == _split_expected()
    if _split_expected():
        assert onednn.available() is None and onednn.has_vnni()


@pytest.mark.parametrize("per_column", [False, True])
def test_matmul_integer_with_full_range_uint8_weights(per_column: bool) -> None:
    rng = _rng("matmul", per_column)
    model = _matmul_model(rng, 70, 33, per_column)
    a = rng.integers(0, 256, (3, 5, 70)).astype(np.uint8)
    a[0, 0], a[0, 1] = 255, 0  # whole rows at the extremes
    za = np.array(201, np.uint8)
    want = _ort(model, {"a": a, "za": za})
    g = load_onnx(model)
    (got,) = Device.cpu(threads=2).prepare(g).eval([a, za])
    assert got.dtype == np.int32 and np.array_equal(got, want)
    assert _split_fires(g, IntMatMul) == _split_expected()


@pytest.mark.parametrize("bits", [7, 8])
def test_the_split_graph_computes_the_same_integers(bits: int) -> None:
    """On the reference executor, whatever the machine: the rewrite is exact where it fires
    (8 bits), and does not fire where the int8 weights would not fit either (7 bits)."""
    g = Graph()
    x = g.input(Shape.of(2, 4, 6, 6), DType.U8, "x")
    rng = _rng("reference", bits)
    w = rng.integers(0, 256, (6, 4, 3, 3)).astype(np.uint8)
    w.reshape(-1)[0] = 255  # 255 - 100 does not fit int8: the single step cannot take them
    y = g.int_conv(
        x, g.constant(w), g.scalar(250, DType.U8), g.constant(np.full(6, 100, np.uint8)),
        [1, 1], [1, 1], [1, 1], 1,
    )  # fmt: skip
    g.add_output(y, "y")
    feed = [rng.integers(0, 256, (2, 4, 6, 6)).astype(np.uint8)]
    o = optimize(g, OptimizerSettings(split_int_weights=True, qdq_weight_bits=bits))
    convs = sum(isinstance(o[v].op, IntConv) for v in o.values())
    assert convs == (2 if bits == 8 else 1)
    assert np.array_equal(evaluate(o, feed)[0], evaluate(g, feed)[0])
