"""Bugs the fuzzer (`python -m tests.fuzz`) found, each reduced to a tiny ONNX graph: the product
`Device.cpu()` against the reference `Device.cpu(reference=True)` (outputs compared as the fuzzer
compares them: `tests.fuzz.compare.difference`), or the loader raising one of our errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from kn_graph.errors import UnsupportedOnnxError
from kn_graph.onnx import load_onnx
from kn_runtime import Device
from tests.fuzz.compare import difference


def _model(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    opset: int = 17,
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def check_against_reference(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> None:
    loaded = load_onnx(model)
    want = Device.cpu(reference=True).prepare(loaded).eval(feed)
    got = Device.cpu(1).prepare(loaded).eval(feed)
    diff = difference(got, want)
    assert diff is None, diff


def test_scan_of_a_scalar_is_our_error() -> None:
    # fuzz seed 0 case 701: the scan input swapped with the state, a scalar: IndexError
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "x"], ["s2"]), helper.make_node("Identity", ["s2"], ["y"])],
        "body",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, []) for n in ("s", "x")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, []) for n in ("s2", "y")],
    )
    node = helper.make_node("Scan", ["s0", "xs"], ["s_out", "ys"], body=body, num_scan_inputs=1)
    model = _model(
        [node],
        [
            helper.make_tensor_value_info("s0", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("xs", TensorProto.FLOAT, []),
        ],
        [
            helper.make_tensor_value_info("s_out", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("ys", TensorProto.FLOAT, None),
        ],
    )
    with pytest.raises(UnsupportedOnnxError, match="scan input 0 is a scalar"):
        load_onnx(model)
