"""Ops whose ONNX definition needs sizes equal, ordered or divisible, on symbolic sizes: they load
with a guard (checked at every binding, as onnxruntime checks them per run) instead of refusing,
equal onnxruntime on the reference executor and on `Device.cpu()` where the guard holds, and give
our error naming the node and the sizes where it does not (issue 21)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from kn_graph.errors import InputMismatchError, UnsupportedOnnxError
from kn_graph.onnx import load_onnx
from kn_runtime import Device

RNG = np.random.default_rng(0)
DEVICES = (Device.cpu(reference=True), Device.cpu(threads=1))


def _model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Mapping[str, tuple[int, list[int | str]]],
    outputs: Sequence[str],
) -> onnx.ModelProto:
    ins = [helper.make_tensor_value_info(n, t, d) for n, (t, d) in inputs.items()]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs]
    graph = helper.make_graph(list(nodes), "g", ins, outs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _agrees(model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]]) -> None:
    """One load (symbolic sizes), every feed equal to onnxruntime on both executors."""
    graph = load_onnx(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for device in DEVICES:
        prepared = device.prepare(graph)
        for feed in feeds:
            want = sess.run(None, dict(feed))
            got = prepared.eval(dict(feed))
            for g, w in zip(got, want, strict=True):
                assert g.shape == w.shape, (device, g.shape, w.shape)
                np.testing.assert_array_equal(g, w)


def _split(n: int) -> onnx.ModelProto:
    outs = [f"y{i}" for i in range(n)]
    node = helper.make_node("Split", ["x"], outs, axis=1, num_outputs=n, name="chunks")
    return _model([node], {"x": (TensorProto.FLOAT, [2, "S"])}, outs)


def test_split_num_outputs_of_a_symbolic_axis_has_a_smaller_last_chunk() -> None:
    """opset 18's `num_outputs`: chunks of ceil(S/n), the last one smaller or empty; it used to
    need S divisible by n ("requires S-3*(S//3) == 0" at S=7)."""
    feeds = [{"x": RNG.standard_normal((2, s)).astype(np.float32)} for s in (7, 9, 5, 4, 3)]
    _agrees(_split(3), feeds)


def test_split_of_a_symbolic_axis_too_short_for_its_chunks_is_our_error() -> None:
    """1 into 3 would need an empty middle chunk (ceil(1/3) = 1, then -1 left for the last)."""
    graph = load_onnx(_split(3))
    with pytest.raises(InputMismatchError, match=r"'chunks' \(Split\).*S=1"):
        Device.cpu().prepare(graph).eval([np.zeros((2, 1), np.float32)])


def test_split_of_a_fixed_axis_into_more_chunks_than_fit_keeps_an_empty_one() -> None:
    """4 into 3 is 2, 2 and 0 for onnxruntime; it used to be refused."""
    outs = ["a", "b", "c"]
    node = helper.make_node("Split", ["x"], outs, axis=0, num_outputs=3)
    model = _model([node], {"x": (TensorProto.FLOAT, [4])}, outs)
    _agrees(model, [{"x": np.arange(4, dtype=np.float32)}])


def _gather_elements() -> onnx.ModelProto:
    node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1, name="pick")
    inputs = {"x": (TensorProto.FLOAT, ["B", "S"]), "i": (TensorProto.INT64, ["C", "K"])}
    return _model([node], inputs, ["y"])


def test_gather_elements_indices_with_their_own_symbols_fit_in_the_data() -> None:
    """Indices [C, K] of data [B, S] on axis 1: C <= B is a guard, not 'do not fit'."""
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    feeds = [
        {"x": x, "i": np.array([[0, 4], [3, -1]], np.int64)},  # C = 2 < B = 3
        {"x": x, "i": RNG.integers(-5, 5, (3, 7)).astype(np.int64)},  # C = B, K > S
    ]
    _agrees(_gather_elements(), feeds)


def test_gather_elements_indices_longer_than_the_data_is_our_error() -> None:
    graph = load_onnx(_gather_elements())
    x, i = np.zeros((2, 5), np.float32), np.zeros((3, 1), np.int64)
    with pytest.raises(InputMismatchError, match=r"'pick' \(GatherElements\).*B=2.*C=3"):
        Device.cpu().prepare(graph).eval({"x": x, "i": i})


def test_gather_elements_indices_longer_than_fixed_data_is_refused_at_load() -> None:
    node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)
    inputs = {"x": (TensorProto.FLOAT, [2, 5]), "i": (TensorProto.INT64, [3, 1])}
    with pytest.raises(UnsupportedOnnxError, match="do not fit in data"):
        load_onnx(_model([node], inputs, ["y"]))


def test_gather_nd_batch_axes_named_differently_are_one_axis() -> None:
    """batch_dims=1 with data [B, S, D] and indices [C, K, 1]: B and C are one axis (the
    loader unifies them), where it used to refuse 'do not address data'."""
    node = helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=1)
    inputs = {"x": (TensorProto.FLOAT, ["B", "S", "D"]), "i": (TensorProto.INT64, ["C", "K", 1])}
    feeds = [
        {
            "x": RNG.standard_normal((b, 5, 3)).astype(np.float32),
            "i": RNG.integers(-5, 5, (b, k, 1)).astype(np.int64),
        }
        for b, k in ((2, 4), (1, 1), (3, 6))
    ]
    _agrees(_model([node], inputs, ["y"]), feeds)
