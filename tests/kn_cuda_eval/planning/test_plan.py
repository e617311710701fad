"""The plan object: its printout, memory report, validator (which must catch broken plans),
the packer against its lower bound, view arithmetic, and planning speed on the largest fixture."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from kn_cuda_eval import BufferKind, StridedView, emulate, plan
from kn_cuda_eval.planning.memory import align, lower_bound, pack
from kn_cuda_eval.planning.view import coalesce, reshape_strides
from kn_graph import DType, Graph, ReduceOp, Shape, Size
from kn_graph.errors import PlanError
from kn_graph.optimizer import optimize
from tests.kn_cuda_eval.corpus import FIXTURES, datasets, load

B = Size.sym("B")


def _mlp() -> Graph:
    g = Graph()
    x = g.input(Shape.of(B, 8), DType.F32, "x")
    rng = np.random.default_rng(6)
    w1 = g.constant(rng.standard_normal((8, 16)).astype(np.float32))
    w2 = g.constant(rng.standard_normal((16, 4)).astype(np.float32))
    h = g.relu(g.matmul_nd(x, w1))
    g.add_output(g.softmax(g.matmul_nd(h, w2), 1), "p")
    return g


def test_plan_prints_one_line_per_step() -> None:
    p = plan(_mlp(), 2)
    text = str(p)
    lines = text.splitlines()
    assert lines[0].startswith("plan: 4 steps, arena ")
    assert lines[1] == "inputs:  x f32[2,8]:(8,1)@" + str(p.inputs[0].offset)
    kinds = [ln.split()[1] for ln in lines[2:-1]]
    assert kinds == ["matmul", "elementwise", "matmul", "softmax"], text
    assert "gemm NN m=16 n=2 k=8" in lines[2]
    assert lines[-1].startswith("outputs: p f32[2,4]")


def test_memory_report_lists_buffers_and_totals() -> None:
    p = plan(_mlp(), 5)
    rep = p.memory_report()
    text = str(rep)
    assert "const" in text and "temp" in text and "input" in text
    assert rep.workspace_size >= rep.lower_bound > 0
    assert rep.naive_size >= rep.workspace_size
    assert rep.const_size == align(8 * 16 * 4) + align(16 * 4 * 4)
    assert f"ratio {rep.ratio:.3f}" in rep.summary()


def _break(p, **changes):
    return dataclasses.replace(p, **changes)


def test_validate_catches_overlapping_live_buffers() -> None:
    p = plan(_mlp(), 2)
    p.validate()
    temps = [b for b in p.buffers if b.kind is BufferKind.TEMP]
    a, b = next(
        (a, b)
        for a in temps
        for b in temps
        if a is not b and a.first <= b.last and b.first <= a.last
    )
    bad = [dataclasses.replace(x, offset=a.offset) if x is b else x for x in p.buffers]
    with pytest.raises(PlanError, match="overlap"):
        _break(p, buffers=tuple(bad)).validate()


def test_validate_catches_views_outside_the_arena_and_in_place_writes() -> None:
    p = plan(_mlp(), 2)
    with pytest.raises(PlanError, match=r"outside the arena|in no buffer"):
        _break(p, arena_size=p.arena_size - 256).validate()
    s = p.steps[1]  # the relu: make it write over its own operand
    evil = dataclasses.replace(s, outputs=(s.inputs[0],))
    with pytest.raises(PlanError, match="over its operand"):
        _break(p, steps=(p.steps[0], evil, *p.steps[2:])).validate()


def test_emulator_notices_a_wrong_offset() -> None:
    """The point of the emulator: a plan that reads the wrong bytes gives a wrong answer, even
    where validation cannot tell (here the relu reads a live constant instead of its input)."""
    p = plan(_mlp(), 2)
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    good = emulate(p, [x])[0]
    s = p.steps[1]
    const = next(b for b in p.buffers if b.kind is BufferKind.CONST)
    moved = dataclasses.replace(s, inputs=(s.inputs[0].with_offset(const.offset),))
    bad = emulate(_break(p, steps=(p.steps[0], moved, *p.steps[2:])), [x])[0]
    assert not np.allclose(good, bad, equal_nan=True)


def test_emulator_and_executor_refuse_a_plan_that_fails_validation() -> None:
    from tests.kn_cuda_eval.helpers import run_fake

    p = plan(_mlp(), 2)
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    s = p.steps[1]  # read 4 bytes past the end of the relu's input buffer
    shifted = dataclasses.replace(s, inputs=(s.inputs[0].with_offset(s.inputs[0].offset + 4),))
    bad = _break(p, steps=(p.steps[0], shifted, *p.steps[2:]))
    with pytest.raises(PlanError, match=r"step 1 \(elementwise .*in no buffer live"):
        emulate(bad, [x])
    with pytest.raises(PlanError, match="in no buffer live"):
        run_fake(bad, [x])


def test_packer_never_overlaps_and_stays_near_the_lower_bound() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(1, 60))
        sizes = [int(s) for s in rng.integers(0, 5000, n)]
        starts = rng.integers(0, 40, n)
        ranges = [(int(a), int(a + rng.integers(0, 10))) for a in starts]
        offs, peak = pack(sizes, ranges)
        for i in range(n):
            assert offs[i] % 256 == 0
            for j in range(i):
                live = ranges[i][0] <= ranges[j][1] and ranges[j][0] <= ranges[i][1]
                if live and sizes[i] and sizes[j]:
                    assert (
                        offs[i] + align(sizes[i]) <= offs[j] or offs[j] + align(sizes[j]) <= offs[i]
                    )
        assert peak >= lower_bound(sizes, ranges, 50)


def test_views_reshape_like_numpy() -> None:
    rng = np.random.default_rng(4)
    base = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    views = [
        base,
        base.transpose(1, 0, 3, 2),
        base[:, ::-1],
        base[..., ::2],
        np.broadcast_to(base[:, :1], (2, 3, 4, 5)),
    ]
    for a in views:
        for shape in [(a.size,), (6, -1), (a.shape[0], -1), (*a.shape[:2], -1), (-1, a.shape[-1])]:
            want = a.reshape(shape)
            strides = reshape_strides(a.shape, [s // a.itemsize for s in a.strides], want.shape)
            shares = np.shares_memory(want, a) or want.size == 0
            if strides is None:
                continue  # no-copy impossible for us; numpy may still manage with a copy
            got = np.lib.stride_tricks.as_strided(a, want.shape, [s * a.itemsize for s in strides])
            assert (got == want).all(), (a.strides, shape)
            assert shares or a.strides == ()
    del rng


def test_coalesce_merges_contiguous_axes() -> None:
    shape, (s1, s2) = coalesce((2, 3, 4), [(12, 4, 1), (0, 0, 1)])
    assert shape == (6, 4) and s1 == (4, 1) and s2 == (0, 1)
    shape, (s,) = coalesce((2, 1, 3), [(3, 99, 1)])
    assert shape == (6,) and s == (1,)


def test_strided_view_extent_with_negative_strides() -> None:
    v = StridedView(400, (3, 4), (-4, 1), DType.F32)
    assert v.byte_extent() == (400 - 8 * 4, 400 + 4 * 4)
    assert not v.is_dense()


def _largest_fixture() -> str:
    loadable = []
    for f in FIXTURES:
        try:
            loadable.append((len(load(f["name"])), f["name"]))
        except Exception:
            continue
    return max(loadable)[1]


def test_planning_the_largest_fixture_is_fast() -> None:
    name = _largest_fixture()
    g = load(name)
    og = optimize(g)
    _, binds = datasets(name)[-1]
    for graph in (g, og):
        t0 = time.perf_counter()
        p = plan(graph, bindings=binds)
        elapsed = time.perf_counter() - t0
        assert elapsed < 2.0, (
            f"planning {name} ({len(graph)} values, {len(p.steps)} steps) took {elapsed:.2f} s"
        )


def test_batch_size_and_bindings_agree() -> None:
    g = _mlp()
    with pytest.raises(PlanError, match="contradicts"):
        plan(g, 2, {"B": 3})
    p = plan(g, bindings={"B": 3})
    assert p.inputs[0].shape == (3, 8) and p.bindings == {"B": 3}


def test_reduce_to_scalar_and_mean() -> None:
    from tests.kn_cuda_eval.helpers import check_plan

    g = Graph()
    x = g.input(Shape.of(B, 3, 4), DType.F32, "x")
    g.add_output(g.reduce(x, [0, 1, 2], ReduceOp.MEAN), "m")
    check_plan(g, [np.random.default_rng(5).standard_normal((2, 3, 4)).astype(np.float32)], 2)
