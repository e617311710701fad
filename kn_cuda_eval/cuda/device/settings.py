"""`ExecutorSettings`: the switches of the CUDA executor. Pure data, importable without a GPU."""

from __future__ import annotations

from dataclasses import dataclass, field

from kn_cuda_eval.planning.settings import PlanSettings

__all__ = ["ExecutorSettings"]

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class ExecutorSettings:
    """How a `CudaExecutor` runs a plan. The defaults are exact F32 with CUDA graphs."""

    cuda_graphs: bool = True
    """After one warm-up evaluation, capture the step list into a CUDA graph and replay it: one
    launch per evaluation instead of one Python call per step. Off: every step is launched from
    Python on every evaluation (the fallback when capture fails, too)."""
    tf32: bool = False
    """Let F32 GEMMs and convolutions use TF32 tensor cores (about 1e-3 relative error). Off by
    default: F32 stays F32 (cuBLAS COMPUTE_32F, cuDNN FMA math)."""
    plan: PlanSettings = field(default_factory=PlanSettings)
    """Planner switches, for executors built from a graph."""
    poison: bool = True
    """Fill the arena with 0xFF bytes (NaN) once at allocation, as the emulator does, so a read of
    memory nothing wrote shows up as NaN instead of a plausible stale value."""
    cublas_workspace: int = 32 * MiB
    """Bytes of the arena handed to cuBLAS as its workspace (32 MiB is NVIDIA's advice for Hopper),
    so that cuBLAS never allocates while a CUDA graph is captured."""
    conv_workspace_limit: int = 1024 * MiB
    """The largest cuDNN workspace one convolution may ask for; algorithms needing more are
    skipped. The arena holds max(workspace) of the chosen algorithms, shared by all convs."""
    compile_threads: int = 8
    """Threads compiling distinct kernels with NVRTC at construction."""
