"""Kernel generation: `.cu` templates with strict `$NAME$` holes, C expression tables per op and
dtype, and NVRTC compilation to cubins (`compile.py`, imported lazily: it needs CuPy's NVRTC
binding but no GPU)."""

from kn_cuda_eval.cuda.kernels.dispatch import distinct_kernels, launch_for
from kn_cuda_eval.cuda.kernels.launch import FloatArg, IntArg, Kernel, KernelLaunch, PtrArg

__all__ = [
    "FloatArg",
    "IntArg",
    "Kernel",
    "KernelLaunch",
    "PtrArg",
    "distinct_kernels",
    "launch_for",
]
