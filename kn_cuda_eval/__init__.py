"""kn_cuda_eval — one plan, two backends. `plan(graph, batch_size) -> Plan` (pure Python, no
GPU) and the plan emulator `emulate(plan, inputs)` are the device-neutral part
(`kn_cuda_eval.planning`); `kn_cuda_eval.codegen` prints fused steps for both backends; the CUDA
backend (`kn_cuda_eval.cuda`: kernels, executor, cuDNN, cuBLAS, the host kernel checker) and the CPU
backend (`kn_cuda_eval.cpu`: executor, plan passes, C source, oneDNN) each run a `Plan`.
docs/architecture.md says where each kind of change goes.

Nothing here imports CuPy or loads a CUDA library at import time.
"""

from kn_cuda_eval.planning.emulator import emulate
from kn_cuda_eval.planning.memory import Buffer, BufferKind, MemoryReport
from kn_cuda_eval.planning.plan import Plan, plan
from kn_cuda_eval.planning.settings import PlanSettings
from kn_cuda_eval.planning.steps import Step
from kn_cuda_eval.planning.view import StridedView
from kn_graph._moved import install as _install_moved

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

_install_moved()  # old module paths keep working for one release, with a warning
