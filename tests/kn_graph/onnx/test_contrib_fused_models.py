"""The real-export check of the contrib operators: onnxruntime's transformer optimizer fuses the
BERT and GPT-2 fixtures (tests/models) into Attention, EmbedLayerNormalization,
SkipLayerNormalization, BiasGelu and FastGelu; the fused model, generated here into tmp_path,
loads and matches onnxruntime on the fixture's stored inputs, on our reference executor and on
Device.cpu().

The optimizer asks onnxruntime's symbolic shape inference for edge shapes and types, which needs
sympy (not a dependency of ours); `RunShapes` answers the same questions from one onnxruntime run
of the unfused model (every edge made an output), so the fusions themselves are onnxruntime's."""

from __future__ import annotations

import collections
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper
from onnxruntime.transformers import optimizer

from kn_graph.graph import Graph
from kn_graph.onnx import load_onnx
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_graph.onnx.nn_helpers import assert_close

MODELS = Path(__file__).resolve().parents[2] / "models"


class RunShapes:
    """Stands in for onnxruntime's SymbolicShapeInferenceHelper: the concrete shape and element
    type of every edge of one run; an edge made by a fusion is unknown (None), as it would be to
    a failed inference, which makes a fusion skip its optional shape checks or decline."""

    def __init__(self, edges: Mapping[str, tuple[list[int], int]]) -> None:
        self.edges = dict(edges)
        known = {
            name: helper.make_tensor_value_info(name, elem, [None] * len(shape))
            for name, (shape, elem) in edges.items()
        }
        self.known_vi_ = collections.defaultdict(onnx.ValueInfoProto, known)

    def infer(self, *args: object, **kwargs: object) -> bool:
        return True

    def get_edge_shape(self, name: str) -> list[int] | None:
        return self.edges[name][0] if name in self.edges else None

    def compare_shape(self, a: str, b: str) -> bool:
        sa, sb = self.get_edge_shape(a), self.get_edge_shape(b)
        return sa is not None and sa == sb


def _edges(path: Path, feed: Mapping[str, np.ndarray]) -> dict[str, tuple[list[int], int]]:
    m = onnx.load(str(path))
    have = {o.name for o in m.graph.output}
    for n in m.graph.node:
        m.graph.output.extend(onnx.ValueInfoProto(name=o) for o in n.output if o and o not in have)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = sess.run(None, dict(feed))
    arrays = {o.name: np.asarray(a) for o, a in zip(sess.get_outputs(), outs, strict=True)}
    arrays |= dict(feed)
    return {n: (list(a.shape), helper.np_dtype_to_tensor_dtype(a.dtype)) for n, a in arrays.items()}


def _feeds(name: str) -> list[dict[str, np.ndarray]]:
    z = np.load(MODELS / f"{name}.npz")
    cases = sorted({k.split(":")[0] for k in z.files if k.startswith("in")})
    return [{k.split(":")[1]: z[k] for k in z.files if k.startswith(f"{c}:")} for c in cases]


@pytest.mark.parametrize(
    ("name", "model_type", "fused"),
    [
        (
            "bert_ts",
            "bert",
            {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu"},
        ),
        ("gpt2_ts", "gpt2", {"SkipLayerNormalization", "FastGelu"}),
    ],
)
def test_optimizer_fused_fixture_matches_onnxruntime(
    name: str, model_type: str, fused: set[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = MODELS / f"{name}.onnx"
    feeds = _feeds(name)  # padded rows in the second case: masks reach Attention
    edges = _edges(path, feeds[-1])
    onnx_model = sys.modules["onnx_model"]  # the optimizer's own import of its helper module
    monkeypatch.setattr(
        onnx_model.OnnxModel, "infer_runtime_shape", lambda self, *a, **k: RunShapes(edges)
    )
    # the fixtures' sizes (tests/models/manifest.json): hidden 64, 4 heads
    opt = optimizer.optimize_model(
        str(path), model_type=model_type, num_heads=4, hidden_size=64, opt_level=0
    )
    out = tmp_path / f"{name}_fused.onnx"
    opt.save_model_to_file(str(out))
    m = onnx.load(str(out))
    ops = {n.op_type for n in m.graph.node if n.domain == "com.microsoft"}
    assert fused <= ops, f"the optimizer fused only {sorted(ops)}"
    g = load_onnx(m)
    assert isinstance(g, Graph)
    prepared = Device.cpu().prepare(g)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds:
        want = [np.asarray(a) for a in sess.run(None, feed)]
        args = [feed[n] for n in g.input_names]
        assert_close(evaluate(g, dict(zip(g.input_names, args, strict=True))), want, 1e-4, 1e-5)
        assert_close(prepared.eval(args), want, 1e-4, 1e-5)
