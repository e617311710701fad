"""The fixture corpus (real architectures with random weights, tests/models/make_models.py):
each model loads once with its dynamic dims symbolic and matches onnxruntime's reference outputs
at every data set (two different bindings of the dims for dynamic exports)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kn_graph.cpu import evaluate
from kn_graph.onnx import load_onnx

MODELS = Path(__file__).parent / "models"
MANIFEST = json.loads((MODELS / "manifest.json").read_text())
FIXTURES = MANIFEST["fixtures"]
REL_TOL = 1e-4


def test_corpus_is_not_empty() -> None:
    assert len(FIXTURES) >= 8, [f["name"] for f in FIXTURES]


@pytest.mark.parametrize("fx", FIXTURES, ids=[f["name"] for f in FIXTURES])
def test_fixture_matches_onnxruntime(fx: dict) -> None:
    graph = load_onnx(MODELS / fx["file"])
    data = np.load(MODELS / fx["reference"])
    if fx["dynamic_dims"]:
        symbolic = [
            n
            for n, v in zip(graph.input_names, graph.inputs, strict=True)
            if graph[v].shape.symbols
        ]
        assert symbolic, (
            f"{fx['name']}: dynamic dims {fx['dynamic_dims']} were not loaded as symbols"
        )
    assert len(fx["datasets"]) >= (2 if fx["dynamic_dims"] else 1)
    for k in range(len(fx["datasets"])):
        feed = {n: data[f"in{k}:{n}"] for n in graph.input_names}
        outs = evaluate(graph, feed)
        for name, got in zip(graph.output_names, outs, strict=True):
            ref = data[f"out{k}:{name}"]
            assert got.shape == ref.shape and got.dtype == ref.dtype, (name, got.shape, ref.shape)
            scale = float(np.max(np.abs(ref))) or 1.0
            err = float(np.max(np.abs(got.astype(np.float64) - ref))) / scale
            assert err <= REL_TOL, (
                f"{fx['name']} data set {k} output {name}: max rel diff {err:.3g}"
            )
