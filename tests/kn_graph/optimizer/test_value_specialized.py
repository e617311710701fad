"""`optimize` of a `ValueSpecializedModel` (a model whose shapes depend on input values): a copy
whose graphs are optimized as they are made, which `Device.prepare` runs like the model itself."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from kn_graph.errors import ArgumentTypeError
from kn_graph.onnx import ValueSpecializedModel, load_onnx
from kn_graph.optimizer import OptimizerSettings, optimize
from kn_runtime import Device

RNG = np.random.default_rng(11)
W = RNG.standard_normal(6).astype(np.float32)


def _reshape_by_input_model() -> onnx.ModelProto:
    """relu(reshape((x·w + w)·2, shape)): the affine chain is what the optimizer fuses, the
    Reshape target is a graph input, so the output shape depends on its value."""
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "w"], ["a"]),
        helper.make_node("Mul", ["a", "two"], ["s"]),
        helper.make_node("Reshape", ["s", "shape"], ["r"]),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "reshape_by_input",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(W, "w"),
            numpy_helper.from_array(np.array([2.0], np.float32), "two"),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _feeds() -> list[dict[str, np.ndarray]]:
    x4 = RNG.standard_normal((4, 6)).astype(np.float32)
    x2 = RNG.standard_normal((2, 6)).astype(np.float32)
    return [
        {"x": x4, "shape": np.array([3, 8], np.int64)},
        {"x": x4, "shape": np.array([-1, 2], np.int64)},
        {"x": x2, "shape": np.array([0, -1], np.int64)},  # 0: keep that axis (n is 2)
        {"x": x4, "shape": np.array([3, 8], np.int64)},  # the first value again: cached
    ]


@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
def test_optimized_value_specialized_model_matches_onnxruntime(reference: bool) -> None:
    model = _reshape_by_input_model()
    loaded = load_onnx(model.SerializeToString())
    assert isinstance(loaded, ValueSpecializedModel)
    opt = optimize(loaded)
    assert isinstance(opt, ValueSpecializedModel) and opt is not loaded
    prepared = Device.cpu(reference=reference).prepare(opt)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in _feeds():
        (want,) = sess.run(None, feed)
        (got,) = prepared.eval(feed)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_specializations_are_optimized_as_they_are_made() -> None:
    loaded = load_onnx(_reshape_by_input_model().SerializeToString())
    assert isinstance(loaded, ValueSpecializedModel)
    opt = optimize(loaded)
    values = {"shape": np.array([3, 8], np.int64)}
    plain = loaded.specialize(values)
    assert str(opt.specialize(values)) == str(optimize(plain))
    assert len(opt.specialize(values)) < len(plain)  # (x·w + w)·2: one scale and one bias
    assert opt.specialize(values) is opt.specialize(values)  # cached per value
    assert loaded.specialize(values) is plain  # the model passed in is unchanged
    assert not loaded.optimizations and "optimized" in repr(opt)


def test_settings_and_repeated_optimize_apply_in_order() -> None:
    loaded = load_onnx(_reshape_by_input_model().SerializeToString())
    assert isinstance(loaded, ValueSpecializedModel)
    off = OptimizerSettings(fuse_affine=False)
    twice = optimize(optimize(loaded, off))
    assert twice.optimizations == (off, OptimizerSettings())
    values = {"shape": np.array([-1, 4], np.int64)}
    want = optimize(optimize(loaded.specialize(values), off))
    assert str(twice.specialize(values)) == str(want)


def test_optimize_of_something_else_is_our_error() -> None:
    with pytest.raises(ArgumentTypeError, match="expected a Graph or a ValueSpecializedModel"):
        optimize("model.onnx")  # type: ignore[call-overload]
