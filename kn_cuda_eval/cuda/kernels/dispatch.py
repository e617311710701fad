"""`launch_for(step)`: the generated kernel and launch of a step, or None for library steps
(cuBLAS GEMMs and cuDNN convolutions)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import assert_never

from kn_cuda_eval.cuda.kernels.attention import attention_launch
from kn_cuda_eval.cuda.kernels.elementwise import copy_launch, elementwise_launch, gather_launch
from kn_cuda_eval.cuda.kernels.launch import Kernel, KernelLaunch
from kn_cuda_eval.cuda.kernels.rows import layernorm_launch, reduce_launch, softmax_launch
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.plan import Plan
from kn_cuda_eval.planning.view import StridedView
from kn_graph.errors import PlanError

__all__ = ["distinct_kernels", "launch_for", "plan_launches"]


def launch_for(step: st.Step, status: StridedView) -> KernelLaunch | None:
    match step:
        case st.Elementwise():
            return elementwise_launch(step)
        case st.Copy():
            return copy_launch(step)
        case st.Gather():
            return gather_launch(step, status)
        case st.Softmax():
            return softmax_launch(step)
        case st.Layernorm():
            return layernorm_launch(step)
        case st.Reduce():
            return reduce_launch(step)
        case st.Attention():
            return attention_launch(step)
        case st.MatMul() | st.Conv():
            return None
        case st.IntMatMul() | st.IntConv() | st.BlockQuantMatMul():  # CUDA plans lower them
            raise PlanError(f"no CUDA kernel for the integer step {step.describe()}")
        case _:
            assert_never(step)


def plan_launches(plan: Plan) -> list[KernelLaunch]:
    """The launches of a plan's generated kernels, one per step that has one (in step order)."""
    out: list[KernelLaunch] = []
    for s in plan.steps:
        launch = launch_for(s, plan.status)
        if launch is not None:
            out.append(launch)
    return out


def distinct_kernels(launches: Iterable[KernelLaunch]) -> list[Kernel]:
    """Each kernel once (by source), in first-use order."""
    seen: dict[str, Kernel] = {}
    for launch in launches:
        seen.setdefault(launch.kernel.source, launch.kernel)
    return list(seen.values())
