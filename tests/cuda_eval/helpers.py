"""`check_plan`: plan a graph (as given and optimized), validate the plan, run it in the emulator
against the CPU executor, and compile every kernel it generates with NVRTC for sm_80 and sm_90."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kn_cuda_eval import Plan, PlanSettings, emulate, plan
from kn_cuda_eval.kernels import Kernel, distinct_kernels
from kn_graph.cpu import evaluate
from kn_graph.graph import Graph
from kn_graph.optimizer import optimize

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
    from kn_cuda_eval.kernels.compile import compile_kernel

    ks = distinct_kernels(p.kernels())
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
        p = plan(g, batch, bindings, settings)
        p.validate()
        got = emulate(p, inputs)
        assert len(got) == len(ref)
        for k, (a, b) in enumerate(zip(got, ref, strict=True)):
            assert_close(a, b, f"{label} output {k} ({g.output_names[k]})\n{p}")
        compile_all(p)
        plans.append(p)
    return plans
