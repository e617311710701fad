"""A ReLU (max with a scalar) before a max pool moves after it: the same values bit for bit,
NaN and infinities included; on the product too, against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from kn_graph import DType, Graph, Shape, Size
from kn_graph.onnx import load_onnx
from kn_graph.optimizer import optimize
from kn_graph.optimizer.patterns import scalar
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_graph.optimizer.util import assert_same, only, op_counts

POOL = only("max_through_pool")
B = Size.sym("B")


def _feed(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[:4] = [np.nan, np.inf, -np.inf, -0.0]  # NaN spreads, -inf meets the clamp
    return x


@pytest.mark.parametrize("c", [0.0, -0.5, 6.0])
def test_relu_then_max_pool_pools_first(c: float) -> None:
    g = Graph()
    x = g.input(Shape.of(B, 3, 8, 6), DType.F32, "x")
    g.add_output(g.pool(g.maximum(x, c), "max", (2, 2), (2, 2)), "y")
    o = optimize(g, POOL)
    (y,) = o.outputs
    assert o[y].shape == g[g.outputs[0]].shape
    op = o[y].op
    assert op.NAME == "binary" and scalar(o, op.inputs[1]) == c  # the clamp is last
    xs = _feed((2, 3, 8, 6))
    want, got = evaluate(g, [xs])[0], evaluate(o, [xs])[0]
    np.testing.assert_array_equal(got, want)  # NaN in the same places: array_equal's rule


def test_overlapping_windows_and_3x3_taps() -> None:
    g = Graph()
    x = g.input(Shape.of(1, 2, 9, 9), DType.F32, "x")
    g.add_output(g.pool(g.relu(x), "max", (3, 3), (1, 1)), "y")
    o = optimize(g, POOL)
    assert op_counts(o)["max"] == 9  # 8 for the taps, 1 clamp
    assert_same(g, o, inputs=[_feed((1, 2, 9, 9), 1)])


def test_a_relu_used_elsewhere_or_a_padded_pool_stays() -> None:
    g = Graph()
    x = g.input(Shape.of(1, 2, 8, 8), DType.F32, "x")
    r = g.relu(x)
    g.add_output(g.pool(r, "max", (2, 2), (2, 2)), "pooled")
    g.add_output(r, "relu")  # also an output: moving the clamp would add a pass
    assert str(optimize(g, POOL)) == str(optimize(g, only()))
    h = Graph()
    x = h.input(Shape.of(1, 2, 8, 8), DType.F32, "x")  # padded with -inf: taps of a pad
    h.add_output(h.pool(h.relu(x), "max", (3, 3), (1, 1), ((1, 1), (1, 1))), "y")
    assert str(optimize(h, POOL)) == str(optimize(h, only()))
    k = Graph()  # an average pool: add, not max
    x = k.input(Shape.of(1, 2, 8, 8), DType.F32, "x")
    k.add_output(k.pool(k.relu(x), "avg", (2, 2), (2, 2)), "y")
    assert str(optimize(k, POOL)) == str(optimize(k, only()))


def test_conv_relu_max_pool_export_against_onnxruntime() -> None:
    """Conv -> Relu -> MaxPool as exporters write it (speechmos' P.808 and the VGG family), on
    Device.cpu(), NaN in the input included."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    vi = helper.make_tensor_value_info
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "g",
            [vi("x", TensorProto.FLOAT, ["N", 3, 16, 12])],
            [vi("y", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(w, "w")],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    raw = model.SerializeToString()
    g = load_onnx(raw)
    o = optimize(g)
    assert op_counts(o)["max"] == op_counts(optimize(g, only()))["max"]  # moved, not added
    x = rng.standard_normal((2, 3, 16, 12)).astype(np.float32)
    want = ort.InferenceSession(raw, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    prepared = Device.cpu().prepare(g)
    np.testing.assert_allclose(prepared.eval([x])[0], want, rtol=1e-5, atol=1e-5)
    x[0, 0, 5, 5] = np.nan  # NaN as the reference keeps it (onnxruntime's fused conv drops it)
    got, ref = prepared.eval([x])[0], evaluate(g, [x])[0]
    assert np.isnan(ref).any() and np.array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [DType.I32, DType.I64, DType.F16])
def test_integer_and_half_pools_at_their_extremes_on_the_cpu_backend(dtype: DType) -> None:
    """max(x, -3) before a 2x2 max pool, over the dtype's extremes, on Device.cpu() against the
    unoptimized graph on the reference."""
    g = Graph()
    x = g.input(Shape.of(1, 2, 6, 4), dtype, "x")
    g.add_output(g.pool(g.maximum(x, -3), "max", (2, 2), (2, 2)), "y")
    o = optimize(g, POOL)
    assert scalar(o, o[o.outputs[0]].op.inputs[1]) == -3  # the clamp is last
    rng = np.random.default_rng(4)
    info = np.iinfo(dtype.np) if dtype.is_int else np.finfo(dtype.np)
    xs = rng.integers(-6, 6, (1, 2, 6, 4)).astype(dtype.np)
    xs.reshape(-1)[:4] = [info.min, info.max, info.min, -4]  # a window of extremes
    if not dtype.is_int:
        xs.reshape(-1)[8:10] = [np.nan, -np.inf]
    want = evaluate(g, [xs])[0]
    np.testing.assert_array_equal(evaluate(o, [xs])[0], want)
    np.testing.assert_array_equal(Device.cpu().prepare(g).eval([xs])[0], want)
