"""Helpers of the recurrent-layer tests: one RNN/GRU/LSTM node with weights, bias and initial
states, checked against onnxruntime on the reference executor and on Device.cpu()."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from kn_graph.graph import Graph
from kn_graph.onnx import load_onnx
from kn_graph.ops import Dynamic
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_graph.onnx.nn_helpers import assert_close, onnxruntime

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
B, IN, H = 3, 5, 6
F32, I32 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT32


def _outputs(op: str) -> list[str]:
    return ["y", "y_h", "y_c"] if op == "LSTM" else ["y", "y_h"]


def recurrent_model(
    op: str,
    direction: str,
    steps: int | str,
    *,
    lens: np.ndarray | None = None,
    data_lens: bool = False,
    peepholes: bool = False,
    dtype: type = np.float32,
    attrs: dict[str, object] | None = None,
    seed: int = 0,
) -> onnx.ModelProto:
    """One RNN/GRU/LSTM node over x [steps, B, IN] (steps a dim_param when a string), with bias
    and initial states; sequence_lens an initializer (`lens`) or a graph input (`data_lens`);
    LSTM peepholes when asked; x, weights and states of `dtype`. The weights come from their
    own generator (`seed`), so a model is the same whichever tests ran before."""
    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op] * H
    inits = {
        "w": rand(dirs, g, IN) * 0.5,
        "r": rand(dirs, g, H) * 0.5,
        "b": rand(dirs, 2 * g) * 0.5,
        "h0": rand(dirs, B, H),
    }
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    ins = [helper.make_tensor_value_info("x", elem, [steps, B, IN])]
    if data_lens:
        ins.append(helper.make_tensor_value_info("lens", I32, [B]))
    elif lens is not None:
        inits["lens"] = lens
    order = ["x", "w", "r", "b", "lens" if data_lens or lens is not None else "", "h0"]
    if op == "LSTM":
        inits["c0"] = rand(dirs, B, H)
        order.append("c0")
        if peepholes:
            inits["p"] = rand(dirs, 3 * H) * 0.5
            order.append("p")
    inits = {n: a if n == "lens" else a.astype(dtype) for n, a in inits.items()}
    node = helper.make_node(
        op, order, _outputs(op), hidden_size=H, direction=direction, **(attrs or {})
    )
    outs = [onnx.ValueInfoProto(name=n) for n in _outputs(op)]
    init = [numpy_helper.from_array(a, n) for n, a in inits.items()]
    graph = helper.make_graph([node], "g", ins, outs, initializer=init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def sequence(steps: int, seed: int = 1, scale: float = 1.0) -> np.ndarray:
    """An input x [steps, B, IN] of its own generator (the same whatever ran before)."""
    return (np.random.default_rng(seed).standard_normal((steps, B, IN)) * scale).astype(np.float32)


def check_feeds(
    model: onnx.ModelProto,
    feeds: Sequence[dict[str, np.ndarray]],
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> Graph:
    """One loaded graph, every feed: reference and Device.cpu() against onnxruntime."""
    g = load_onnx(model)
    assert isinstance(g, Graph)
    prepared = Device.cpu().prepare(g)
    for feed in feeds:
        want = onnxruntime(model, feed)
        assert_close(evaluate(g, {n: feed[n] for n in g.input_names}), want, rtol, atol)
        assert_close(prepared.eval([feed[n] for n in g.input_names]), want, rtol, atol)
    return g


def recurrences(g: Graph) -> int:
    """How many Dynamic recurrence ops the graph holds (each has one value per result)."""
    ops = [i.op for i in g.value_infos()]
    return sum(
        1 for op in ops if isinstance(op, Dynamic) and op.kind == "recurrence" and op.output == 0
    )
