"""`check_plan`: plan a graph (as given and optimized), validate the plan, run it in the emulator
against the CPU executor, compile every kernel it generates with NVRTC for sm_80 and sm_90, and
run it through the CUDA executor: on the fake device (CPU, always: a warm-up evaluation, then
the CUDA graph it captures, GEMMs included) and on the real one when present (with and without
CUDA graphs). `KN_REQUIRE_CUDA=1` turns a missing GPU into a failure."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest

from kn_cuda_eval import Plan, PlanSettings, emulate, plan
from kn_cuda_eval.cuda.kernels import Kernel, distinct_kernels
from kn_cuda_eval.cuda.kernels.dispatch import plan_launches
from kn_graph.graph import Graph
from kn_graph.optimizer import optimize
from kn_graph.reference import evaluate

ARCHS = (80, 90)
TOL = {"f": {2: 2e-2, 4: 1e-4, 8: 1e-9}}


@dataclass
class KernelStats:
    """Every distinct kernel compiled in this test session, with its ptxas resource usage."""

    kernels: dict[str, tuple[int, int, int]] = field(
        default_factory=dict
    )  # name -> (regs80, regs90, spills)
    sources: dict[str, Kernel] = field(default_factory=dict)


STATS = KernelStats()


def compile_all(p: Plan) -> list[Kernel]:
    """Compile the plan's kernels for every arch in ARCHS (each distinct kernel once a session)."""
    from kn_cuda_eval.cuda.kernels.compile import compile_kernel

    ks = distinct_kernels(plan_launches(p))
    for k in ks:
        if k.name in STATS.kernels:
            continue
        res = [compile_kernel(k, arch) for arch in ARCHS]
        STATS.kernels[k.name] = (
            res[0].registers,
            res[1].registers,
            max(r.spill_bytes for r in res),
        )
        STATS.sources[k.name] = k
    return ks


def assert_close(got: np.ndarray, ref: np.ndarray, what: str = "") -> None:
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    assert got.dtype == ref.dtype, f"{what}: dtype {got.dtype} != {ref.dtype}"
    if ref.dtype.kind != "f":
        bad = got != ref
        assert not bad.any(), (
            f"{what}: {int(bad.sum())} elements differ, e.g. {got[bad][:5]} vs {ref[bad][:5]}"
        )
        return
    nan_g, nan_r = np.isnan(got), np.isnan(ref)
    assert (nan_g == nan_r).all(), (
        f"{what}: NaN positions differ ({int(nan_g.sum())} vs {int(nan_r.sum())})"
    )
    fin = np.isfinite(ref)
    assert (got[~fin & ~nan_r] == ref[~fin & ~nan_r]).all(), f"{what}: infinities differ"
    if not fin.any():
        return
    g64, r64 = got[fin].astype(np.float64), ref[fin].astype(np.float64)
    scale = max(1.0, float(np.max(np.abs(r64))))
    err = float(np.max(np.abs(g64 - r64))) / scale
    assert err <= TOL["f"][ref.dtype.itemsize], f"{what}: max relative difference {err:.3g}"


@functools.cache
def gpu_problem() -> str | None:
    """Why the real CUDA device cannot be used here (None: it can)."""
    try:
        from kn_cuda_eval.cuda.device import probe

        return probe(0)
    except Exception as e:  # the probe itself never raises, but a broken install might
        return f"{type(e).__name__}: {e}"


def need_gpu() -> None:
    """Skip (or fail, with KN_REQUIRE_CUDA=1) unless a CUDA device works."""
    reason = gpu_problem()
    if reason is not None:
        if os.environ.get("KN_REQUIRE_CUDA") == "1":
            pytest.fail(f"KN_REQUIRE_CUDA=1 but no CUDA device: {reason}")
        pytest.skip(f"no CUDA device: {reason}")


def fake_runs(
    p: Plan,
    inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
    cuda_graphs: bool = False,
    evals: int = 1,
) -> list[list[np.ndarray]]:
    """The plan through the CUDA executor on the fake device, `evals` times (the outputs of
    each). With CUDA graphs and two evaluations or more, the capture must succeed. Every GEMM
    must have run on the executor's stream with the arena's cuBLAS workspace, never through
    CuPy's cuBLAS wrappers."""
    from kn_cuda_eval.cuda.device.executor import CudaExecutor
    from kn_cuda_eval.cuda.device.settings import ExecutorSettings
    from tests.kn_cuda_eval.cuda.fake_device import FakeApi

    fake = FakeApi()
    ex = CudaExecutor.from_plan(p, settings=ExecutorSettings(cuda_graphs=cuda_graphs), api=fake)
    fake.expect(ex.launches)
    outs = [ex.eval(inputs) for _ in range(evals)]
    if cuda_graphs and evals >= 2:
        assert ex.uses_cuda_graph, f"the plan was not captured: {ex.graph_error}\n{p}"
    lay = ex.launches.layout
    ws = (ex._base + lay.cublas_workspace, lay.cublas_workspace_size)
    for g in fake.cublas_c.gemms:
        assert (g.stream, g.workspace) == (ex._stream.ptr, ws), (g, ex._stream.ptr, ws)
    assert not fake.blas.calls, f"CuPy's cuBLAS wrappers were used: {fake.blas.calls}"
    return outs


def run_fake(
    p: Plan,
    inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
    cuda_graphs: bool = False,
    evals: int = 1,
) -> list[np.ndarray]:
    """The last evaluation's outputs of `fake_runs`."""
    return fake_runs(p, inputs, cuda_graphs, evals)[-1]


def check_device(
    p: Plan,
    inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
    ref: Sequence[np.ndarray],
    label: str,
) -> None:
    """The executor's outputs against `ref`: on the fake device (always: the warm-up, then the
    captured graph's replay), then on the GPU when there is one, with CUDA graphs (warm-up,
    then captured replays) and without."""
    for run, outs in enumerate(fake_runs(p, inputs, cuda_graphs=True, evals=2)):
        for k, (a, b) in enumerate(zip(outs, ref, strict=True)):
            assert_close(a, b, f"{label} output {k} on the fake device (run {run})\n{p}")
    if gpu_problem() is None:
        from kn_cuda_eval.cuda.device.executor import CudaExecutor
        from kn_cuda_eval.cuda.device.settings import ExecutorSettings

        for graphs in (False, True):
            with CudaExecutor.from_plan(p, settings=ExecutorSettings(cuda_graphs=graphs)) as ex:
                for run in range(3 if graphs else 1):
                    got = ex.eval(inputs)
                    for k, (a, b) in enumerate(zip(got, ref, strict=True)):
                        assert_close(
                            a, b, f"{label} output {k} on the GPU (graphs={graphs}, run {run})"
                        )
                assert ex.uses_cuda_graph == graphs, ex.graph_error
    elif os.environ.get("KN_REQUIRE_CUDA") == "1":
        pytest.fail(f"KN_REQUIRE_CUDA=1 but no CUDA device: {gpu_problem()}")


def check_plan(
    graph: Graph,
    inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
    batch: int | None = None,
    bindings: Mapping[str, int] | None = None,
    *,
    optimized: bool = True,
    settings: PlanSettings | None = None,
    expected: Sequence[np.ndarray] | None = None,
) -> list[Plan]:
    """Plan, validate, emulate and compare (graph as given, and optimized); returns the plans."""
    plans = []
    graphs = [("unoptimized", graph)] + ([("optimized", optimize(graph))] if optimized else [])
    ref = list(expected) if expected is not None else evaluate(graph, inputs, batch)
    for label, g in graphs:
        if g.has_dynamic:
            plans += check_segmented(g, inputs, ref, label, settings)
            continue
        p = plan(g, batch, bindings, settings)
        p.validate()
        got = emulate(p, inputs)
        assert len(got) == len(ref)
        for k, (a, b) in enumerate(zip(got, ref, strict=True)):
            assert_close(a, b, f"{label} output {k} ({g.output_names[k]})\n{p}")
        compile_all(p)
        check_device(p, inputs, ref, label)
        plans.append(p)
    return plans


def check_segmented(
    graph: Graph,
    inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
    ref: Sequence[np.ndarray],
    label: str,
    settings: PlanSettings | None = None,
) -> list[Plan]:
    """A graph with data-dependent ops, segment by segment (`kn_cuda_eval.planning.segments`): every
    segment's plan validated, emulated, its kernels compiled and run on the fake device against
    the emulator; the outputs against `ref`. Returns the plans made."""
    from kn_cuda_eval.planning.segments import Segment, SegmentedRunner

    plans: dict[tuple[int, tuple[tuple[str, int], ...]], Plan] = {}

    def run_segment(
        seg: Segment, arrays: Sequence[np.ndarray], binds: Mapping[str, int]
    ) -> list[np.ndarray]:
        key = (seg.graph.id, tuple(sorted(binds.items())))
        host = [np.asarray(a) for a in arrays]
        p = plans.get(key)
        if p is not None:  # a loop body again, at a binding seen before
            return emulate(p, host)
        p = plans[key] = plan(seg.graph, bindings=dict(binds), settings=settings)
        p.validate()
        got = emulate(p, host)
        compile_all(p)
        check_device(p, host, got, f"{label} segment")
        return got

    got = SegmentedRunner(run_segment).run(graph, inputs)
    assert len(got) == len(ref)
    for k, (a, b) in enumerate(zip(got, ref, strict=True)):
        assert_close(a, b, f"{label} output {k} ({graph.output_names[k]}), segmented")
    return list(plans.values())


def mapping_fields(address: int) -> dict[str, str]:
    """The /proc/self/smaps fields (Rss, VmFlags, ...) of the mapping that holds `address`."""
    fields: dict[str, str] = {}
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head, _, rest = line.partition(" ")
            if "-" in head and ":" not in head:
                if inside:
                    break
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside:
                fields[head.rstrip(":")] = rest.strip()
    if not inside:
        raise AssertionError(f"no mapping holds {address:#x}")
    return fields
