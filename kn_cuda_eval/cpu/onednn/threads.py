"""Thread control for oneDNN's primitives and NumPy's BLAS. oneDNN 3 has no
`dnnl_set_num_threads`; with the OpenMP runtime the number is OpenMP's, so a runner calls
`omp_set_num_threads(threads)` of the libgomp the library linked (the one already loaded) before
it creates its primitive and before each run (a no-op after the first). The BLAS path sets
OpenBLAS's threads the same way.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import re
from collections.abc import Callable
from ctypes import c_int
from pathlib import Path

import numpy as np

from kn_cuda_eval.cpu.onednn.lib import load_dnnl

__all__ = ["blas_thread_setter", "omp_thread_setter", "thread_count"]

log = logging.getLogger(__name__)


def _loaded(pattern: str) -> str | None:
    """The path of the first shared object mapped into this process matching `pattern`."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/maps").read_text().splitlines():
            m = re.search(r"\s(/\S*/" + pattern + r")$", line)
            if m:
                return m.group(1)
    return None


@functools.cache
def omp_thread_setter() -> Callable[[int], None]:
    """`omp_set_num_threads` of the libgomp oneDNN loaded (loading oneDNN first); a no-op with a
    warning when there is none."""
    load_dnnl()  # its libgomp is then loaded: bind that copy, not another
    path = _loaded(r"libgomp[^/]*\.so[.\d]*") or "libgomp.so.1"
    try:
        f = ctypes.CDLL(path).omp_set_num_threads
    except (OSError, AttributeError) as e:
        log.warning("oneDNN: no omp_set_num_threads (%s); threads stay OpenMP's default", e)
        return lambda n: None
    f.restype, f.argtypes = None, [c_int]
    return f


@functools.cache
def blas_thread_setter() -> Callable[[int], None]:
    """OpenBLAS's thread setter of the library NumPy loaded (numpy's wheels: scipy_openblas)."""
    np.matmul(np.ones((2, 2)), np.ones((2, 2)))  # make sure the BLAS is mapped
    path = _loaded(r"lib\S*openblas\S*\.so[.\d]*")
    if path is not None:
        lib = ctypes.CDLL(path)
        for name in (
            "scipy_openblas_set_num_threads64_",
            "scipy_openblas_set_num_threads",
            "openblas_set_num_threads64_",
            "openblas_set_num_threads",
        ):
            f = getattr(lib, name, None)
            if f is not None:
                f.restype, f.argtypes = None, [c_int]
                return f
    log.info("no OpenBLAS thread setter found; BLAS GEMMs use its default threads")
    return lambda n: None


def thread_count(threads: int) -> int:
    """`threads`, or the cores this process may run on when it is not positive."""
    n = int(threads)
    return n if n > 0 else max(1, len(os.sched_getaffinity(0)))
