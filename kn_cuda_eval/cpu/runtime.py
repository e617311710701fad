"""Process-wide setup the host executor needs before it builds anything: the thread count, the
threads' wait policy (set before oneDNN loads libgomp), NumPy's BLAS threads, and whether
oneDNN is usable here (one log line when it is not).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable

from kn_cuda_eval.cpu import build, onednn

__all__ = ["blas_threads", "default_threads", "onednn_usable", "wait_policy"]

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


WAIT_POLICIES = ("auto", "active", "passive")
_policy: list[str] = []  # the process's, once chosen
_policy_lock = threading.Lock()


def wait_policy(threads: int | None = None) -> str:
    """How the host executor's threads wait between parallel regions, chosen once per process
    (libgomp reads it when it loads) by the first executor, whose `threads` it weighs:

    - "active": libgomp's threads spin `build.ACTIVE_SPIN_NS` after a region, and the C steps'
      parallel loops run on that same OpenMP team (`build.omp_pool`), so every region of an
      evaluation, oneDNN's or ours, finds its threads awake. On an idle VM each wake-up of a
      halted core costs tens of microseconds, twice a region: a ResNet-50 on 2 threads took
      37-42 ms passive against 21-24 active (onnxruntime, whose pool spins: 20-23).
    - "passive": libgomp's threads sleep at once (`build.GOMP_SPIN_NS`) and the C steps run on
      the process's pool (`build.pool`, a short spin of its own). On a loaded machine a spinning
      thread holds the core the thread it waits for is queued on: with libgomp's default spin
      the GPT-2 fixture took 32 ms instead of 0.14 ms on 2 busy cores.
    - "auto" (the default, `KN_CPU_WAIT` chooses): active when the cores this process may use
      have `threads` idle ones (the first executor's threads; /proc/stat over 50 ms), else
      passive.

    A policy the user set for libgomp (`OMP_WAIT_POLICY`, `GOMP_SPINCOUNT`) is kept, and so is
    libgomp's default when another library loaded it first; the C steps then follow it."""
    with _policy_lock:
        if not _policy:
            _policy.append(_choose_policy(threads))
            if _policy[0] == "active":
                build.use_openmp_team()
        return _policy[0]


def _choose_policy(threads: int | None) -> str:
    asked = os.environ.get("KN_CPU_WAIT", "auto").strip().lower() or "auto"
    if asked not in WAIT_POLICIES:
        log.warning("KN_CPU_WAIT=%r is not one of %s: using auto", asked, WAIT_POLICIES)
        asked = "auto"
    spin = os.environ.get("GOMP_SPINCOUNT")
    policy = os.environ.get("OMP_WAIT_POLICY")
    if spin is not None or policy is not None:
        return "active" if _libgomp_spins(spin, policy) else "passive"
    if _mapped("libgomp"):
        log.info(
            "libgomp was loaded before the host executor: its wait policy stays the default "
            "(set KN_CPU_WAIT or GOMP_SPINCOUNT before importing libraries that use OpenMP)"
        )
        return "active"
    if asked == "auto":
        want = default_threads() if threads is None else max(1, threads)
        idle = _idle_cores()
        asked = "active" if idle is None or idle >= want - 0.5 else "passive"
        log.debug("wait policy %s: %s idle cores for %d threads", asked, idle, want)
    tp = build.pool()
    pause_ns = tp.pause_ns if tp is not None else build.ASSUMED_PAUSE_NS
    spin_ns = build.ACTIVE_SPIN_NS if asked == "active" else build.GOMP_SPIN_NS
    os.environ["GOMP_SPINCOUNT"] = str(round(spin_ns / pause_ns))
    return asked


def _libgomp_spins(spin: str | None, policy: str | None) -> bool:
    """Whether libgomp spins after a region under these settings (GOMP_SPINCOUNT wins; its
    default, 300000 pauses, is a spin)."""
    if spin is not None:
        s = spin.strip().lower()
        if s == "infinite" or s == "infinity":
            return True
        try:
            return float(s.rstrip("kmgt") or "0") > 0  # libgomp's k/M/G/T suffixes
        except ValueError:
            pass
    return (policy or "").strip().lower() != "passive"


def _idle_cores(window_s: float = 0.05) -> float | None:
    """Idle cores among those this process may use, from /proc/stat's per-CPU counters over
    `window_s` (they count 10 ms ticks: 50 ms gives each CPU five); None where there is no
    /proc/stat."""
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        allowed = set(range(os.cpu_count() or 1))

    def read() -> dict[int, tuple[int, int]]:
        out: dict[int, tuple[int, int]] = {}
        with open("/proc/stat") as f:
            for line in f:
                if not line.startswith("cpu") or line.startswith("cpu "):
                    continue
                name, *fields = line.split()
                cpu = int(name[3:])
                if cpu in allowed:
                    v = [int(x) for x in fields[:8]]
                    out[cpu] = (sum(v), v[3] + v[4])  # total, idle + iowait
        return out

    try:
        a = read()
        time.sleep(window_s)
        b = read()
    except (OSError, ValueError):
        return None
    idle = 0.0
    for cpu, (total, free) in b.items():
        t0, f0 = a.get(cpu, (total, free))
        dt = total - t0
        idle += (free - f0) / dt if dt > 0 else 1.0
    return idle


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
    libgomp: its wait policy is chosen first (`wait_policy`)."""
    wait_policy()
    why = onednn.available()
    if why is not None:
        _onednn_note(why)
        return False
    return True


@functools.cache
def _onednn_note(why: str) -> None:
    log.warning("oneDNN is not usable (%s): convolutions and GEMMs run with NumPy", why)
