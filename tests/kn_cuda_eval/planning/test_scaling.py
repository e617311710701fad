"""Large graphs plan, validate and emulate like the CPU executor: a 3,000-op elementwise chain
(split into kernels of at most `max_kernel_ops`), a general graph of 2,000 values. Lazy values
share their DAGs; the packer and the validator agree with brute force. Speed is measured by
benchmarks/plan_scaling.py, not asserted here."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from kn_cuda_eval import PlanSettings, StridedView, emulate, plan
from kn_cuda_eval.planning import memory as mem
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.emulator_ops import eval_program
from kn_cuda_eval.planning.lazy import Lazy, combine
from kn_cuda_eval.planning.memory import Buffer, BufferKind, align, pack
from kn_cuda_eval.planning.program import Bin, Un
from kn_cuda_eval.planning.validate import _check_buffers
from kn_graph import BinaryOp, DType, Graph, Shape, UnaryOp
from kn_graph.errors import PlanError
from kn_graph.reference import evaluate
from tests.kn_cuda_eval.big_graphs import chain_graph, general_graph, inputs_for
from tests.kn_cuda_eval.helpers import assert_close, check_plan


def _elementwise(p) -> list[st.Elementwise]:  # type: ignore[no-untyped-def]
    return [s for s in p.steps if isinstance(s, st.Elementwise)]


def test_a_3000_op_chain_plans_validates_and_matches_the_cpu_executor() -> None:
    g = chain_graph(3000)
    plans = check_plan(g, inputs_for(g, 2), 2)
    kernels = _elementwise(plans[0])
    assert len(kernels) == math.ceil(3000 / PlanSettings().max_kernel_ops), plans[0]
    assert all(k.program.cost <= PlanSettings().max_kernel_ops for k in kernels)


def test_a_general_graph_of_2000_values_matches_the_cpu_executor() -> None:
    g = general_graph(2000)
    (p, _) = check_plan(g, inputs_for(g, 3), 3)
    kinds = {type(s).__name__ for s in p.steps}
    assert {"Conv", "MatMul", "Softmax", "Reduce", "Elementwise"} <= kinds, kinds


@pytest.mark.parametrize("cap", [1, 7, 64])
def test_a_chain_is_split_into_kernels_of_at_most_max_kernel_ops(cap: int) -> None:
    g = chain_graph(95)
    (p,) = check_plan(
        g, inputs_for(g, 2), 2, optimized=False, settings=PlanSettings(max_kernel_ops=cap)
    )
    kernels = _elementwise(p)
    assert len(kernels) == math.ceil(95 / cap)
    assert max(k.program.cost for k in kernels) == min(cap, 95)


def test_wide_sums_respect_the_cap_too() -> None:
    # a balanced tree of adds over 16 chains: every operand is lazy, the sum is capped
    g = Graph()
    x = g.input(Shape.of(3, 5), DType.F32, "x")
    parts = []
    for k in range(16):
        y = x
        for j in range(6):
            y = g.mul(g.add(y, 0.1 * (k + 1)), 0.9) if j % 2 else g.unary(UnaryOp.SIN, y)
        parts.append(y)
    while len(parts) > 1:
        parts = [g.add(a, b) for a, b in zip(parts[::2], parts[1::2], strict=True)]
    g.add_output(parts[0], "y")
    (p,) = check_plan(
        g, inputs_for(g, 1), optimized=False, settings=PlanSettings(max_kernel_ops=20)
    )
    assert all(k.program.cost <= 20 for k in _elementwise(p))


def test_an_iota_shared_through_a_permute_keeps_both_views() -> None:
    # one lazy iota seen as itself and transposed: the same DAG node with two different views
    g = Graph()
    x = g.input(Shape.of(4, 4), DType.F32, "x")
    i = g.iota(Shape.of(4, 4), 0)  # lazy and free: stays lazy for both of its users
    both = g.add(g.mul(i, g.scalar(10, DType.I64)), g.permute(i, [1, 0]))
    y = g.add(x, g.cast(both, DType.F32))
    g.add_output(y, "y")
    g.add_output(g.sub(g.permute(y, [1, 0]), y), "z")
    (p, _) = check_plan(g, [np.zeros((4, 4), np.float32)])
    (k, *_) = _elementwise(p)
    assert len(k.indices) == 2, p  # one node, two index views


def test_a_lazy_value_through_views_shares_its_nodes() -> None:
    v = StridedView.dense(256, (2, 3), DType.F32)
    a = combine([Lazy.of_view(v)], (2, 3), Un(UnaryOp.EXP, 0, DType.F32))
    t = a.map((3, 2), lambda w: w.permute((1, 0)))
    assert t is not None and t.root is a.root and t.cost == a.cost == 1
    assert t.to_expr().inputs == (v.permute((1, 0)),)
    # the flat program equals what splicing gave: loads in first-use order, duplicates merged
    b = combine([t, Lazy.of_view(v.permute((1, 0)))], (3, 2), Bin(BinaryOp.MUL, 0, 0, DType.F32))
    e = b.to_expr()
    assert e.program.format() == "mul(exp(ld0), ld0)" and len(e.inputs) == 1


def test_eval_program_releases_intermediate_values() -> None:
    g = chain_graph(40)
    (p,) = [plan(g, 1)]
    (k,) = _elementwise(p)
    loads = [np.ones(k.shape, np.float32)]
    vals = eval_program(k.program, loads, [])
    alive = [i for i, v in enumerate(vals) if v.size]
    assert set(k.program.roots) <= set(alive) and len(alive) <= 3, alive


def test_packer_neighbour_lists_and_full_scans_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    for _ in range(10):
        n = int(rng.integers(1, 300))
        sizes = [int(s) for s in rng.integers(0, 1 << 20, n)]
        starts = rng.integers(0, 100, n)
        ranges = [(int(a), int(a + rng.integers(0, 30))) for a in starts]
        fast = pack(sizes, ranges)
        with monkeypatch.context() as m:
            m.setattr(mem, "_MAX_PAIRS", -1)  # force the NumPy scan
            assert pack(sizes, ranges) == fast


def _brute_force_clash(bufs: list[Buffer]) -> bool:
    for i, a in enumerate(bufs):
        for b in bufs[:i]:
            if (
                a.size
                and b.size
                and a.offset < b.end
                and b.offset < a.end
                and a.first <= b.last
                and b.first <= a.last
            ):
                return True
    return False


def test_the_validator_sweep_finds_exactly_the_overlaps_brute_force_finds() -> None:
    rng = np.random.default_rng(12)
    found = 0
    for _ in range(300):
        n = int(rng.integers(1, 25))
        bufs = []
        for k in range(n):
            first = int(rng.integers(0, 20))
            bufs.append(
                Buffer(
                    f"b{k}",
                    BufferKind.TEMP,
                    256 * int(rng.integers(1, 40)),
                    int(rng.integers(0, 3)) * 256 * int(rng.integers(1, 4)),
                    first,
                    first + int(rng.integers(0, 6)),
                )
            )
        p = plan(chain_graph(1), 1)
        broken = dataclasses.replace(
            p, buffers=tuple(bufs), arena_size=1 << 20, workspace_offset=256
        )
        clash = _brute_force_clash(bufs)
        found += clash
        if clash:
            with pytest.raises(PlanError, match="overlap"):
                _check_buffers(broken)
        else:
            _check_buffers(broken)
    assert 30 < found < 270, found  # both outcomes exercised


def test_plans_of_the_long_chain_stay_small_in_memory() -> None:
    p = plan(chain_graph(3000), 2)
    rep = p.memory_report()
    # kernels hand their result to the next: two buffers alive at a time, whatever the length
    assert rep.workspace_size <= 3 * align(2 * 4 * 8 * 4), rep


def test_the_chain_emulates_like_the_cpu_executor_at_several_batches() -> None:
    g = chain_graph(600)
    for b in (1, 4):
        xs = inputs_for(g, b, seed=b)
        assert_close(emulate(plan(g, b), xs)[0], evaluate(g, xs)[0], f"batch {b}")
