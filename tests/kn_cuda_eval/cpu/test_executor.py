"""The host plan executor (`kn_cuda_eval.cpu.executor`) against the reference executor
`kn_graph.reference.evaluate`, with the emulator's tolerances: every fixture of the corpus (as loaded
and optimized, both bindings), the adversarial layouts of the planner tests (permuted,
broadcast, sliced and negative strides, size 0, rank 0, every op and dtype), the no-compiler
fallback, errors, and the accuracy of the prelude's vectorizable exp / tanh / erf.

All static plans share one compiled library (built once per session, cached on disk by source
hash under pytest's cache dir, like the cubins)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import scipy.special

from kn_cuda_eval import Plan, PlanSettings, plan
from kn_cuda_eval.cpu import build
from kn_cuda_eval.cpu.executor import HostExecutor
from kn_cuda_eval.cpu.library import HostLibrary
from kn_cuda_eval.cuda.hostcheck.sweep import run_planner_tests
from kn_cuda_eval.planning import steps
from kn_cuda_eval.planning.emulator import view_array
from kn_graph import DType, Graph, ReduceOp, Shape, UnaryOp
from kn_graph.errors import EvaluationError, KnError
from kn_graph.ops import BinaryOp
from kn_graph.optimizer import optimize
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_cuda_eval.corpus import FIXTURES, cases
from tests.kn_cuda_eval.helpers import assert_close, mapping_fields

Inputs = Sequence[np.ndarray] | Mapping[str, np.ndarray]
PLANNER_TESTS = ("test_layouts", "test_elementwise", "test_steps")


@dataclass(frozen=True)
class Case:
    label: str
    graph: Graph
    plan: Plan | None  # None: a graph with data-dependent ops, run segment by segment
    inputs: Inputs
    ref: list[np.ndarray]


def _both(
    label: str, graph: Graph, inputs: Inputs, ref: list[np.ndarray], **kw: object
) -> list[Case]:
    out = []
    for how, g in (("unoptimized", graph), ("optimized", optimize(graph))):
        p = None if g.has_dynamic else plan(g, **kw)  # type: ignore[arg-type]
        out.append(Case(f"{label} ({how})", g, p, inputs, ref))
    return out


@functools.cache
def corpus(name: str) -> list[Case]:
    return [
        c
        for graph, feed, binds in cases(name)
        for c in _both(f"{name} {binds}", graph, feed, evaluate(graph, feed), bindings=binds)
    ]


def _loadable(name: str) -> list[Case]:
    """The fixture's cases, or none when it does not load (its own test reports why)."""
    try:
        return corpus(name)
    except KnError:
        return []


def _harvest(module: ModuleType) -> list[Case]:
    """Every test of a planner test module run with a `check_plan` that records its graphs,
    inputs, plans and the reference executor's outputs; tests that do not run through (they
    expect an error) are left out."""

    def recorder(label: str, sink: list[Case]) -> Callable[..., list[Plan]]:
        def record(
            graph: Graph,
            inputs: Inputs,
            batch: int | None = None,
            bindings: Mapping[str, int] | None = None,
            *,
            optimized: bool = True,
            settings: PlanSettings | None = None,
            expected: Sequence[np.ndarray] | None = None,
        ) -> list[Plan]:
            snap = dict(inputs) if isinstance(inputs, Mapping) else list(inputs)
            ref = list(expected) if expected is not None else evaluate(graph, snap, batch)
            graphs = [("unoptimized", graph)]
            graphs += [("optimized", optimize(graph))] if optimized else []
            plans = []
            for how, g in graphs:
                p = plan(g, batch, bindings, settings)
                plans.append(p)
                sink.append(Case(f"{label} ({how})", g, p, snap, ref))
            return plans

        return record

    return run_planner_tests(module, recorder, lambda p: [])


@functools.cache
def layouts() -> list[Case]:
    import importlib

    return [
        c
        for m in PLANNER_TESTS
        for c in _harvest(importlib.import_module(f"tests.kn_cuda_eval.planning.{m}"))
    ]


@functools.cache
def library() -> HostLibrary | None:
    """One library for every static plan of the corpus and the layout tests."""
    plans = [c.plan for f in FIXTURES for c in _loadable(f["name"]) if c.plan is not None]
    plans += [c.plan for c in layouts() if c.plan is not None]
    return HostLibrary.for_plans(plans)


def _run_segmented(graph: Graph, inputs: Inputs) -> list[np.ndarray]:
    from kn_cuda_eval.planning.segments import SegmentedRunner

    execs: dict[object, HostExecutor] = {}

    def run_segment(
        seg: object, arrays: Sequence[np.ndarray], binds: Mapping[str, int]
    ) -> list[np.ndarray]:
        key = (seg.graph.id, tuple(sorted(binds.items())))  # type: ignore[attr-defined]
        ex = execs.get(key)
        if ex is None:
            p = plan(seg.graph, bindings=dict(binds))  # type: ignore[attr-defined]
            ex = execs[key] = HostExecutor(p)
        return ex.eval([np.asarray(a) for a in arrays])

    return SegmentedRunner(run_segment).run(graph, inputs)


def _check(c: Case, lib: HostLibrary | None, evals: int = 2) -> None:
    ex = None if c.plan is None else HostExecutor(c.plan, library=lib)
    for run in range(evals):  # a second evaluation reuses the arena
        got = _run_segmented(c.graph, c.inputs) if ex is None else ex.eval(c.inputs)
        assert len(got) == len(c.ref)
        for k, (a, b) in enumerate(zip(got, c.ref, strict=True)):
            assert_close(a, np.asarray(b), f"{c.label} output {k} (run {run})\n{c.plan}")


@pytest.mark.parametrize("name", [f["name"] for f in FIXTURES])
def test_fixture_on_the_host_matches_the_reference(name: str) -> None:
    lib = library()
    for c in corpus(name):
        _check(c, lib)


def test_adversarial_layouts_on_the_host_match_the_reference() -> None:
    cs = layouts()
    assert len(cs) > 100, len(cs)
    lib = library()
    for c in cs:
        _check(c, lib, evals=1)


def test_without_a_compiler_the_numpy_steps_give_the_same_results(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(build, "compiler", lambda: None)
    chosen = [c for c in layouts() if c.plan is not None][::7]
    chosen += [c for f in FIXTURES[:6] for c in _loadable(f["name"]) if c.plan is not None][:8]
    with caplog.at_level(logging.WARNING):
        for c in chosen:
            ex = HostExecutor(c.plan)  # type: ignore[arg-type]
            assert ex.library is None
            got = ex.eval(c.inputs)
            for k, (a, b) in enumerate(zip(got, c.ref, strict=True)):
                assert_close(a, np.asarray(b), f"{c.label} output {k} without a compiler")


def _unary_plan(op: UnaryOp, n: int) -> Plan:
    g = Graph()
    x = g.input(Shape.of(n), DType.F32, "x")
    g.add_output(g.unary(op, x), "y")
    return plan(g)


@pytest.mark.parametrize(
    ("op", "ref", "ulps"),
    [
        (UnaryOp.EXP, np.exp, 2),
        (UnaryOp.TANH, np.tanh, 3),
        (UnaryOp.ERF, scipy.special.erf, 3),
    ],
    ids=["exp", "tanh", "erf"],
)
def test_vectorizable_math_is_accurate_to_f32_rounding(
    op: UnaryOp, ref: Callable, ulps: int
) -> None:
    if build.compiler() is None:
        pytest.skip("no C compiler")
    xs = np.concatenate(
        [
            np.linspace(-12, 12, 200_001, dtype=np.float32),
            np.float32([0.0, -0.0, 1e-30, -1e-30, 88.7, -103.0, -110.0, 89.0, 1e-8]),
        ]
    )
    if op is not UnaryOp.EXP:
        xs = np.concatenate([xs, np.float32([100.0, -100.0, 3e38])])
    got = HostExecutor(_unary_plan(op, xs.size)).eval([xs])[0]
    want = ref(xs.astype(np.float64))
    fin = np.isfinite(want) & (np.abs(want) < 3e38)
    ulp = np.spacing(np.abs(want[fin]).astype(np.float32)).astype(np.float64)
    err = np.abs(got[fin].astype(np.float64) - want[fin]) / np.maximum(ulp, 2.0**-149)
    assert float(err.max()) <= ulps, (float(err.max()), xs[fin][int(err.argmax())])
    specials = HostExecutor(_unary_plan(op, 3)).eval([np.float32([np.nan, np.inf, -np.inf])])[0]
    np.testing.assert_array_equal(
        specials, ref(np.float32([np.nan, np.inf, -np.inf])).astype(np.float32)
    )


def test_gather_index_out_of_range_names_the_step() -> None:
    g = Graph()
    x = g.input(Shape.of(4, 5), DType.F32, "x")
    i = g.input(Shape.of(3), DType.I64, "i")
    g.add_output(g.exp(g.gather(x, 1, i)), "y")
    ex = HostExecutor(plan(g))
    xs = np.ones((4, 5), np.float32)
    np.testing.assert_allclose(ex.eval([xs, np.int64([0, 4, 2])])[0], np.e, rtol=1e-6)
    with pytest.raises(EvaluationError, match=r"step \d+ \(gather .*index out of range \[0, 5\)"):
        ex.eval([xs, np.int64([0, 5, 2])])


def test_prepared_graph_plans_per_binding_and_profiles() -> None:
    name = FIXTURES[0]["name"]
    c0 = corpus(name)[0]
    prepared = Device.cpu().prepare(c0.graph)
    feeds = [c.inputs for c in corpus(name) if c.graph is c0.graph]
    for feed in feeds:
        for a, b in zip(prepared.eval(feed), evaluate(c0.graph, feed), strict=True):
            assert_close(a, b, name)
    assert len(prepared.cache) >= 1
    prof = prepared.profile(feeds[0])
    ex = prepared.executor(prepared.check_inputs(feeds[0]))
    assert [r.step for r in prof.rows] == list(range(len(ex.plan.steps)))
    assert "by kind:" in prof.table()


@pytest.mark.parametrize("threads", [1, 3])
def test_steps_past_the_parallel_threshold_match_the_reference(threads: int) -> None:
    """Sizes where every kernel splits its work over threads: rows split into chunks (a few
    long rows), the odometer over permuted outer axes, row kernels, gathers and attention."""
    rng = np.random.default_rng(5)
    g = Graph()
    x = g.input(Shape.of(3, 40000), DType.F32, "x")
    y = g.input(Shape.of(70, 30, 40), DType.F32, "y")
    idx = g.input(Shape.of(500), DType.I64, "i")
    g.add_output(g.unary(UnaryOp.GELU, g.mul(x, 0.5)), "gelu")
    g.add_output(g.exp(g.permute(g.flip(y, 1), [2, 0, 1])), "perm")
    g.add_output(g.softmax(g.mul(y, 0.25), 2), "softmax")
    g.add_output(g.layernorm(g.permute(y, [0, 2, 1]), 2, 1e-5), "layernorm")
    g.add_output(g.reduce(y, [1], ReduceOp.MAX), "max")
    g.add_output(g.reduce(g.permute(y, [2, 1, 0]), [1, 2], ReduceOp.SUM), "sum")
    g.add_output(g.gather(x, 1, idx), "gather_inner")
    g.add_output(g.gather(g.permute(x, [1, 0]), 0, idx), "gather_outer")
    q = g.input(Shape.of(6, 70, 16), DType.F32, "q")
    k = g.input(Shape.of(6, 90, 16), DType.F32, "k")
    v = g.input(Shape.of(6, 90, 24), DType.F32, "v")
    g.add_output(g.attention(q, k, v, None, 0.25, True), "attention")
    feed = {
        "x": rng.standard_normal((3, 40000)).astype(np.float32),
        "y": rng.standard_normal((70, 30, 40)).astype(np.float32),
        "i": rng.integers(0, 3, 500),
        "q": rng.standard_normal((6, 70, 16)).astype(np.float32),
        "k": rng.standard_normal((6, 90, 16)).astype(np.float32),
        "v": rng.standard_normal((6, 90, 24)).astype(np.float32),
    }
    ref = evaluate(g, feed)
    for gg in (g, optimize(g)):
        p = plan(gg, settings=PlanSettings(fused_attention=True))
        assert any(isinstance(s, steps.Attention) for s in p.steps)
        got = HostExecutor(p, threads=threads).eval(feed)
        for name, a, b in zip(g.output_names, got, ref, strict=True):
            assert_close(a, b, f"{name} on {threads} threads\n{p}")


def _resident_range(address: int, nbytes: int) -> int:
    """Bytes of the pages of [address, address + nbytes) that are in memory (`mincore`: exact
    for anonymous memory, where smaps would count a whole VMA, which the kernel merges with
    neighbouring private mappings)."""
    import ctypes
    import mmap

    page = mmap.PAGESIZE
    lo = address // page * page
    n = -(-(address + nbytes - lo) // page)
    vec = (ctypes.c_ubyte * n)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    if libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(n * page), vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(b & 1 for b in vec) * page


def _resident(address: int) -> int:
    """Bytes of the mapping holding `address` that are in memory (/proc/self/smaps Rss)."""
    return int(mapping_fields(address)["Rss"].split()[0]) * 1024


def test_packed_weights_are_not_held_twice() -> None:
    """Constants oneDNN packed go back to the system (their arena pages); the results stay
    right over repeated calls, and a constant another step also reads (a gather of the same
    table) is kept."""
    from kn_cuda_eval.cpu import onednn

    rng = np.random.default_rng(3)
    g = Graph()
    x = g.input(Shape.of(1, 64, 16, 16), DType.F32, "x")
    ids = g.input(Shape.of(4), DType.I64, "ids")
    w1 = g.constant((rng.standard_normal((256, 64, 3, 3)) * 0.05).astype(np.float32))
    w2 = g.constant((rng.standard_normal((64, 256, 3, 3)) * 0.05).astype(np.float32))
    table = g.constant(rng.standard_normal((1, 512, 256)).astype(np.float32))  # 512 KB
    y = g.conv(g.relu(g.conv(x, w1, padding=(1, 1))), w2, padding=(1, 1))
    g.add_output(g.reduce(y, [2, 3], ReduceOp.MEAN), "y")
    h = g.input(Shape.of(1, 3, 512), DType.F32, "h")
    g.add_output(g.matmul(h, table), "logits")  # the table as GEMM weights ...
    g.add_output(g.gather(table, 1, ids), "rows")  # ... and gathered: it must stay
    feed = [
        rng.standard_normal((1, 64, 16, 16)).astype(np.float32),
        np.int64([0, 511, 7, 7]),
        rng.standard_normal((1, 3, 512)).astype(np.float32),
    ]
    ex = HostExecutor(plan(g), threads=2)
    want = evaluate(g, feed)
    for _ in range(2):
        for got, ref in zip(ex.eval(feed), want, strict=True):
            assert_close(got, ref, "after the release")
    if onednn.available() is not None:
        assert ex._release.released == 0
        return
    conv_weights = 2 * 256 * 64 * 9 * 4
    assert conv_weights - 2 * 4096 <= ex._release.released <= conv_weights
    # the pages really left: the arena's mapping holds the rest only
    assert (
        _resident_range(ex.arena.ctypes.data, ex.arena.size)
        <= ex.plan.arena_size + 4096 - ex._release.released
    )


@pytest.mark.parametrize("layout", ["dense", "transposed q and k", "masked", "causal"])
def test_large_attention_as_gemms_matches_the_reference(
    layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attention with enough scores runs as GEMM, softmax, GEMM per head and block of query
    rows (`kn_cuda_eval.cpu.passes.attention`); small blocks here, so rows split unevenly."""
    from kn_cuda_eval.cpu import onednn
    from kn_cuda_eval.cpu.passes import attention

    monkeypatch.setattr(attention, "BLOCK_BYTES", 100 * 1024)
    rng = np.random.default_rng(11)
    g = Graph()
    if layout == "transposed q and k":  # [b, d, m] stored, read as [b, m, d]
        q = g.permute(g.input(Shape.of(3, 16, 600), DType.F32, "q"), [0, 2, 1])
        k = g.permute(g.input(Shape.of(3, 16, 500), DType.F32, "k"), [0, 2, 1])
        shapes = [(3, 16, 600), (3, 16, 500)]
    else:  # causal: 400 queries over 500 keys, the diagonal offset by 100
        m = 400 if layout == "causal" else 600
        q = g.input(Shape.of(3, m, 16), DType.F32, "q")
        k = g.input(Shape.of(3, 500, 16), DType.F32, "k")
        shapes = [(3, m, 16), (3, 500, 16)]
    v = g.input(Shape.of(3, 500, 24), DType.F32, "v")
    mask = None
    if layout == "masked":  # one mask row per query, shared by the batch
        mask = g.broadcast(g.input(Shape.of(1, 600, 500), DType.F32, "mask"), [3, 600, 500])
        shapes.append((1, 600, 500))
    causal = layout == "causal"
    g.add_output(g.attention(q, k, v, mask=mask, scale=0.3, causal=causal), "o")
    feed = [(rng.standard_normal(s) * 2).astype(np.float32) for s in shapes]
    feed.insert(2, (rng.standard_normal((3, 500, 24)) * 2).astype(np.float32))
    if layout == "masked":
        feed[3] = np.where(feed[3] > 1.0, -np.inf, feed[3]).astype(np.float32)
    p = plan(g)
    assert [s.mask is not None for s in p.steps if isinstance(s, steps.Attention)] == [
        layout == "masked"
    ]
    ex = HostExecutor(p, threads=2)
    for _ in range(2):
        assert_close(ex.eval(feed)[0], evaluate(g, feed)[0], layout)
    split = [n for n in ex.names if n.startswith("onednn gemm+softmax")]
    assert bool(split) == (onednn.available() is None), ex.names
    prof = ex.profile(feed)
    assert any(r.kind == "attention" for r in prof.rows)
    assert_close(view_array(ex.arena, p.outputs[0]).copy(), evaluate(g, feed)[0], "profiled")


@pytest.mark.parametrize("layout", ["mask per head", "mask per batch row", "causal", "shared kv"])
def test_heads_of_a_batch_row_go_through_one_batched_gemm(
    layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When whole heads fit in a block, the heads of a batch row run as one GEMM batched over
    them, one softmax over all their rows and one GEMM, up to `GROUP_BYTES` of scores: 5 heads
    in groups of 2, 2 and 1 here, each group's mask rows, causal diagonal and keys its own."""
    from kn_cuda_eval.cpu import onednn
    from kn_cuda_eval.cpu.passes import attention

    monkeypatch.setattr(attention, "GROUP_BYTES", 2 * 80 * 96 * 4 + 100)
    rng = np.random.default_rng(12)
    g = Graph()
    q = g.input(Shape.of(2, 5, 80, 32), DType.F32, "q")
    kv_heads = 1 if layout == "shared kv" else 5
    k = g.input(Shape.of(2, kv_heads, 96, 32), DType.F32, "k")
    v = g.input(Shape.of(2, kv_heads, 96, 24), DType.F32, "v")
    shapes = [(2, 5, 80, 32), (2, kv_heads, 96, 32), (2, kv_heads, 96, 24)]
    if kv_heads == 1:
        k, v = g.broadcast(k, [2, 5, 96, 32]), g.broadcast(v, [2, 5, 96, 24])
    mask = None
    if layout.startswith("mask"):
        heads = 5 if layout == "mask per head" else 1
        mask = g.input(Shape.of(2, heads, 80, 96), DType.F32, "mask")
        mask = g.broadcast(mask, [2, 5, 80, 96]) if heads == 1 else mask
        shapes.append((2, heads, 80, 96))
    q, k, v = (g.view(x, [10, *g[x].shape[2:]]) for x in (q, k, v))  # heads off the batch
    mask = None if mask is None else g.view(mask, [10, 80, 96])
    g.add_output(g.attention(q, k, v, mask=mask, scale=0.2, causal=layout == "causal"), "o")
    feed = [(rng.standard_normal(s) * 2).astype(np.float32) for s in shapes]
    if mask is not None:
        feed[3] = np.where(feed[3] > 1.0, -np.inf, feed[3]).astype(np.float32)
    p = plan(g)
    ex = HostExecutor(p, threads=2)
    want = evaluate(g, feed)[0]
    for _ in range(2):
        assert_close(ex.eval(feed)[0], want, layout)
    split = [n for n in ex.names if n.startswith("onednn gemm+softmax")]
    if onednn.available() is None:
        assert split == ["onednn gemm+softmax x6"], ex.names  # 2 batch rows x 3 groups
    else:
        assert split == [], ex.names


def test_small_attention_stays_one_fused_step() -> None:
    from kn_cuda_eval.cpu.passes import attention

    g = Graph()
    q = g.input(Shape.of(2, 32, 16), DType.F32, "q")
    g.add_output(g.attention(q, q, q), "o")
    a = next(s for s in plan(g).steps if isinstance(s, steps.Attention))
    assert attention.split_attention(a, 0) is None  # 1k scores a head: the fused kernel
    g = Graph()
    q = g.input(Shape.of(2, 600, 4), DType.F32, "q")
    g.add_output(g.attention(q, q, q), "o")
    a = next(s for s in plan(g).steps if isinstance(s, steps.Attention))
    assert attention.split_attention(a, 0) is None  # head dim 4: the fused kernel


def test_mapped_weights_are_copied_one_at_a_time_and_leave_memory(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model loaded by path keeps its weights in the file's pages (`kn_graph.onnx.mapped`).
    Building its host executor copies each weight into the arena just before oneDNN packs it
    and hands the pages back after, so the arena never holds all the weights at once; the
    file's pages leave memory too, and the graph still reads them (they fault back in)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from kn_cuda_eval.cpu import onednn
    from kn_cuda_eval.cpu.arena import PageRelease
    from kn_graph.onnx import load_onnx
    from kn_graph.ops import Constant

    rng = np.random.default_rng(4)
    w1 = (rng.standard_normal((256, 64, 3, 3)) * 0.05).astype(np.float32)
    w2 = (rng.standard_normal((64, 256, 3, 3)) * 0.05).astype(np.float32)
    w3 = (rng.standard_normal((64, 512)) * 0.05).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("ReduceMean", ["c2"], ["p"], axes=[2, 3], keepdims=0),
        helper.make_node("MatMul", ["p", "w3"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, n) for n, a in (("w1", w1), ("w2", w2), ("w3", w3))],
    )
    path = tmp_path / "m.onnx"
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    g = load_onnx(path)
    x = rng.standard_normal((1, 64, 16, 16)).astype(np.float32)
    want = evaluate(g, [x])[0]
    weights = [g[v].op.tensor.array for v in g.values() if isinstance(g[v].op, Constant)]
    file_map = weights[0].ctypes.data
    total = sum(a.nbytes for a in weights)
    assert _resident(file_map) >= total  # read by the reference: in memory

    seen: list[int] = []
    built = PageRelease.built

    def watch(self, k: int, packed: bool) -> None:  # step k built: its weight is in the arena
        seen.append(_resident_range(self._arena.array.ctypes.data, self._arena.capacity))
        built(self, k, packed)

    monkeypatch.setattr(PageRelease, "built", watch)
    p = Device.cpu(threads=2).prepare(g)  # static: built at once
    (ex,) = p.cache.values()
    assert_close(p.eval([x])[0], want, "mapped weights")
    assert _resident(file_map) <= 64 * 1024  # the file's pages left
    assert_close(evaluate(g, [x])[0], want, "the graph reads them again")
    if onednn.available() is not None:
        return
    assert ex._release.released >= total - 4 * 4096
    activations = ex.plan.arena_size - ex.plan.const_size
    assert max(seen) <= activations + max(a.nbytes for a in weights) + 16 * 4096, (seen, total)


@pytest.mark.parametrize("op", ["mean", "sum", "prod", "max", "min"])
def test_reductions_down_columns_match_the_reference(op: str) -> None:
    """A reduction whose kept innermost axis is contiguous and whose reduced axes are not (a
    channels-last tensor averaged over H and W, a mean over the sequence axis of [B, S, D])
    runs the column kernel (`csource.columns.reduce_columns_call`): columns not a multiple of
    its width, a batch of kept rows, a NaN for max and min."""
    rng = np.random.default_rng(12)
    cases = [((1, 7, 9, 37), [0, 3, 1, 2], [2, 3]), ((3, 5, 4, 16), [0, 3, 1, 2], [2, 3])]
    cases.append(((2, 11, 50), [0, 2, 1], [2]))  # [B, S, D] -> mean over S
    for shape, perm, axes in cases:
        g = Graph()
        x = g.input(Shape.of(*shape), DType.F32, "x")
        y = g.permute(x, perm)
        if op == "prod":
            y = g.exp(y)
        g.add_output(g.reduce(y, axes, ReduceOp(op)), "y")
        ex = HostExecutor(plan(g), threads=2)
        a = (rng.standard_normal(shape) * 0.3).astype(np.float32)
        if op in ("max", "min"):
            a.reshape(-1)[5] = np.nan
        got, want = ex.eval([a])[0], evaluate(g, [a])[0]
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=f"{op} {shape}")
        assert any("reduce_cols" in n for n in ex.names), ex.names
        if op in ("max", "min"):
            assert np.isnan(got).sum() == 1
        # nothing written outside the steps' outputs (the arena starts as 0xFF bytes)
        untouched = np.ones(ex.plan.arena_size, bool)
        untouched[: ex.plan.const_size] = False
        for v in [*ex.plan.inputs, *(w for s in ex.plan.steps for w in s.writes())]:
            lo, hi = v.byte_extent()
            untouched[lo:hi] = False
        assert (ex.arena[: ex.plan.arena_size][untouched] == 0xFF).all(), f"{op} {shape}"


def test_row_invariant_work_is_tabulated_once_per_inner_coordinate() -> None:
    """A scale whose transcendental part reads only a per-channel operand, walked over rows of
    channels (a channels-last output), computes that part once per channel into a per-thread
    table (`csource.elementwise.hoisted`) and still matches the reference; the step is walked in
    the order its output is stored (`csource.memory_order`). At batch 2 the operand moves along
    the outer (batch) axis: no table, same results."""
    from kn_cuda_eval.cpu import csource

    rng = np.random.default_rng(13)
    for batch in (1, 2):
        g = Graph()
        x = g.input(Shape.of(batch, 9, 7, 37), DType.F32, "x")  # channels-last data
        s = g.input(Shape.of(batch, 37, 1, 1), DType.F32, "s")
        y = g.binary(
            BinaryOp.ADD,
            g.binary(BinaryOp.MUL, g.permute(x, [0, 3, 1, 2]), g.unary(UnaryOp.SIGMOID, s)),
            g.unary(UnaryOp.TANH, g.binary(BinaryOp.MUL, s, s)),
        )
        g.add_output(g.permute(y, [0, 2, 3, 1]), "y")  # stored channels-last too
        p = plan(g)
        (ew,) = [t for t in p.steps if isinstance(t, steps.Elementwise)]
        assert csource.memory_order(ew).outputs[0].strides[-1] == 1
        src = csource.step_call(ew).kernel.source  # type: ignore[union-attr]
        tabulated = "hv0[kn_inner]" in src and "hv1[kn_inner]" in src
        assert tabulated == (batch == 1), src
        if tabulated:
            assert src.count("expf") == 1 and src.count("tanhf") == 1  # in the table only
        feed = [
            rng.standard_normal((batch, 9, 7, 37)).astype(np.float32),
            rng.standard_normal((batch, 37, 1, 1)).astype(np.float32),
        ]
        ex = HostExecutor(p, threads=2)
        assert_close(ex.eval(feed)[0], evaluate(g, feed)[0], f"batch {batch}")


def test_copies_into_a_concatenation_are_written_in_place_by_their_producer() -> None:
    """A UNet-style concatenation of two convolutions' outputs (each used once): the planner
    copies them into the concatenated buffer; the host executor has the convolutions write
    there (`kn_cuda_eval.cpu.passes.elide`) and skips the copies, with the reference's results. A
    tensor read again after its copy keeps its copy."""
    from kn_cuda_eval.cpu.passes import elide

    rng = np.random.default_rng(14)

    def w(k: int, c: int) -> np.ndarray:
        return (rng.standard_normal((k, c, 3, 3)) * 0.2).astype(np.float32)

    for reuse in (False, True):
        g = Graph()
        x = g.input(Shape.of(1, 6, 9, 9), DType.F32, "x")
        a = g.conv(x, g.constant(w(8, 6)), padding=(1, 1))
        b = g.conv(x, g.constant(w(5, 6)), padding=(1, 1))
        cat = g.concat([a, b], 1)
        y = g.conv(cat, g.constant(w(4, 13)), padding=(1, 1))
        y = g.relu(y)
        if reuse:  # b is read after the concatenation too: its own bytes must stay
            y = g.binary(BinaryOp.ADD, y, g.reduce(b, [1], ReduceOp.SUM, keepdims=True))
        g.add_output(y, "y")
        p = plan(g)
        copies = [k for k, s in enumerate(p.steps) if isinstance(s, steps.Copy)]
        assert copies, [s.describe() for s in p.steps]
        elided = [
            k
            for k, s in enumerate(elide.elide_copies(p.steps, p.outputs))
            if k in copies and not isinstance(s, steps.Copy)
        ]
        # b's copy goes when b is not read again (a's stays: the planner gives the
        # concatenation x's bytes, which b's convolution, in between, still reads)
        b_out = next(s.out for s in p.steps if isinstance(s, steps.Conv) and s.out.shape[1] == 5)
        b_copy = next(k for k in copies if p.steps[k].src.byte_extent() == b_out.byte_extent())  # type: ignore[union-attr]
        assert (b_copy in elided) == (not reuse), (reuse, elided, copies)
        ex = HostExecutor(p, threads=2)
        feed = [rng.standard_normal((1, 6, 9, 9)).astype(np.float32)]
        for _ in range(2):
            assert_close(ex.eval(feed)[0], evaluate(g, feed)[0], f"reuse={reuse}")
        assert sum("copy written in place" in n for n in ex.names) == len(elided)


def test_the_compiler_probes_are_kept_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`build.flags` compiles three probes once per cache folder and compiler, not once per
    process: a second process (here: the cache of the function cleared) reads the answer."""
    if build.compiler() is None:
        pytest.fail("no C compiler: the host backend's build is not tested")
    monkeypatch.setenv("KN_KERNEL_CACHE", str(tmp_path))
    build.flags.cache_clear()
    try:
        first = build.flags()
        assert list(tmp_path.glob("cpu/flags-*.txt"))
        build.flags.cache_clear()

        def no_probe(*args: object) -> bool:
            raise AssertionError("probed again")

        monkeypatch.setattr(build, "_try", no_probe)
        assert build.flags() == first
    finally:
        build.flags.cache_clear()
