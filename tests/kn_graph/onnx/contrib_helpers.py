"""Helpers of the com.microsoft contrib op tests: one-node models in onnxruntime's domain, run
through our loader on the reference executor and on Device.cpu(), against onnxruntime (or a
NumPy oracle for the ops that onnxruntime implements only on GPUs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from kn_graph.graph import Graph
from kn_graph.onnx import load_onnx
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_graph.onnx.helpers import model, reference
from tests.kn_graph.onnx.nn_helpers import assert_close

MS = "com.microsoft"


def rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def ms_model(
    op: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str] = ("y",),
    *,
    order: Sequence[str] | None = None,
    domain: str = MS,
    inits: Mapping[str, np.ndarray] | None = None,
    **attrs: object,
) -> onnx.ModelProto:
    """One node of `op` reading `order` (default: the inputs, then the initializers; "" skips an
    optional input) in a model that imports com.microsoft version 1."""
    names = list(order) if order is not None else [*inputs, *(inits or {})]
    node = helper.make_node(op, names, list(outputs), domain=domain, **attrs)
    return model([node], inputs, outputs, inits=inits, opset=17, domains={MS: 1})


def ours_everywhere(m: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> list[list[np.ndarray]]:
    """Our results on the reference executor and on Device.cpu()."""
    g = load_onnx(m)
    assert isinstance(g, Graph)
    args = [feed[n] for n in g.input_names]
    ref = evaluate(g, dict(zip(g.input_names, args, strict=True)))
    return [ref, Device.cpu().prepare(g).eval(args)]


def check(
    m: onnx.ModelProto,
    feed: Mapping[str, np.ndarray],
    want: Sequence[np.ndarray] | None = None,
    *,
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> None:
    """Both of our executors equal `want` (default: onnxruntime's results) in dtype, shape and
    value."""
    expected = list(want) if want is not None else reference(m, feed)
    for got in ours_everywhere(m, feed):
        assert_close(got, expected, rtol, atol)
