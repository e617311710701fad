"""The fixture corpus (tests/models) for the planner tests and the memory benchmark."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from kn_graph.cpu import bind_inputs
from kn_graph.graph import Graph

MODELS = Path(__file__).parent.parent / "models"
FIXTURES: list[dict] = json.loads((MODELS / "manifest.json").read_text())["fixtures"]


@functools.cache
def load(name: str) -> Graph:
    from kn_graph.onnx import load_onnx  # imports onnx: only when a fixture is needed

    fx = next(f for f in FIXTURES if f["name"] == name)
    return load_onnx(MODELS / fx["file"])


def datasets(name: str) -> list[tuple[dict[str, np.ndarray], dict[str, int]]]:
    """(inputs by name, bound symbols) per data set: batch 1 and batch > 1."""
    fx = next(f for f in FIXTURES if f["name"] == name)
    graph = load(name)
    data = np.load(MODELS / fx["reference"])
    out = []
    for k in range(len(fx["datasets"])):
        feed = {n: data[f"in{k}:{n}"] for n in graph.input_names}
        _, binds = bind_inputs(graph, feed)
        out.append((feed, binds))
    return out
