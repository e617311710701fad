"""Loader behaviour that is not one op: symbolic dims, shape tensors, external data, long chains."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from kn_graph.cpu import evaluate
from kn_graph.onnx import load_onnx
from kn_graph.ops import View
from kn_graph.shape import Shape, Size


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_batch_axes_unify_into_b_and_other_dims_stay_named() -> None:
    m = _model(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch_size", "seq"]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", "seq"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    g = load_onnx(m)
    B, S = Size.sym("B"), Size.sym("seq")
    assert [g[v].shape for v in g.inputs] == [Shape.of(B, S), Shape.of(B, S)]
    pinned = load_onnx(m, dims={"seq": 7})
    assert pinned[pinned.inputs[0]].shape == Shape.of(B, 7)
    given = load_onnx(m, input_shapes={"a": [2, 3], "b": [2, 3]})
    assert given[given.inputs[1]].shape == Shape.of(2, 3)


def test_shape_tensor_reshape_becomes_symbolic_view() -> None:
    """Reshape(x, Concat(Shape(x)[0:1], [-1])) is a View keeping the batch symbol."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "one"], ["s0"]),
        helper.make_node("Concat", ["s0", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(v, np.int64), n)
        for n, v in [("zero", [0]), ("one", [1]), ("minus1", [-1])]
    ]
    m = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    g = load_onnx(m)
    out = g.outputs[0]
    assert isinstance(g[out].op, View)
    assert g[out].shape == Shape.of(Size.sym("B"), 12)
    x = np.arange(2 * 12, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(evaluate(g, [x])[0], x.reshape(2, 12))


def test_external_data_loads(tmp_path) -> None:
    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    m = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    onnx.save_model(
        m, tmp_path / "m.onnx", save_as_external_data=True, location="w.bin", size_threshold=0
    )
    g = load_onnx(tmp_path / "m.onnx")
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(evaluate(g, [x])[0], x @ w, rtol=1e-5)


def test_bfloat16_initializer_becomes_f32() -> None:
    vals = np.array([1.5, -2.0, 0.15625], np.float32)
    t = helper.make_tensor("c", TensorProto.BFLOAT16, [3], vals.tolist())
    m = _model(
        [helper.make_node("Identity", ["c"], ["y"])],
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [t],
    )
    g = load_onnx(m)
    np.testing.assert_array_equal(evaluate(g, [])[0], vals)


def test_5000_node_chain_loads_and_evaluates() -> None:
    n = 5000
    nodes = [
        helper.make_node("Add" if i % 2 else "Relu", [f"t{i}", "one"][: 1 + i % 2], [f"t{i + 1}"])
        for i in range(n)
    ]
    m = _model(
        nodes,
        [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    g = load_onnx(m)
    assert len(g) > n
    x = np.array([-3.0, 0.0, 1.0, 2.0], np.float32)
    np.testing.assert_array_equal(evaluate(g, [x])[0], np.maximum(x, 0) + n // 2)
