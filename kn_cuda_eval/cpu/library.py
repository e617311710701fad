"""The host executor's compiled steps: one shared library holding every distinct C kernel of
one or several plans (`csource` generates them, `build` compiles and loads the library), with
its step loop `kn_run` that also runs oneDNN's primitives.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from collections.abc import Sequence

from kn_cuda_eval.cpu import build, csource
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.plan import Plan

__all__ = ["HostLibrary", "no_compiler_note"]

log = logging.getLogger(__name__)


@functools.cache
def no_compiler_note() -> None:
    """Says once that fused steps run with NumPy for want of a C compiler."""
    log.warning(
        "no C compiler (set $CC or install gcc): the host executor runs fused steps with NumPy "
        "(slower, same results)"
    )


class HostLibrary:
    """Compiled kernels: one shared library holding every distinct kernel of the given calls
    (a plan's, or several plans' — tests share one library over a corpus)."""

    def __init__(self, kernels: Sequence[csource.CKernel]) -> None:
        uniq: dict[str, csource.CKernel] = {}
        for k in kernels:
            uniq.setdefault(k.name, k)
        self.kernels = list(uniq.values())
        self.index = {k.name: i for i, k in enumerate(self.kernels)}
        parts = min(os.cpu_count() or 1, (len(self.kernels) + 15) // 16)  # a compiler per core
        self.sources = csource.library_sources(self.kernels, build.prelude(), parts)
        lib = build.load_library(self.sources)
        self.run = lib.kn_run
        self.run.restype = ctypes.c_int
        self.run.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        self.run.argtypes += [ctypes.c_void_p, ctypes.c_void_p]
        self.one = lib.kn_one
        self.one.restype = ctypes.c_int
        self.one.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        self.set_threads = lib.kn_set_threads
        self.set_threads.restype, self.set_threads.argtypes = None, [ctypes.c_int]
        self.openmp = bool(lib.kn_openmp())
        self.set_dnnl = lib.kn_set_dnnl
        self.set_dnnl.restype, self.set_dnnl.argtypes = None, [ctypes.c_void_p]
        self.set_sgemm = lib.kn_set_sgemm
        self.set_sgemm.restype, self.set_sgemm.argtypes = None, [ctypes.c_void_p]
        self.last_status = lib.kn_last_status
        self.last_status.restype, self.last_status.argtypes = ctypes.c_int, []
        self._lib = lib

    @staticmethod
    def for_plans(plans: Sequence[Plan], extra: Sequence[st.Step] = ()) -> HostLibrary | None:
        """One library for every fused step of `plans` (and of `extra` steps); None without a
        C compiler."""
        if build.compiler() is None:
            no_compiler_note()
            return None
        kernels = []
        for steps in [*(p.steps for p in plans), extra]:
            for s in steps:
                c = csource.step_call(s)
                if c is not None:
                    kernels.append(c.kernel)
        return HostLibrary(kernels)
