"""Nodes out of topological order load as onnxruntime runs them: sorted on load (float16
converters append their input casts at the end of the node list), subgraph captures of outer
names included; a real cycle is our error naming the nodes on it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from kn_graph.errors import OnnxImportError
from kn_graph.onnx import load_onnx
from kn_graph.onnx.order import topological_order
from kn_runtime import Device
from tests.kn_graph.onnx.helpers import check, node, reference


def _model(nodes: list[onnx.NodeProto], elem: int = TensorProto.FLOAT) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", elem, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_input_casts_appended_at_the_end_like_a_float16_converter() -> None:
    """The shape of onnxconverter-common's float16 output: the graph input is cast to f16 by a
    node listed after the nodes that read it."""
    nodes = [
        node("Relu", ["graph_input_cast_0"], ["r"], name="/conv_in/Relu"),
        node("Mul", ["r", "r"], ["m"], name="/mul"),
        node("Cast", ["m"], ["y"], to=TensorProto.FLOAT, name="graph_output_cast_0"),
        node(
            "Cast", ["x"], ["graph_input_cast_0"], to=TensorProto.FLOAT16, name="graph_input_cast_0"
        ),
    ]
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    x[0, 1] = np.nan
    check(_model(nodes), {"x": x}, rtol=1e-3, atol=1e-3)
    m = _model(nodes)
    want = reference(m, {"x": x})[0]
    got = Device.cpu().prepare(load_onnx(m)).eval([x])[0]  # the product, NaN kept
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def test_a_subgraph_capture_orders_its_node_after_the_producer() -> None:
    then = helper.make_graph(
        [node("Neg", ["late"], ["t"])], "then", [], [helper.make_tensor_value_info("t", 1, None)]
    )
    other = helper.make_graph(
        [node("Abs", ["late"], ["e"])], "else", [], [helper.make_tensor_value_info("e", 1, None)]
    )
    nodes = [
        node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if"),
        node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
        node("Greater", ["s", "zero"], ["c"], name="cond"),
        node("Sigmoid", ["x"], ["late"], name="late"),
        node("Constant", [], ["zero"], value_float=0.0, name="zero"),
    ]
    for x in (np.ones((2, 3), np.float32), -np.ones((2, 3), np.float32)):
        check(_model(nodes), {"x": x})


def test_a_sorted_list_is_kept_as_it_is() -> None:
    nodes = [node("Neg", ["x"], ["a"]), node("Relu", ["x"], ["b"]), node("Add", ["a", "b"], ["y"])]
    assert topological_order(nodes) is nodes


def test_ties_keep_the_list_order() -> None:
    nodes = [
        node("Add", ["a", "b"], ["y"], name="add"),
        node("Relu", ["x"], ["b"], name="b"),
        node("Neg", ["x"], ["a"], name="a"),
    ]
    assert [n.name for n in topological_order(nodes)] == ["b", "a", "add"]


def test_a_cycle_is_our_error_naming_its_nodes() -> None:
    nodes = [
        node("Add", ["x", "q"], ["p"], name="first"),
        node("Relu", ["p"], ["q"], name="second"),
        node("Identity", ["p"], ["y"], name="out"),
    ]
    with pytest.raises(OnnxImportError, match=r"cycle.*'first' \(Add\) waits for 'q'"):
        load_onnx(_model(nodes))
