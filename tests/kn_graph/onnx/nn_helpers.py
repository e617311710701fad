"""Helpers of the neural-network op tests: build a one-node ONNX model, load it with our loader,
evaluate it with the CPU executor and compare with onnxruntime (or a NumPy reference)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from kn_graph.graph import Graph
from kn_graph.onnx import load_onnx
from kn_graph.reference import evaluate

Dims = Sequence[int | str]
RNG = np.random.default_rng(1234)


def rand(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def node_model(
    op_type: str,
    inputs: Mapping[str, np.ndarray],
    attrs: Mapping[str, object] | None = None,
    *,
    inits: Mapping[str, np.ndarray] | None = None,
    outputs: Sequence[str] = ("y",),
    order: Sequence[str] | None = None,
    dims: Mapping[str, Dims] | None = None,
    opset: int = 18,
) -> onnx.ModelProto:
    """One node reading `order` (default: inputs then initializers; "" skips an optional one)."""
    inits = dict(inits or {})
    dims = dims or {}
    names = list(order) if order is not None else [*inputs, *inits]
    node = helper.make_node(op_type, names, list(outputs), **dict(attrs or {}))
    ins = [
        helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(a.dtype), list(dims.get(n, a.shape))
        )
        for n, a in inputs.items()
    ]
    init = [numpy_helper.from_array(np.asarray(a), n) for n, a in inits.items()]
    outs = [onnx.ValueInfoProto(name=n) for n in outputs if n]
    g = helper.make_graph([node], "g", ins, outs, initializer=init)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type for v in inferred.graph.value_info}
    for o in model.graph.output:
        if o.name in types:
            o.type.CopyFrom(types[o.name])
    return model


def ours(
    model: onnx.ModelProto, feed: Mapping[str, np.ndarray], **load: object
) -> list[np.ndarray]:
    g = load_onnx(model, **load)  # type: ignore[arg-type]
    return evaluate(g, {n: feed[n] for n in g.input_names})


def onnxruntime(model: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(a) for a in sess.run(None, dict(feed))]


def onnx_reference(model: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The ONNX reference implementation: the oracle of the backend tests, where ORT differs."""
    from onnx.reference import ReferenceEvaluator

    return [np.asarray(a) for a in ReferenceEvaluator(model).run(None, dict(feed))]


def assert_close(
    got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: float, atol: float
) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def check_ort(
    op_type: str,
    inputs: Mapping[str, np.ndarray],
    attrs: Mapping[str, object] | None = None,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    **kw: object,
) -> Graph:
    """Compare our result of a one-node model with onnxruntime's; returns our graph."""
    model = node_model(op_type, inputs, attrs, **kw)  # type: ignore[arg-type]
    assert_close(ours(model, inputs), onnxruntime(model, inputs), rtol, atol)
    return load_onnx(model)


def check_reference(
    op_type: str,
    inputs: Mapping[str, np.ndarray],
    attrs: Mapping[str, object] | None = None,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    **kw: object,
) -> None:
    """Compare our result of a one-node model with the ONNX reference implementation's."""
    model = node_model(op_type, inputs, attrs, **kw)  # type: ignore[arg-type]
    assert_close(ours(model, inputs), onnx_reference(model, inputs), rtol, atol)


def check_numpy(
    op_type: str,
    inputs: Mapping[str, np.ndarray],
    want: Sequence[np.ndarray],
    attrs: Mapping[str, object] | None = None,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    **kw: object,
) -> None:
    """Compare our result of a one-node model with values computed in NumPy."""
    model = node_model(op_type, inputs, attrs, **kw)  # type: ignore[arg-type]
    assert_close(ours(model, inputs), want, rtol, atol)
