"""Recurrent layers over symbolic (or long) sequences, per-batch sequence lengths in every
direction (constants and data), and ReverseSequence with data lengths: against onnxruntime, on
the reference executor and on Device.cpu()."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from kn_graph.errors import ShapeMismatchError
from kn_graph.onnx import load_onnx
from kn_graph.onnx.handlers import rnn
from kn_graph.onnx.specialized import ValueSpecializedModel
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_graph.onnx.nn_helpers import assert_close, onnxruntime, rand
from tests.kn_graph.onnx.rnn_helpers import (
    F32,
    IN,
    B,
    H,
    check_feeds,
    recurrences,
    recurrent_model,
)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_symbolic_sequence_runs_as_one_recurrence_per_direction(op: str, direction: str) -> None:
    model = recurrent_model(op, direction, "seq")
    g = check_feeds(model, [{"x": rand(n, B, IN)} for n in (1, 3, 7)])
    assert recurrences(g) == (2 if direction == "bidirectional" else 1)


def test_long_fixed_sequence_runs_as_a_recurrence(monkeypatch: pytest.MonkeyPatch) -> None:
    """Longer than RNN_MAX_UNROLL (made 3 here): a recurrence op, not an unrolled graph."""
    monkeypatch.setattr(rnn, "RNN_MAX_UNROLL", 3)
    model = recurrent_model("LSTM", "bidirectional", 5, attrs={"clip": 0.8})
    g = check_feeds(model, [{"x": rand(5, B, IN)}])
    assert recurrences(g) == 2


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("steps", [4, "seq"])
def test_sequence_lengths_shorter_than_the_sequence(
    op: str, direction: str, steps: int | str
) -> None:
    """Constant lengths: outputs past a row's length are 0, Y_h/Y_c the state at its last valid
    step; the reverse direction runs over each row's valid prefix reversed."""
    lens = np.array([4, 2, 1], np.int32)
    model = recurrent_model(op, direction, steps, lens=lens)
    check_feeds(model, [{"x": rand(4, B, IN)}])


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("steps", [5, "seq"])
def test_sequence_lengths_from_data(direction: str, steps: int | str) -> None:
    model = recurrent_model("LSTM", direction, steps, data_lens=True)
    feeds = [
        {"x": rand(5, B, IN), "lens": np.array([2, 5, 1], np.int32)},
        {"x": rand(5, B, IN), "lens": np.array([5, 3, 4], np.int32)},
    ]
    check_feeds(model, feeds)


def test_gru_layout_1_sequence_lengths_on_the_reference() -> None:
    """onnxruntime lacks layout 1: the same model in layout 0 is the oracle."""
    lens = np.array([3, 1, 2], np.int32)
    m0 = recurrent_model("GRU", "bidirectional", 3, lens=lens)
    x = rand(3, B, IN)
    want = onnxruntime(m0, {"x": x})
    m1 = onnx.ModelProto()
    m1.CopyFrom(m0)
    m1.graph.node[0].attribute.append(helper.make_attribute("layout", 1))
    m1.graph.input[0].CopyFrom(helper.make_tensor_value_info("x", F32, [B, 3, IN]))
    h0 = next(t for t in m1.graph.initializer if t.name == "h0")
    h0.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(h0).transpose(1, 0, 2), "h0"))
    got = evaluate(load_onnx(m1), {"x": x.transpose(1, 0, 2).copy()})
    assert_close(got, [want[0].transpose(2, 0, 1, 3), want[1].transpose(1, 0, 2)], 1e-4, 1e-5)


# -- ReverseSequence --------------------------------------------------------------------------------
@pytest.mark.parametrize(("batch_axis", "time_axis"), [(1, 0), (0, 1)])
@pytest.mark.parametrize("steps", [6, "t"])
def test_reverse_sequence_with_data_lengths(
    batch_axis: int, time_axis: int, steps: int | str
) -> None:
    dims: list[int | str] = [0, 0, 2]
    dims[batch_axis], dims[time_axis] = 4, steps
    node = helper.make_node(
        "ReverseSequence", ["x", "l"], ["y"], batch_axis=batch_axis, time_axis=time_axis
    )
    ins = [
        helper.make_tensor_value_info("x", F32, dims),
        helper.make_tensor_value_info("l", onnx.TensorProto.INT64, [4]),
    ]
    graph = helper.make_graph([node], "g", ins, [onnx.ValueInfoProto(name="y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    shape = [4, 6, 2] if batch_axis == 0 else [6, 4, 2]
    feeds = [
        {"x": rand(*shape), "l": np.array([6, 0, 3, 1], np.int64)},
        {"x": rand(*shape), "l": np.array([2, 5, 6, 4], np.int64)},
    ]
    check_feeds(model, feeds)


# -- LSTM inside an If branch (silero VAD) ----------------------------------------------------------
def _node_graph(
    name: str, nodes: list[onnx.NodeProto], out: str, **inits: np.ndarray
) -> onnx.GraphProto:
    init = [numpy_helper.from_array(a, n) for n, a in inits.items()]
    return helper.make_graph(nodes, name, [], [onnx.ValueInfoProto(name=out)], initializer=init)


def _lstm_branch(name: str, squeezed: bool) -> onnx.GraphProto:
    """A branch running an LSTM (weights of its own) and returning Y_h [1, B, H]. `squeezed`
    (silero VAD v5's decoder): X is Unsqueeze(If(seq == 1, Squeeze(x, 0), x), 0), of rank 3 only
    when seq is 1."""
    nodes = []
    x = "x"
    if squeezed:
        nodes = [
            helper.make_node("Shape", ["x"], [f"{name}_s"], start=0, end=1),
            helper.make_node("Equal", [f"{name}_s", "one"], [f"{name}_c1"]),
            helper.make_node("Squeeze", [f"{name}_c1"], [f"{name}_c"]),
            helper.make_node(
                "If",
                [f"{name}_c"],
                [f"{name}_x"],
                then_branch=_node_graph(
                    "sq", [helper.make_node("Squeeze", ["x", "zero"], ["sq_x"])], "sq_x"
                ),
                else_branch=_node_graph(
                    "id", [helper.make_node("Identity", ["x"], ["id_x"])], "id_x"
                ),
            ),
            helper.make_node("Unsqueeze", [f"{name}_x", "zero"], [f"{name}_x3"]),
        ]
        x = f"{name}_x3"
    ws = {"w": rand(1, 4 * H, IN) * 0.5, "r": rand(1, 4 * H, H) * 0.5, "b": rand(1, 8 * H) * 0.5}
    inits = {f"{name}_{k}": a for k, a in ws.items()}
    nodes.append(
        helper.make_node("LSTM", [x, *inits], ["", f"{name}_h"], hidden_size=H, name=f"{name}_lstm")
    )
    consts = {"one": np.array([1], np.int64), "zero": np.array([0], np.int64)}
    return _node_graph(name, nodes, f"{name}_h", **inits, **(consts if squeezed else {}))


def _if_model(squeezed_else: bool) -> onnx.ModelProto:
    """y = If(flag, LSTM(x), LSTM'(x or its squeezed form)) over x [seq, B, IN]; flag is data."""
    node = helper.make_node(
        "If",
        ["flag"],
        ["y"],
        then_branch=_lstm_branch("then", False),
        else_branch=_lstm_branch("else", squeezed_else),
    )
    ins = [
        helper.make_tensor_value_info("x", F32, ["seq", B, IN]),
        helper.make_tensor_value_info("flag", onnx.TensorProto.BOOL, []),
    ]
    graph = helper.make_graph([node], "g", ins, [onnx.ValueInfoProto(name="y")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_lstm_over_a_symbolic_length_inside_an_if_branch() -> None:
    """Silero VAD v4: an LSTM over (samples+448)//512 steps in a branch of a data If."""
    feeds = [
        {"x": rand(n, B, IN), "flag": np.array(f)} for n, f in ((1, True), (4, False), (6, True))
    ]
    check_feeds(_if_model(False), feeds)


def test_a_branch_that_cannot_run_for_these_shapes_fails_only_when_taken() -> None:
    """Silero VAD v5 (its 'rank 3 expected, found [1,1,1,128,2]'): the decoder squeezes the time
    axis when it is 1, a condition on sizes whose branches differ in rank, so the model is
    loaded per input shape; for seq > 1 the else branch gives its LSTM a rank-4 X. onnxruntime
    runs only the taken branch; so do we, and taking the bad one raises, naming the node."""
    model = _if_model(True)
    loaded = load_onnx(model)
    assert isinstance(loaded, ValueSpecializedModel)
    good = [(3, True), (1, False), (1, True)]
    for device in (Device.cpu(reference=True), Device.cpu()):
        prepared = device.prepare(loaded)
        for n, flag in good:
            feed = {"x": rand(n, B, IN), "flag": np.array(flag)}
            assert_close(prepared.eval(feed), onnxruntime(model, feed), 1e-4, 1e-5)
        bad = {"x": rand(3, B, IN), "flag": np.array(False)}
        with pytest.raises(ShapeMismatchError, match=r"else branch cannot run.*else_lstm.*rank 3"):
            prepared.eval(bad)
