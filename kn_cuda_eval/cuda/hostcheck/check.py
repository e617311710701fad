"""Each kernel step of a plan run on the host and compared with the emulator's result for that
step, both starting from the same arena (the emulator's, before the step).

The kernel's outputs are compared with a tolerance (below); every other byte of the arena must be
left exactly as the emulator leaves it, so a kernel writing outside its outputs (or into the
gaps of a strided output) is caught too.

Tolerances, as max |host - emulator| / max(1, max |emulator|) over each output (in brackets the
largest seen over `host_check --corpus`):
- integers and booleans: exact (0);
- f64: 1e-12 (2.2e-16) and f32: 1e-6 (1.3e-7 elementwise, 2e-7 reductions, 5.1e-7 layernorm),
  about 8 units in the last place at the output's scale: both sides round every operation, but
  glibc's libm and NumPy's vectorised functions may differ by an ulp, and reductions add in
  another order (per lane, then a butterfly, against NumPy's pairwise sums);
- f16 outputs: 2^-10 (1.4e-4), one f16 unit in the last place at the output's scale: both sides
  compute in f32 and round once to f16, and two f32 results an ulp apart round to neighbouring
  halves when they straddle a rounding boundary;
- f32 attention: 1e-5 (8.9e-7) — the kernel's online softmax rescales its running sum and
  accumulators by exp(m_old - m_new) at each new running maximum, one rounding more per key
  (up to n of them, an error growing like sqrt(n) ulps), where the emulator normalises once
  after the full maximum. f16 attention keeps the f16 tolerance (1.1e-4), f64 the f64 one (9e-16).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kn_cuda_eval.cuda.hostcheck.run import run_launch
from kn_cuda_eval.cuda.kernels.dispatch import launch_for
from kn_cuda_eval.cuda.kernels.launch import KernelLaunch, PtrArg
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.emulator import emulate_step, load_arena, view_array
from kn_cuda_eval.planning.plan import Plan
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType
from kn_graph.errors import EvaluationError

__all__ = [
    "ATTENTION_TOLERANCE",
    "TOLERANCE",
    "StepCheck",
    "check_plan",
    "difference",
    "launch_key",
    "tolerance",
]

TOLERANCE = {DType.F64: 1e-12, DType.F32: 1e-6, DType.F16: 2.0**-10}
ATTENTION_TOLERANCE = 1e-5
"""For f32 attention outputs (see the module docstring)."""


def tolerance(step: st.Step, v: StridedView) -> float:
    """The allowed difference for output `v` of `step` (0: exact)."""
    if isinstance(step, st.Attention) and v.dtype is DType.F32:
        return ATTENTION_TOLERANCE
    return TOLERANCE.get(v.dtype, 0.0)


@dataclass(frozen=True, slots=True)
class StepCheck:
    """One kernel step: its kernel, the largest difference found (relative to the output's
    scale) against the tolerance, and what went wrong (None when it matches)."""

    step: int
    kernel: str
    error: float
    tolerance: float
    problem: str | None

    @property
    def ok(self) -> bool:
        return self.problem is None


def launch_key(launch: KernelLaunch) -> tuple[object, ...]:
    """What decides a launch's path through its kernel: the kernel, the grid and block, every
    size, stride and scalar, and which pointers alias — not where the buffers happen to lie."""
    first: dict[int, int] = {}
    args = tuple(
        ("ptr", first.setdefault(a.offset, k)) if isinstance(a, PtrArg) else a
        for k, a in enumerate(launch.args)
    )
    return (launch.kernel.source, launch.grid, launch.block, launch.shared_mem, args)


def check_plan(
    plan: Plan,
    inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
    seen: set[tuple[object, ...]] | None = None,
) -> list[StepCheck]:
    """Emulate `plan` step by step; before each kernel step, run the kernel on the host over a
    copy of the arena and compare. Library steps (GEMMs, convolutions) are only emulated, and so
    are launches whose `launch_key` is in `seen` (which collects the keys of those run)."""
    arena = load_arena(plan, inputs)
    out: list[StepCheck] = []
    for k, s in enumerate(plan.steps):
        launch = launch_for(s, plan.status)
        key = None if launch is None or seen is None else launch_key(launch)
        if launch is None or (key is not None and key in seen):
            emulate_step(arena, k, s)
            continue
        if seen is not None:
            seen.add(key)
        host = arena.copy()
        emulate_step(arena, k, s)
        try:
            run_launch(launch, host)
        except EvaluationError as e:
            out.append(StepCheck(k, launch.kernel.name, float("inf"), 0.0, str(e)))
            continue
        out.append(_compare(k, launch.kernel.name, s, host, arena))
    return out


def _compare(k: int, name: str, s: st.Step, host: np.ndarray, emu: np.ndarray) -> StepCheck:
    worst, tol, problem = 0.0, 0.0, None
    for j, v in enumerate(s.writes()):
        if v.numel == 0:
            continue
        got, ref = view_array(host, v), view_array(emu, v)
        t = tolerance(s, v)
        err, why = difference(np.array(got), np.array(ref), t)
        if err >= worst:
            worst, tol = err, t
        if why is not None and problem is None:
            problem = f"output {j} {v}: {why}"
        got[...] = ref  # the outputs compared, every other byte must be equal
    if problem is None and not np.array_equal(host, emu):
        bad = np.flatnonzero(host != emu)
        problem = (
            f"{bad.size} bytes outside the step's outputs differ, the first at arena offset "
            f"{int(bad[0])} (host {int(host[bad[0]]):#04x}, emulator {int(emu[bad[0]]):#04x})"
        )
    return StepCheck(k, name, worst, tol, problem)


def difference(got: np.ndarray, ref: np.ndarray, tol: float) -> tuple[float, str | None]:
    """(max |got - ref| / max(1, max |ref|), why they differ beyond `tol` or None)."""
    if ref.dtype.kind != "f":
        bad = got != ref
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            return float(
                "inf"
            ), f"{int(bad.sum())} elements differ, first at {at}: {got[at]} vs {ref[at]}"
        return 0.0, None
    nan_g, nan_r = np.isnan(got), np.isnan(ref)
    if (nan_g != nan_r).any():
        at = tuple(int(i) for i in np.argwhere(nan_g != nan_r)[0])
        return float("inf"), f"NaN positions differ, first at {at}: {got[at]} vs {ref[at]}"
    inf = np.isinf(ref) | np.isinf(got)
    if (got[inf] != ref[inf]).any():
        return float("inf"), "infinities differ"
    fin = ~(nan_r | inf)
    if not fin.any():
        return 0.0, None
    g64, r64 = got[fin].astype(np.float64), ref[fin].astype(np.float64)
    err = float(np.max(np.abs(g64 - r64))) / max(1.0, float(np.max(np.abs(r64))))
    if err > tol:
        i = int(np.argmax(np.abs(g64 - r64)))
        return (
            err,
            f"max relative difference {err:.3g} > {tol:.3g} (host {g64[i]!r}, emulator {r64[i]!r})",
        )
    return err, None
