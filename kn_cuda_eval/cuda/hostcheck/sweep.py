"""`python -m kn_cuda_eval.cuda.hostcheck.sweep [--corpus]`: every distinct generated kernel compiled
for the host, launched exactly as planned over the emulator's arena, and compared with the
emulator's result for that step (`kn_cuda_eval.cuda.hostcheck.check` has the tolerances).

Without `--corpus` it runs the built-in cases (below): rows, attention, gathers and grid-stride
loops past a grid capped at `GRID_CAP = 8`, so the row-loop paths run at test sizes. With
`--corpus` it adds the test corpus, which lives in `tests/` (so run it from the repository root):
every fixture model, as loaded and optimized, at both of its bindings, and the adversarial
layouts of the planner tests (`tests/kn_cuda_eval/planning/test_layouts.py`, `test_elementwise.py`,
`test_steps.py`: permuted, broadcast, sliced and negative strides, size 0, rank 0, every op and
dtype), harvested by running those tests with a `check_plan` that records their plans.

The last line is exactly `kernels executed on the host: M/N match` (N distinct kernels); the
exit status is 0 iff M == N and every fixture could be loaded and planned (one that cannot is
printed as NOT CHECKED). Without a C++ compiler (or off x86-64) it prints one line, exits 0.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from kn_cuda_eval.cuda.hostcheck.check import StepCheck, check_plan
from kn_cuda_eval.cuda.hostcheck.compile import build_all, unavailable
from kn_cuda_eval.cuda.kernels import launch as launch_mod
from kn_cuda_eval.cuda.kernels.dispatch import distinct_kernels, plan_launches
from kn_cuda_eval.cuda.kernels.launch import KernelLaunch
from kn_cuda_eval.planning.emulator import emulate
from kn_cuda_eval.planning.plan import Plan, plan
from kn_cuda_eval.planning.planner import PlanSettings
from kn_graph import DType, Graph, ReduceOp, Shape
from kn_graph.errors import KnError
from kn_graph.optimizer import optimize

__all__ = [
    "Case",
    "builtin_cases",
    "corpus_cases",
    "grid_cap",
    "harvest",
    "main",
    "parametrizations",
    "plan_cases",
    "run_cases",
]

log = logging.getLogger(__name__)

SMALL_CAP = 8
PLANNER_TESTS = ("test_layouts", "test_elementwise", "test_steps")

Inputs = Sequence[np.ndarray] | Mapping[str, np.ndarray]


@dataclass(frozen=True, slots=True)
class Case:
    """A plan and its inputs; launches are built (`plan_launches(plan)`) with `launch.GRID_CAP` =
    `grid_cap` when it is set."""

    label: str
    plan: Plan
    inputs: Inputs
    grid_cap: int | None = None

    def launches(self) -> list[KernelLaunch]:
        with grid_cap(self.grid_cap):
            return plan_launches(self.plan)


@contextmanager
def grid_cap(blocks: int | None) -> Iterator[None]:
    """Launches built inside use at most `blocks` blocks (`launch.GRID_CAP`; None: as it is)."""
    old = launch_mod.GRID_CAP
    launch_mod.GRID_CAP = old if blocks is None else blocks
    try:
        yield
    finally:
        launch_mod.GRID_CAP = old


def plan_cases(
    label: str,
    graph: Graph,
    inputs: Inputs,
    batch: int | None = None,
    bindings: Mapping[str, int] | None = None,
    *,
    optimized: bool = True,
    settings: PlanSettings | None = None,
    cap: int | None = None,
) -> list[Case]:
    """The graph as given and (by default) optimized, planned as the planner tests plan it; a
    graph with data-dependent ops segment by segment (`kn_cuda_eval.planning.segments`, emulated between
    its host points), one case per segment and binding."""
    graphs = [("unoptimized", graph)] + ([("optimized", optimize(graph))] if optimized else [])
    out: list[Case] = []
    for how, g in graphs:
        if g.has_dynamic:
            out += _segment_cases(f"{label} ({how}", g, inputs, batch, settings, cap)
        else:
            out.append(Case(f"{label} ({how})", plan(g, batch, bindings, settings), inputs, cap))
    return out


def _segment_cases(
    label: str,
    graph: Graph,
    inputs: Inputs,
    batch: int | None,
    settings: PlanSettings | None,
    cap: int | None,
) -> list[Case]:
    from kn_cuda_eval.planning.segments import Segment, SegmentedRunner

    plans: dict[tuple[int, tuple[tuple[str, int], ...]], Plan] = {}
    out: list[Case] = []

    def run_segment(
        seg: Segment, arrays: Sequence[object], binds: Mapping[str, int]
    ) -> list[np.ndarray]:
        key = (seg.graph.id, tuple(sorted(binds.items())))
        host = [np.asarray(a) for a in arrays]
        p = plans.get(key)
        if p is None:
            p = plans[key] = plan(seg.graph, bindings=dict(binds), settings=settings)
            out.append(Case(f"{label}, segment {dict(binds)})", p, host, cap))
        return emulate(p, host)

    SegmentedRunner(run_segment).run(graph, inputs, batch)
    return out


def builtin_cases() -> list[Case]:
    """Past a grid of SMALL_CAP blocks: warp-per-row rows (RPB = 8, so > 64 rows), block-per-row
    rows (> 8), attention rows (8 per block), elementwise and gather grid-stride loops
    (> 8 · 256 items)."""
    rng = np.random.default_rng(11)

    def f32(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    cases: list[Case] = []
    for rows, cols, dt in ((300, 40, DType.F32), (20, 2100, DType.F32), (90, 33, DType.F16)):
        g = Graph()
        x = g.input(Shape.of(rows, cols), dt, "x")
        g.add_output(g.softmax(g.mul(x, 0.5), 1), "s")
        g.add_output(g.layernorm(x, 1, 1e-5), "l")
        g.add_output(g.reduce(x, [1], ReduceOp.SUM), "r")
        g.add_output(g.reduce(x, [1], ReduceOp.ARGMAX), "a")
        g.add_output(g.exp(g.permute(x, [1, 0])), "e")
        xs = [f32(rows, cols).astype(dt.np)]
        cases += plan_cases(f"rows {rows}x{cols} {dt}", g, xs, cap=SMALL_CAP)
    for dt, causal, masked in itertools.product(
        (DType.F32, DType.F16, DType.F64), (False, True), (False, True)
    ):
        shapes = {"q": (3, 50, 16), "k": (3, 60, 16), "v": (3, 60, 24), "m": (3, 50, 60)}
        if not masked:
            del shapes["m"]
        g = Graph()
        ins = {n: g.input(Shape.of(*sh), dt, n) for n, sh in shapes.items()}
        att = g.attention(ins["q"], ins["k"], ins["v"], ins.get("m"), 0.25, causal)
        g.add_output(att, "o")
        xs = [f32(*sh).astype(dt.np) for sh in shapes.values()]
        label = f"attention {dt} causal={causal} masked={masked}"
        settings = PlanSettings(fused_attention=True)
        cases.append(Case(label, plan(g, settings=settings), xs, SMALL_CAP))
    g = Graph()
    x = g.input(Shape.of(60, 70), DType.F32, "x")
    idx = g.input(Shape.of(50), DType.I64, "i")
    g.add_output(g.gather(x, 1, idx), "g")
    xs = [f32(60, 70), rng.integers(0, 70, 50)]
    cases += plan_cases("gather 60x50", g, xs, cap=SMALL_CAP)
    return cases


# -- the test corpus (tests/, from the repository root) ---------------------------------------
def corpus_cases(errors: list[str] | None = None) -> list[Case]:
    """The fixture models (as loaded and optimized, both bindings) and the plans the planner
    tests make. Imports `tests.kn_cuda_eval`: run from the repository root. A fixture that cannot
    be loaded or planned is appended to `errors` (raised when None)."""
    import importlib

    from tests.kn_cuda_eval.corpus import FIXTURES, cases

    out: list[Case] = []
    for fx in FIXTURES:
        try:
            for graph, feed, binds in cases(fx["name"]):
                out += plan_cases(f"{fx['name']} {binds}", graph, feed, bindings=binds)
        except KnError as e:
            if errors is None:
                raise
            errors.append(f"fixture {fx['name']}: {type(e).__name__}: {e}")
    for name in PLANNER_TESTS:
        out += harvest(importlib.import_module(f"tests.kn_cuda_eval.planning.{name}"))
    return out


def harvest(module: ModuleType) -> list[Case]:
    """Run every test of `module` (each parametrization) with a `check_plan` that plans the
    graph as the real one does and records the plans instead of checking them; tests that fail
    under it (they expect an error from the emulator, say) are left out, with a log line."""

    def recorder(label: str, sink: list[Case]) -> Callable[..., list[Plan]]:
        def record(
            graph: Graph, inputs: Inputs, *args: Any, expected: object = None, **kw: Any
        ) -> list[Plan]:
            """tests.kn_cuda_eval.helpers.check_plan's signature; `expected` is for checking."""
            snapshot = dict(inputs) if isinstance(inputs, Mapping) else list(inputs)
            got = plan_cases(label, graph, snapshot, *args, **kw)  # (tests reuse their lists)
            sink.extend(got)
            return [c.plan for c in got]

        return record

    return run_planner_tests(module, recorder, lambda p: distinct_kernels(plan_launches(p)))


def run_planner_tests(
    module: ModuleType,
    recorder: Callable[[str, list[Any]], Callable[..., list[Plan]]],
    compile_all: Callable[[Plan], object],
) -> list[Any]:
    """Every test of a planner test module (each parametrization) run with its `check_plan`
    replaced by `recorder(label, sink)` and its `compile_all` by `compile_all` (no NVRTC): what
    the recorders put in their sinks, for the tests that ran through; tests that fail under it
    (they expect an error from the emulator, say) are left out, with a log line."""
    out: list[Any] = []
    saved = {n: getattr(module, n) for n in ("check_plan", "compile_all") if hasattr(module, n)}
    if "compile_all" in saved:
        module.compile_all = compile_all  # type: ignore[attr-defined]
    try:
        for name, fn in vars(module).items():
            if not name.startswith("test_") or not callable(fn):
                continue
            for params in parametrizations(fn):
                test = name + (f"[{'-'.join(map(str, params.values()))}]" if params else "")
                sink: list[Any] = []
                module.check_plan = recorder(f"{module.__name__}::{test}", sink)  # type: ignore[attr-defined]
                try:
                    fn(**params)
                except (KeyboardInterrupt, SystemExit):
                    raise
                except BaseException as e:  # its assertions, pytest.raises/skip: not a plain run
                    log.info("%s::%s left out: %s: %s", module.__name__, test, type(e).__name__, e)
                    continue
                out += sink
    finally:
        for n, v in saved.items():
            setattr(module, n, v)
    return out


def parametrizations(fn: Callable[..., object]) -> list[dict[str, object]]:
    """The keyword arguments of every case of `@pytest.mark.parametrize` marks (their product)."""
    axes: list[list[dict[str, object]]] = []
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names, values = mark.args[0], mark.args[1]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        rows = []
        for v in values:
            if hasattr(v, "marks"):  # pytest.param(...)
                v = v.values if len(names) > 1 else v.values[0]
            rows.append(dict(zip(names, v if len(names) > 1 else (v,), strict=True)))
        axes.append(rows)
    return [
        dict(itertools.chain.from_iterable(d.items() for d in combo))
        for combo in itertools.product(*axes)
    ]


# -- running ----------------------------------------------------------------------------------
@dataclass
class Report:
    kernels: dict[str, list[str]]  # kernel name -> problems (empty: it matches)
    launches: int
    runs: int
    worst: dict[str, tuple[float, float]]  # kernel name -> (max error, tolerance)


def run_cases(cases: Sequence[Case], jobs: int | None = None) -> Report:
    """Compile every distinct kernel (in parallel), then check every case step by step; a launch
    that repeats one already run (`launch_key`: same kernel, sizes and strides, other buffers)
    is only emulated."""
    kernels = distinct_kernels(itertools.chain.from_iterable(c.launches() for c in cases))
    problems: dict[str, list[str]] = {k.name: [] for k in kernels}
    worst: dict[str, tuple[float, float]] = {}
    build_all(kernels, jobs)
    seen: set[tuple[object, ...]] = set()
    launches = 0
    for case in cases:
        launches += len(case.launches())
        try:
            with grid_cap(case.grid_cap):
                checks: list[StepCheck] = check_plan(case.plan, case.inputs, seen)
        except KnError as e:  # the emulator refused the case: every kernel of it is unproven
            for launch in case.launches():
                problems[launch.kernel.name].append(f"{case.label}: {e}")
            continue
        for c in checks:
            if c.problem is not None:
                problems[c.kernel].append(f"{case.label}, step {c.step}: {c.problem}")
            if c.error >= worst.get(c.kernel, (-1.0, 0.0))[0]:
                worst[c.kernel] = (c.error, c.tolerance)
    return Report(problems, launches, len(seen), worst)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m kn_cuda_eval.cuda.hostcheck.sweep",
        description="Run every generated kernel on the CPU (compiled with the system C++ "
        "compiler through kn_cuda_eval/cuda/hostcheck/include/cuda_host.h) and compare it with "
        "the plan emulator, step by step.",
        epilog="The last line is 'kernels executed on the host: M/N match' (N distinct kernels); "
        "the exit status is 0 iff every one matches and every fixture loads and plans.",
    )
    ap.add_argument(
        "--corpus",
        action="store_true",
        help="also the test corpus: the fixture models and the planner tests' plans (imports "
        "tests.kn_cuda_eval, so run from the repository root)",
    )
    ap.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: CPUs)")
    args = ap.parse_args(argv)
    why = unavailable()
    if why is not None:
        print(f"host kernel check skipped: {why}")
        return 0
    t0 = time.perf_counter()
    errors: list[str] = []
    cases = builtin_cases() + (corpus_cases(errors) if args.corpus else [])
    rep = run_cases(cases, args.jobs)
    bad = {k: v for k, v in rep.kernels.items() if v}
    for e in errors:
        print(f"NOT CHECKED {e}")
    for name, why in bad.items():
        print(f"MISMATCH {name}: {len(why)} failing launch(es), the first: {why[0]}")
    n = len(rep.kernels)
    top = sorted(rep.worst.items(), key=lambda kv: -kv[1][0] / max(kv[1][1], 1e-300))[:3]
    print(
        f"{len(cases)} plans, {rep.launches} kernel launches, {rep.runs} distinct launches run "
        f"on the host in {time.perf_counter() - t0:.1f} s; closest to the tolerance: "
        + ", ".join(f"{k} {e:.2g}/{t:.2g}" for k, (e, t) in top)
    )
    print(f"kernels executed on the host: {n - len(bad)}/{n} match")
    return 0 if not bad and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
