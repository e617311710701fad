"""Every fixture model, unoptimized and optimized, at batch 1 and batch > 1: the plan validates,
the emulator matches the CPU executor, every kernel compiles for sm_80 and sm_90, and the arena's
workspace is within 10 % of its lower bound."""

from __future__ import annotations

import pytest

from kn_cuda_eval import plan
from kn_cuda_eval.planning.segments import Segment, split
from kn_graph.errors import PlanError
from kn_graph.optimizer import optimize
from tests.kn_cuda_eval.corpus import FIXTURES, cases, datasets, load
from tests.kn_cuda_eval.helpers import check_plan

MAX_RATIO = 1.10


@pytest.mark.parametrize("name", [f["name"] for f in FIXTURES])
def test_fixture_plan_matches_cpu(name: str) -> None:
    for graph, feed, binds in cases(name):
        for p in check_plan(graph, feed, bindings=binds):
            rep = p.memory_report()
            assert rep.ratio <= MAX_RATIO, f"{name} {binds}: workspace {rep.summary()}"


@pytest.mark.parametrize("name", [f["name"] for f in FIXTURES])
def test_fixture_plans_at_a_large_batch(name: str) -> None:
    """Planning (not emulating) at batch 64 exercises the memory planner at realistic sizes."""
    graph = load(name)
    _, binds = datasets(name)[-1]
    g = optimize(graph)
    big = {**binds, "B": 64} if "B" in binds else binds
    if g.has_dynamic:  # later segments need run-time sizes: plan the first one at batch 64
        with pytest.raises(PlanError, match="data-dependent ops"):
            plan(g, bindings=big)
        first = next(s for s in split(g).stages if isinstance(s, Segment))
        assert first.symbols <= big.keys(), (first.symbols, big)
        g = first.graph
    p = plan(g, bindings=big)
    p.validate()
    assert p.memory_report().ratio <= MAX_RATIO
