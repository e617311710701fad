"""How much arithmetic a plan does: a rough count of operations per evaluation (multiply-adds
of convolutions, GEMMs and attention counted twice, one per element read or written by the
other steps). A backend uses it to size its parallelism: a plan too small to share among
threads runs on one, since waking a pool costs more than it saves."""

from __future__ import annotations

from collections.abc import Iterable

from kn_cuda_eval.planning import steps as st

__all__ = ["plan_work", "step_work"]


def step_work(s: object) -> int:
    """Operations of one step (see the module docstring)."""
    match s:
        case st.MatMul():
            return 2 * s.m * s.n * s.k * s.batch
        case st.IntMatMul():
            return 2 * s.out.numel * s.a.shape[2]
        case st.BlockQuantMatMul():
            return 2 * s.out.numel * s.a.shape[1]
        case st.Conv() | st.IntConv():
            per_output = s.w.numel // max(1, s.w.shape[0])
            return 2 * s.out.numel * per_output
        case st.Attention():
            return 4 * s.q.numel * s.k.shape[-2]
        case _:
            reads = getattr(s, "reads", None)
            writes = getattr(s, "writes", None)
            views = [*(reads() if reads else ()), *(writes() if writes else ())]
            return sum(v.numel for v in views)


def plan_work(plan_steps: Iterable[object]) -> int:
    """Operations of every step of a plan (`plan.steps`)."""
    return sum(step_work(s) for s in plan_steps)
