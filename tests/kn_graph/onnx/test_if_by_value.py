"""An If whose branches give outputs of different ranks, on a condition computed from an input's
value (Silero VAD v5/v6: `If(sr == 16000)` with a 16 kHz and an 8 kHz branch): no one graph holds
both, so the model is specialized on the input's value (one graph per value, as a Reshape to an
input's value is), and each value runs the branch onnxruntime runs (issue 21)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from kn_graph.errors import UnknownOperatorError, UnsupportedOnnxError
from kn_graph.onnx import ValueSpecializedModel, load_onnx
from kn_runtime import Device


def _branch(name: str, nodes: list[onnx.NodeProto], out: str) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, 1, None)])


def _model() -> onnx.ModelProto:
    """sr == 16000: x * 2 as [1, n]; else: x + 1 as [1, n, 1] (ranks 2 and 3)."""
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [2])
    then_b = _branch("hi", [helper.make_node("Mul", ["x", "two"], ["t"])], "t")
    else_b = _branch(
        "lo",
        [
            helper.make_node("Add", ["x", "one"], ["a"]),
            helper.make_node("Constant", [], ["ax"], value=axes),
            helper.make_node("Unsqueeze", ["a", "ax"], ["e"]),
        ],
        "e",
    )
    nodes = [
        helper.make_node("Equal", ["sr", "rate"], ["c"]),
        helper.make_node("If", ["c"], ["r"], then_branch=then_b, else_branch=else_b, name="rate"),
        helper.make_node("Neg", ["r"], ["y"]),
    ]
    inits = [
        helper.make_tensor("rate", TensorProto.INT64, [], [16000]),
        helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
        helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_branches_of_different_ranks_specialize_on_the_conditions_input() -> None:
    m = _model()
    loaded = load_onnx(m)
    assert isinstance(loaded, ValueSpecializedModel) and loaded.value_inputs == ["sr"]
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for device in (Device.cpu(reference=True), Device.cpu(threads=1)):
        prepared = device.prepare(loaded)
        for sr, n in ((16000, 5), (8000, 3), (16000, 2)):
            feed = {"x": rng.standard_normal((1, n)).astype(np.float32), "sr": np.array(sr)}
            (want,) = sess.run(None, feed)
            (got,) = prepared.eval(feed)
            assert got.shape == want.shape, (sr, got.shape, want.shape)
            np.testing.assert_array_equal(got, want)


def test_branches_of_different_ranks_on_a_data_condition_are_refused_clearly() -> None:
    """A condition from data (not an input's value) cannot pick a graph: our error says why."""
    m = _model()
    cond = m.graph.node[0]
    cond.CopyFrom(helper.make_node("Greater", ["x0", "zero"], ["c"]))
    m.graph.node.insert(0, helper.make_node("ReduceSum", ["x"], ["x0"], keepdims=0))
    m.graph.initializer.append(helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]))
    with pytest.raises(UnsupportedOnnxError, match=r"'rate' \(If\).*ranks 2 and 3"):
        load_onnx(m)


def test_an_operator_we_lack_in_a_branch_that_may_never_run_still_fails_the_load() -> None:
    """A branch that cannot be built for these shapes fails only when taken (as onnxruntime
    runs only the taken branch); an operator without a handler fails the load wherever it is,
    as onnxruntime fails at session creation."""
    m = _model()
    m.graph.node[0].CopyFrom(helper.make_node("Greater", ["x0", "zero"], ["c"]))
    m.graph.node.insert(0, helper.make_node("ReduceSum", ["x"], ["x0"], keepdims=0))
    m.graph.initializer.append(helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]))
    branch = next(a.g for a in m.graph.node[2].attribute if a.name == "else_branch")
    branch.node[0].op_type = "NoSuchOp"
    with pytest.raises(UnknownOperatorError, match="NoSuchOp"):
        load_onnx(m)
