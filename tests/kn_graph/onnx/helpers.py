"""Helpers of the elementwise and reduction op tests: build a small ONNX model, run it through
our loader and CPU executor, and compare with onnxruntime."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from kn_graph.onnx import load_onnx
from kn_graph.reference import evaluate
from kn_runtime import Device


def model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str] = ("y",),
    *,
    inits: Mapping[str, np.ndarray] | None = None,
    dims: Mapping[str, Sequence[int | str]] | None = None,
    opset: int = 18,
    domains: Mapping[str, int] | None = None,
    contrib: bool = False,
) -> onnx.ModelProto:
    """A graph of `nodes`; `domains` adds operator sets besides ONNX's, `contrib` imports
    onnxruntime's com.microsoft domain (version 1)."""
    dims = dims or {}
    ins = [
        helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(a.dtype), list(dims.get(n, a.shape))
        )
        for n, a in inputs.items()
    ]
    outs = [onnx.ValueInfoProto(name=n) for n in outputs if n]
    init = [numpy_helper.from_array(np.asarray(a), n) for n, a in (inits or {}).items()]
    g = helper.make_graph(list(nodes), "g", ins, outs, initializer=init)
    domains = dict(domains or {})
    if contrib:
        domains.setdefault("com.microsoft", 1)
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in domains.items()]
    return helper.make_model(g, opset_imports=opsets, ir_version=10)


def node(
    op: str,
    inputs: Sequence[str],
    outputs: Sequence[str] = ("y",),
    domain: str | None = None,
    **attrs: object,
) -> onnx.NodeProto:
    return helper.make_node(op, list(inputs), list(outputs), domain=domain, **attrs)


def ours(m: onnx.ModelProto, feed: Mapping[str, np.ndarray], **load: object) -> list[np.ndarray]:
    g = load_onnx(m, **load)  # type: ignore[arg-type]
    return evaluate(g, {n: feed[n] for n in g.input_names})


def on_cpu(m: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The model loaded and run by the product's CPU device (compiled C, oneDNN)."""
    g = load_onnx(m)
    return Device.cpu().prepare(g).eval({n: feed[n] for n in g.input_names})


def reference(m: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(a) for a in sess.run(None, dict(feed))]


def check(
    m: onnx.ModelProto, feed: Mapping[str, np.ndarray], rtol: float = 1e-5, atol: float = 1e-6
) -> None:
    """Ours equals onnxruntime in dtype, shape and value."""
    for got, want in zip(ours(m, feed), reference(m, feed), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape, (
            got.dtype,
            got.shape,
            want.dtype,
            want.shape,
        )
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
