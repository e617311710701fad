"""The system C compiler for the host steps: one shared library per set of kernels, cached on disk
(`$KN_KERNEL_CACHE/cpu`, beside the cubins) by a hash of the source, the compiler and its version,
the flags and the CPU's feature flags (`-march=native` code is only valid on the machine kind it
was built for), loaded with ctypes.

`compiler()` is `$CC`, else `cc`, `gcc` or `clang` — None when there is none (the executor then
runs those steps with NumPy). OpenMP (`-fopenmp`) and `_Float16` are probed once; without them
the library runs single-threaded, or with software f16 conversions.
"""

from __future__ import annotations

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
from importlib import resources
from pathlib import Path

from kn_cuda_eval.kernels.compile import cache_dir, numbered
from kn_graph.errors import KernelCompileError

__all__ = ["BASE_FLAGS", "compiler", "flags", "load_library", "prelude"]

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
    links, and `-DKN_SOFT_HALF` when `_Float16` is missing."""
    cc = compiler()
    assert cc is not None
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
    them into one shared library, or find it in the cache; load it. KernelCompileError with the
    log and the numbered source when the compiler rejects one."""
    cc = compiler()
    if cc is None:
        raise KernelCompileError("no C compiler (set $CC or install gcc)")
    fl = flags()
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
            _run(cc, [*fl, *map(str, objs), "-o", str(tmp), "-lm"], "", fl)
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
