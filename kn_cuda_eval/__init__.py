"""kn_cuda_eval — the CUDA planner: `plan(graph, batch_size) -> Plan` (pure Python, no GPU), the
plan emulator `emulate(plan, inputs)` (NumPy over a byte arena), generated kernels compiled with
NVRTC (`kn_cuda_eval.kernels`), and the host side of the cuDNN binding (`kn_cuda_eval.cudnn`).

Nothing here imports CuPy or loads a CUDA library at import time.
"""

from kn_cuda_eval.emulator import emulate
from kn_cuda_eval.memory import Buffer, BufferKind, MemoryReport
from kn_cuda_eval.plan import Plan, plan
from kn_cuda_eval.planner import PlanSettings
from kn_cuda_eval.steps import Step
from kn_cuda_eval.view import StridedView

__all__ = [
    "Buffer",
    "BufferKind",
    "MemoryReport",
    "Plan",
    "PlanSettings",
    "Step",
    "StridedView",
    "emulate",
    "plan",
]
