"""The system C compiler for the host steps: one shared library per set of kernels, cached on disk
(`$KN_KERNEL_CACHE/cpu`, beside the cubins) by a hash of the source, the compiler and its version,
the flags and the CPU's feature flags (`-march=native` code is only valid on the machine kind it
was built for), loaded with ctypes.

`compiler()` is `$CC`, else `cc`, `gcc` or `clang` — None when there is none (the executor then
runs those steps with NumPy). OpenMP (`-fopenmp`) and `_Float16` are probed once; without
`_Float16` the kernels convert f16 in software.

`pool()` is the process's thread pool for the parallel loops of those libraries (`pool.c`,
compiled without OpenMP), and every library `load_library` loads is bound to it; its
`pause_ns` is the CPU's spin-wait instruction timed once, so that spins are bounded in time, not
in a count tuned on one CPU (the pool's, and libgomp's `GOMP_SPINCOUNT`, set by the executor).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kn_cuda_eval.codegen.cache import cache_dir, numbered
from kn_graph.errors import KernelCompileError

__all__ = [
    "ACTIVE_SPIN_NS",
    "ASSUMED_PAUSE_NS",
    "BASE_FLAGS",
    "GOMP_SPIN_NS",
    "POOL_SPIN_NS",
    "Pool",
    "compiler",
    "flags",
    "load_library",
    "load_source",
    "omp_pool",
    "pool",
    "prelude",
    "use_openmp_team",
]

log = logging.getLogger(__name__)

BASE_FLAGS = (
    "-std=gnu11",
    "-O3",
    "-shared",
    "-fPIC",
    "-fwrapv",  # integer arithmetic wraps, as on the GPU and in NumPy
    "-fno-strict-aliasing",
    "-fno-math-errno",  # results unchanged; lets sqrt, floor, ... vectorize
    "-fno-trapping-math",  # results unchanged; lets selects be if-converted
    "-ffp-contract=fast",
    "-w",
)


@functools.cache
def compiler() -> str | None:
    """The C compiler's path, or None when there is none."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name:
            path = shutil.which(name)
            if path is not None:
                return path
    return None


@functools.cache
def prelude() -> str:
    return resources.files("kn_cuda_eval.cpu").joinpath("prelude.h").read_text()


def _try(cc: str, args: list[str], source: str) -> bool:
    with tempfile.TemporaryDirectory(prefix="kn_probe_") as d:
        src = Path(d) / "probe.c"
        src.write_text(source)
        r = subprocess.run(
            [cc, *args, str(src), "-o", str(Path(d) / "probe.so")],
            capture_output=True,
            check=False,
        )
        return r.returncode == 0


@functools.cache
def flags() -> tuple[str, ...]:
    """The flags this compiler takes: the base set, `-march=native` when it works, OpenMP when it
    links, and `-DKN_SOFT_HALF` when `_Float16` is missing. Three test compilations (0.1-0.6 s),
    so the answer is kept on disk beside the compiled libraries, keyed by what it depends on
    (`_identity`: the compiler, its version, the CPU's features, and the base flags)."""
    cc = compiler()
    assert cc is not None
    key = hashlib.sha256(f"{_identity()}|{BASE_FLAGS}".encode()).hexdigest()[:32]
    path = cache_dir() / "cpu" / f"flags-{key}.txt"
    try:
        kept = path.read_text().split("\n")
        if kept[: len(BASE_FLAGS)] == list(BASE_FLAGS):
            return tuple(kept)
    except OSError:
        pass
    out = list(BASE_FLAGS)
    if _try(cc, [*out, "-march=native"], "int f(void) { return 0; }\n"):
        out.append("-march=native")
    omp = "#include <omp.h>\nint f(void) { return omp_get_max_threads(); }\n"
    if _try(cc, [*out, "-fopenmp"], omp):
        out.append("-fopenmp")
    else:
        log.info("the C compiler %s has no OpenMP: host steps run on one thread", cc)
    if not _try(cc, out, "_Float16 f(float x) { return (_Float16)x; }\n"):
        out.append("-DKN_SOFT_HALF")
    with contextlib.suppress(OSError):  # a read-only cache only costs the probes next time
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text("\n".join(out))
        os.replace(tmp, path)
    return tuple(out)


@functools.cache
def _identity() -> str:
    """Compiler version and CPU features: what a cached library's validity depends on."""
    cc = compiler()
    assert cc is not None
    r = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False)
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features", "model name")):
                cpu += line + "\n"
                if line.startswith(("flags", "Features")):
                    break
    except OSError:
        import platform

        cpu = platform.processor() or platform.machine()
    return f"{cc}\n{r.stdout.splitlines()[0] if r.stdout else ''}\n{cpu}"


_loaded: dict[str, ctypes.CDLL] = {}


def load_library(sources: Sequence[str]) -> ctypes.CDLL:
    """Compile the translation units `sources` (in parallel, one compiler per core) and link
    them into one shared library, or find it in the cache; load it, and bind it to the thread
    pool when it has `kn_bind_pool` (`csource.library_sources`). KernelCompileError with the
    log and the numbered source when the compiler rejects one."""
    lib = _load(sources, flags())
    bind = getattr(lib, "kn_bind_pool", None)
    points = _bound_pool() if bind is not None else None
    if bind is not None and points is not None:
        bind.restype, bind.argtypes = None, [ctypes.c_void_p] * 4
        bind(*points)
    return lib


_ACTIVE: list[bool] = []  # the wait policy's choice (`use_openmp_team`), once made


def use_openmp_team() -> None:
    """Bind the plan libraries loaded from now on to OpenMP's team (`omp_pool`): the active wait
    policy, chosen by `runtime.wait_policy` before the first executor compiles anything."""
    _ACTIVE[:] = [True]


def _bound_pool() -> tuple[int, int, int, int] | None:
    """The entry points plan libraries are bound to: OpenMP's team under the active wait policy
    (`omp_pool`), else the process's pool."""
    if _ACTIVE:
        points = omp_pool()
        if points is not None:
            return points
    tp = pool()
    return tp.entry_points if tp is not None else None


def load_source(name: str) -> ctypes.CDLL:
    """A hand-written C file of this package (`recurrence.c`) compiled alone, without OpenMP
    (cached on disk like the kernels); KernelCompileError as `load_library`."""
    src = resources.files("kn_cuda_eval.cpu").joinpath(name).read_text()
    return _load([src], [f for f in flags() if f != "-fopenmp"])


def _load(sources: Sequence[str], fl: Sequence[str]) -> ctypes.CDLL:
    cc = compiler()
    if cc is None:
        raise KernelCompileError("no C compiler (set $CC or install gcc)")
    h = hashlib.sha256("\x00".join(sources).encode())
    h.update(f"|{_identity()}|{fl}".encode())
    key = h.hexdigest()
    hit = _loaded.get(key)
    if hit is not None:
        return hit
    path = cache_dir() / "cpu" / key[:2] / f"{key}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="kn_cc_", dir=path.parent) as d:
            objs = [Path(d) / f"unit{i}.o" for i in range(len(sources))]
            compile_flags = [f for f in fl if f != "-shared"]

            def one(i: int) -> None:
                src = Path(d) / f"unit{i}.c"
                src.write_text(sources[i])
                _run(cc, [*compile_flags, "-c", str(src), "-o", str(objs[i])], sources[i], fl)

            with ThreadPoolExecutor(
                max_workers=max(1, min(len(sources), os.cpu_count() or 1))
            ) as ex:
                list(ex.map(one, range(len(sources))))
            tmp = Path(d) / "plan.so"
            _run(cc, [*fl, *map(str, objs), "-o", str(tmp), "-lm", "-lpthread"], "", fl)
            os.replace(tmp, path)
    lib = ctypes.CDLL(str(path))
    _loaded[key] = lib
    return lib


def _run(cc: str, args: list[str], source: str, fl: Sequence[str]) -> None:
    r = subprocess.run([cc, *args], capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise KernelCompileError(
            f"{cc} failed to compile the host steps ({' '.join(fl)}):\n--- log ---\n"
            f"{r.stderr[-20000:]}\n--- source ---\n{numbered(source)}"
        )


GOMP_SPIN_NS = 0
"""How long libgomp's threads (oneDNN's team) spin after a region before they sleep under the
passive wait policy (`runtime.wait_policy`); the executor sets `GOMP_SPINCOUNT` to the pauses
that take this long on this CPU (`Pool.spins`). None: measured on the stand-ins beside the pool
(2 threads, a shared 2-core EPYC, load 2-9), every microsecond of it costs: the ResNet-18
stand-in 0.9-1.0 ms at 0, 1.0-1.2 at 5 µs, 1.3 at 8 µs, 2.3-2.5 at 30 µs, 6.4 at 130 µs
(MobileNetV2 1.5-1.7 / 2.0-2.2 / - / 4.6 / -; BERT 0.8-0.9 / 0.8-0.9 / 1.0 / 1.5 / 4.0). On a
loaded machine the worker a spinning thread waits for is queued on the spinner's own core, so
the spin is on the critical path of every region; the C steps no longer need the team (the pool
spins for them), and oneDNN's regions are long enough in real-size models that a futex wake-up
(~20 µs here) is a few percent. On an idle machine a 20000-pause spin halves a 17 µs region
(`GOMP_SPINCOUNT` overrides this)."""

ACTIVE_SPIN_NS = 200_000
"""How long libgomp's threads spin after a region before they sleep under the active wait policy
(an idle machine: `runtime.wait_policy`), where they also run the C steps (`omp_pool`): long
enough to bridge the gaps between the regions of one evaluation, short enough that a process
between evaluations gives its cores back at once. On the shipped corpus (2-core AVX-512 VM, 2
threads) 200 µs and 2 ms gave the same geomean against onnxruntime (0.98 each; 50 µs: ResNet-50
1.16 instead of 1.03), and the int8 OCR model whose convolutions fall back to BLAS ran 62 ms at
200 µs against 129 at 2 ms; libgomp's own default is 300000 pauses (8 ms on an AMD EPYC)."""

ASSUMED_PAUSE_NS = 30.0
"""The pause latency `GOMP_SPIN_NS` is converted with where it cannot be timed (no compiler):
25-50 ns on recent x86 cores, a few ns on older Intel ones."""

POOL_SPIN_NS = 10_000
"""How long the pool's threads spin waiting before they sleep on a futex (the workers between
jobs, the caller for chunks still running): the next C step of the step loop comes within a
few microseconds, and the workers sleep at once when a oneDNN step comes (parked). Longer
costs on a loaded machine: on a chain of 41 C steps (128x768 layernorm, softmax, GELU; 2
threads, load 4-5) with 50 µs the worker took part in 10-50% of the jobs, sleeping at once
80%; yielding the core while spinning, 10% (18.6 ms an evaluation, 10.8-11.3 ms sleeping at
once or spinning 2.5-10 µs, 18-19 ms on one thread)."""


@dataclass(frozen=True)
class Pool:
    """The loaded pool library (`pool.c`), with the CPU's pause latency it measured."""

    lib: ctypes.CDLL
    pause_ns: float

    @property
    def entry_points(self) -> tuple[int, int, int, int]:
        """Addresses of kn_pool_run, kn_pool_next, kn_pool_park and kn_pool_threads."""
        return _entry_points(self.lib, "kn_pool_")

    def workers(self) -> int:
        """Worker threads started so far (the calling threads of jobs come on top)."""
        return int(self.lib.kn_pool_workers())

    def spins(self, ns: float) -> int:
        """Pause instructions that take about `ns` nanoseconds on this CPU."""
        return max(0, round(ns / self.pause_ns))


@functools.cache
def pool() -> Pool | None:
    """The process's thread pool, compiled once (cached like the kernels) without OpenMP, so
    that loading it does not load libgomp; None without a compiler, off Linux (no futex: the
    steps then run on the calling thread), or when it does not build (logged)."""
    if compiler() is None:
        return None
    src = resources.files("kn_cuda_eval.cpu").joinpath("pool.c").read_text()
    fl = [f for f in flags() if f != "-fopenmp"] + ["-pthread"]
    try:
        lib = _load(["#define KN_POOL_SOURCE\n" + prelude() + "\n" + src], fl)
    except KernelCompileError as e:
        log.warning("the host thread pool does not build: C steps run on one thread (%s)", e)
        return None
    lib.kn_pool_pause_ns.restype = ctypes.c_double
    lib.kn_pool_usable.restype = ctypes.c_int
    lib.kn_pool_workers.restype = ctypes.c_int
    lib.kn_pool_set_spin.argtypes = [ctypes.c_longlong]
    if not lib.kn_pool_usable():
        log.info("no futex on this system: C steps run on one thread")
        return None
    p = Pool(lib, max(0.1, float(lib.kn_pool_pause_ns())))
    lib.kn_pool_set_spin(p.spins(POOL_SPIN_NS))
    return p


def _entry_points(lib: ctypes.CDLL, prefix: str) -> tuple[int, int, int, int]:
    names = ("run", "next", "park", "threads")
    return tuple(  # type: ignore[return-value]
        ctypes.cast(getattr(lib, prefix + n), ctypes.c_void_p).value for n in names
    )


@functools.cache
def omp_pool() -> tuple[int, int, int, int] | None:
    """Entry points (run, next, park, threads) that run the C steps' parallel loops on OpenMP's
    team (`ompool.c`), the one oneDNN runs on, for the active wait policy; None without OpenMP
    or a compiler. Loading it loads libgomp: only once the policy has set GOMP_SPINCOUNT."""
    if compiler() is None or "-fopenmp" not in flags():
        return None
    src = resources.files("kn_cuda_eval.cpu").joinpath("ompool.c").read_text()
    try:
        lib = _load(
            ["#define _GNU_SOURCE\n#define KN_POOL_SOURCE\n" + prelude() + "\n" + src], flags()
        )
    except KernelCompileError as e:
        log.warning("the OpenMP pool does not build: C steps use the process's pool (%s)", e)
        return None
    return _entry_points(lib, "kn_omp_")
