"""The fixture corpus (real architectures with random weights, tests/models/make_models.py):
each model loads once with its dynamic dims symbolic and matches onnxruntime's reference outputs
at every data set (two different bindings of the dims for dynamic exports)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kn_graph.onnx import ValueSpecializedModel, load_onnx
from kn_graph.reference import evaluate
from kn_runtime import Device

MODELS = Path(__file__).parent / "models"
MANIFEST = json.loads((MODELS / "manifest.json").read_text())
FIXTURES = MANIFEST["fixtures"]
REL_TOL = 1e-4


def test_corpus_is_not_empty() -> None:
    assert len(FIXTURES) >= 8, [f["name"] for f in FIXTURES]


@pytest.mark.parametrize("fx", FIXTURES, ids=[f["name"] for f in FIXTURES])
def test_fixture_matches_onnxruntime(fx: dict) -> None:
    loaded = load_onnx(MODELS / fx["file"])  # once: every data set runs on what it returns
    data = np.load(MODELS / fx["reference"])
    if isinstance(loaded, ValueSpecializedModel):
        # shapes decided by input values: the runtime loads one graph per distinct value
        prepared = Device.cpu().prepare(loaded)
        for k in range(len(fx["datasets"])):
            feed = {n: data[f"in{k}:{n}"] for n in loaded.input_names}
            _compare(fx, k, fx["output_names"], prepared.eval(feed), data)
        return
    graph = loaded
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
        _compare(fx, k, graph.output_names, evaluate(graph, feed), data)


def _compare(fx: dict, k: int, names: list[str], outs: list[np.ndarray], data) -> None:
    for name, got in zip(names, outs, strict=True):
        ref = data[f"out{k}:{name}"]
        assert got.shape == ref.shape and got.dtype == ref.dtype, (name, got.shape, ref.shape)
        scale = float(np.max(np.abs(ref))) or 1.0
        err = float(np.max(np.abs(got.astype(np.float64) - ref))) / scale
        assert err <= REL_TOL, f"{fx['name']} data set {k} output {name}: max rel diff {err:.3g}"
