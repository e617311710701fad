"""Every generated kernel executed on the CPU: each `.cu` source compiled as C++ with the system
compiler through a CUDA-semantics header of our own (`include/cuda_host.h`: every thread a fiber
of `runtime.cpp`, barriers and warp operations in lockstep, a software half), launched exactly as
planned over a NumPy arena laid out like the plan's, and compared with the emulator step by step.
`python -m kn_cuda_eval.cuda.hostcheck.sweep` runs it over every kernel the tests generate."""

from kn_cuda_eval.cuda.hostcheck.check import StepCheck, check_plan, launch_key, tolerance
from kn_cuda_eval.cuda.hostcheck.compile import HostKernel, build, build_all, compiler, unavailable
from kn_cuda_eval.cuda.hostcheck.run import pack_args, run_launch

__all__ = [
    "HostKernel",
    "StepCheck",
    "build",
    "build_all",
    "check_plan",
    "compiler",
    "launch_key",
    "pack_args",
    "run_launch",
    "tolerance",
    "unavailable",
]
