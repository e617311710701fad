"""The fixture corpus (tests/models) for the planner tests and the memory benchmark."""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np

from kn_graph.binding import bind_inputs
from kn_graph.graph import Graph
from tests.paths import MODELS

FIXTURES: list[dict] = json.loads((MODELS / "manifest.json").read_text())["fixtures"]


@functools.cache
def model(name: str) -> Any:
    """What `load_onnx` returns: a Graph, or a ValueSpecializedModel (shapes from input values)."""
    from kn_graph.onnx import load_onnx  # imports onnx: only when a fixture is needed

    fx = next(f for f in FIXTURES if f["name"] == name)
    return load_onnx(MODELS / fx["file"])


def _feed(name: str, k: int) -> dict[str, np.ndarray]:
    fx = next(f for f in FIXTURES if f["name"] == name)
    data = np.load(MODELS / fx["reference"])
    return {n.removeprefix(f"in{k}:"): data[n] for n in data.files if n.startswith(f"in{k}:")}


def graph_for(name: str, k: int) -> Graph:
    """The graph of data set k (the same one for every data set unless values decide shapes)."""
    m = model(name)
    return m if isinstance(m, Graph) else m.specialize(_feed(name, k))


def load(name: str) -> Graph:
    return graph_for(name, 0)


def cases(name: str) -> list[tuple[Graph, dict[str, np.ndarray], dict[str, int]]]:
    """(graph, inputs by name, bound symbols) per data set (batch 1 and batch > 1)."""
    fx = next(f for f in FIXTURES if f["name"] == name)
    out = []
    for k in range(len(fx["datasets"])):
        graph = graph_for(name, k)
        full = _feed(name, k)
        feed = {n: full[n] for n in graph.input_names}
        _, binds = bind_inputs(graph, feed)
        out.append((graph, feed, binds))
    return out


def datasets(name: str) -> list[tuple[dict[str, np.ndarray], dict[str, int]]]:
    """(inputs by name, bound symbols) of the data sets that `load(name)`'s graph runs."""
    first = load(name)
    return [(feed, binds) for g, feed, binds in cases(name) if g is first]


def fixture_plans(name: str) -> list[Any]:
    """Every plan the fixture makes, as given and optimized, per data set: one plan per graph,
    or for a data-dependent graph one per segment and binding (found by running it through the
    emulator segment by segment)."""
    from kn_cuda_eval import emulate, plan
    from kn_cuda_eval.planning.segments import Segment, SegmentedRunner
    from kn_graph.optimizer import optimize

    out: list[Any] = []

    def run_segment(seg: Segment, arrays: Any, binds: Any) -> list[np.ndarray]:
        p = plan(seg.graph, bindings=dict(binds))
        out.append(p)
        return emulate(p, [np.asarray(a) for a in arrays])

    runner = SegmentedRunner(run_segment)
    for graph, feed, binds in cases(name):
        for g in (graph, optimize(graph)):
            if g.has_dynamic:
                runner.run(g, feed)
            else:
                out.append(plan(g, bindings=binds))
    return out
