"""kn_cuda_eval.cuda.device — the CUDA executor. The only package that touches CuPy, cuBLAS and
cuDNN, and only lazily: importing it (or `ExecutorSettings`, `bind`, `Profile`) needs no GPU.

    CudaExecutor(graph, batch_size, device=0).eval(inputs)   # plan, bind, run on the device
    probe(index) -> str | None                               # why CUDA is unusable, or None
    cudnn_problem() -> str | None                            # why convolutions cannot run

Layers: `calls.bind(plan)` turns the plan into a launch list (pure, tested on the CPU);
`executor.CudaExecutor` executes it through `api.DeviceApi` (CuPy); `conv.CudnnBackend` runs
the convolutions. `python -m kn_cuda_eval.cuda.device` prints the versions of the GPU stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kn_cuda_eval.cuda.device.calls import LaunchList, bind
from kn_cuda_eval.cuda.device.probe import cudnn_problem, device_count, probe, versions
from kn_cuda_eval.cuda.device.settings import ExecutorSettings
from kn_cuda_eval.planning.profile import Profile

if TYPE_CHECKING:
    from kn_cuda_eval.cuda.device.executor import CudaExecutor

__all__ = [
    "CudaExecutor",
    "ExecutorSettings",
    "LaunchList",
    "Profile",
    "bind",
    "cudnn_problem",
    "device_count",
    "probe",
    "versions",
]


def __getattr__(name: str) -> Any:
    if name == "CudaExecutor":  # imported on first use: CuPy loads only then
        from kn_cuda_eval.cuda.device.executor import CudaExecutor

        return CudaExecutor
    raise AttributeError(f"module 'kn_cuda_eval.cuda.device' has no attribute '{name}'")
