"""The real-export check of the contrib operators: onnxruntime's transformer optimizer fuses the
BERT and GPT-2 fixtures (tests/models) into Attention, EmbedLayerNormalization,
SkipLayerNormalization, BiasGelu and FastGelu; the fused model, generated here into tmp_path,
loads and matches onnxruntime on the fixture's stored inputs, on our reference executor and on
Device.cpu().

The second test saves what onnxruntime's own session optimizer makes of the fixtures (basic and
extended levels: FusedMatMul, FusedGemm, BiasGelu, FastGelu), as a user does with
`SessionOptions.optimized_model_filepath`, and checks that model the same way."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.transformers import optimizer

from kn_graph.graph import Graph
from kn_graph.onnx import load_onnx
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_graph.onnx.nn_helpers import assert_close

MODELS = Path(__file__).resolve().parents[2] / "models"


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
    name: str, model_type: str, fused: set[str], tmp_path: Path
) -> None:
    path = MODELS / f"{name}.onnx"
    # the fixtures' sizes (tests/models/manifest.json): hidden 64, 4 heads
    opt = optimizer.optimize_model(
        str(path), model_type=model_type, num_heads=4, hidden_size=64, opt_level=0
    )
    out = tmp_path / f"{name}_fused.onnx"
    opt.save_model_to_file(str(out))
    m = onnx.load(str(out))
    ops = {n.op_type for n in m.graph.node if n.domain == "com.microsoft"}
    assert fused <= ops, f"the optimizer fused only {sorted(ops)}"
    _check(m, _feeds(name))  # padded rows in the second case: masks reach Attention


@pytest.mark.parametrize("name", ["bert_ts", "gpt2_ts"])
@pytest.mark.parametrize(
    "level",
    [ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED],
)
def test_session_optimized_fixture_matches_onnxruntime(
    name: str, level: ort.GraphOptimizationLevel, tmp_path: Path
) -> None:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.optimized_model_filepath = str(tmp_path / f"{name}_opt.onnx")
    ort.InferenceSession(str(MODELS / f"{name}.onnx"), so, providers=["CPUExecutionProvider"])
    m = onnx.load(so.optimized_model_filepath)
    if level == ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED:
        ops = {n.op_type for n in m.graph.node if n.domain == "com.microsoft"}
        assert "FusedMatMul" in ops, sorted(ops)
    _check(m, _feeds(name))


def _check(m: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> None:
    """The model on the reference executor and Device.cpu() against onnxruntime, per feed."""
    g = load_onnx(m)
    assert isinstance(g, Graph)
    prepared = Device.cpu().prepare(g)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds:
        want = [np.asarray(a) for a in sess.run(None, feed)]
        args = [feed[n] for n in g.input_names]
        assert_close(evaluate(g, dict(zip(g.input_names, args, strict=True))), want, 1e-4, 1e-5)
        assert_close(prepared.eval(args), want, 1e-4, 1e-5)
