"""Process-wide setup the host executor needs before it builds anything: the thread count,
libgomp's wait policy (set before oneDNN loads it), NumPy's BLAS threads, and whether oneDNN is
usable here (one log line when it is not).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable

from kn_cuda_eval.cpu import build, onednn

__all__ = ["blas_threads", "default_threads", "onednn_usable", "passive_openmp"]

log = logging.getLogger(__name__)


def default_threads() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _mapped(fragment: str) -> bool:
    """Whether a shared object whose path contains `fragment` is loaded in this process."""
    try:
        with open("/proc/self/maps") as f:
            return any(fragment in line for line in f)
    except OSError:
        return False


@functools.cache
def passive_openmp() -> None:
    """libgomp's threads (oneDNN's team; the C steps have the pool) spin `build.GOMP_SPIN_NS`
    after a region, then sleep: `GOMP_SPINCOUNT` is set to the pauses that take that long on
    this CPU (timed once, `build.pool().pause_ns`), unless the user chose a policy. A count
    tuned on one CPU is another time on the next: 20000, meant as 20-50 µs, is 0.5 ms on an AMD
    EPYC (PAUSE ~25 ns). libgomp's default spins about 300k pauses (8 ms there), and a spinning
    thread takes the core from the thread that runs the next step or, on a loaded machine, from
    the team's own thread it waits for (queued on the spinner's core): on 2 busy cores GPT-2
    (fixture) took 32 ms instead of 0.14 ms, the ResNet-18 stand-in 30-60 ms with 20000 pauses
    against 1 ms with none. libgomp reads the variable when it loads, so this runs before the
    first library that needs it does (`onednn_usable`); the pool library that times the CPU has no
    OpenMP."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return
    if _mapped("libgomp"):
        log.info(
            "libgomp was loaded before the host executor: its wait policy stays the default "
            "(set GOMP_SPINCOUNT=0 before importing libraries that use OpenMP)"
        )
        return
    tp = build.pool()
    pause_ns = tp.pause_ns if tp is not None else build.ASSUMED_PAUSE_NS
    os.environ["GOMP_SPINCOUNT"] = str(round(build.GOMP_SPIN_NS / pause_ns))


@functools.cache
def blas_threads() -> Callable[[int], None]:
    """The setter of NumPy's BLAS threads: threadpoolctl's when installed, else OpenBLAS's own
    (`onednn.blas_thread_setter`)."""
    try:
        from threadpoolctl import threadpool_limits  # type: ignore[import-not-found]

        return lambda n: threadpool_limits(n, user_api="blas")  # type: ignore[no-any-return]
    except ImportError:
        pass
    return onednn.blas_thread_setter()


def onednn_usable() -> bool:
    """Whether oneDNN runs here; when not, one log line says why. Loading oneDNN loads
    libgomp: its spin count is set first (`passive_openmp`)."""
    passive_openmp()
    why = onednn.available()
    if why is not None:
        _onednn_note(why)
        return False
    return True


@functools.cache
def _onednn_note(why: str) -> None:
    log.warning("oneDNN is not usable (%s): convolutions and GEMMs run with NumPy", why)
