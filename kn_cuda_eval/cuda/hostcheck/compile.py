"""Generated kernels compiled for the host: each `.cu` source as C++ through `cuda_host.h` (the
CUDA semantics of our own), one shared object per kernel, cached on disk by source hash beside
the cubins (`$KN_KERNEL_CACHE/host`) and loaded with ctypes. The fiber runtime the header
declares (`runtime.cpp`) is compiled once, cached the same way, and loaded first, globally, so
every kernel's shared object binds to it; the header is precompiled once too (it is most of a
kernel's compile time).

The compiler is `$CXX`, else `g++`, else `c++`; `unavailable()` says why host kernels cannot run
(no compiler, not x86-64), and callers skip with one line.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kn_cuda_eval.codegen.cache import cache_dir, numbered
from kn_cuda_eval.cuda.kernels.launch import Kernel
from kn_graph.errors import KernelCompileError

__all__ = [
    "FLAGS",
    "HostKernel",
    "build",
    "build_all",
    "compiler",
    "include_dir",
    "unavailable",
]

FLAGS = (
    "-std=c++17",
    "-O1",
    "-shared",
    "-fPIC",
    "-fwrapv",  # integer arithmetic wraps, as on the GPU (and in NumPy)
    "-fno-strict-aliasing",  # kn_bitcast reinterprets through a pointer
    "-ffp-contract=off",  # no FMA contraction: each operation rounds, as in the emulator
    "-w",
)
"""Host compile flags. NVRTC contracts a·b + c into FMAs by default; the host does not, so the
check is against exactly rounded operations, as the NumPy emulator computes them."""


@functools.cache
def compiler() -> str | None:
    """The C++ compiler's path, or None when there is none."""
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and (path := shutil.which(name)):
            return path
    return None


def unavailable() -> str | None:
    """Why host kernels cannot run here (None: they can)."""
    if compiler() is None:
        return "no C++ compiler (set $CXX or install g++)"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the fiber runtime switches stacks for x86-64 only, not {platform.machine()}"
    return None


@functools.cache
def _compiler_version() -> str:
    cxx = compiler()
    if cxx is None:
        raise KernelCompileError("no C++ compiler (set $CXX, or install g++)")
    return subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout


def _here() -> Path:
    return Path(str(resources.files("kn_cuda_eval.cuda.hostcheck")))


def include_dir() -> Path:
    """Where `cuda_host.h` (and the host's stand-in `cuda_fp16.h`) live."""
    return _here() / "include"


@functools.cache
def _digest() -> str:
    """Of everything a kernel's object depends on besides its source."""
    h = hashlib.sha256()
    for p in [*sorted(include_dir().glob("*.h")), _here() / "runtime.cpp"]:
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    h.update(f"|{FLAGS}|{_compiler_version()}".encode())
    return h.hexdigest()


def _cached(key: str) -> Path:
    return cache_dir() / "host" / key[:2] / f"{key}.so"


@functools.cache
def _runtime() -> ctypes.CDLL:
    """The fiber runtime, loaded globally; the precompiled header is made beside it."""
    path = _cached(hashlib.sha256(f"runtime|{_digest()}".encode()).hexdigest())
    if not path.exists():
        _compile("the kernel runtime", (_here() / "runtime.cpp").read_text(), path)
    pch = _pch_dir() / "cuda_host.h.gch"
    if not pch.exists():
        pch.parent.mkdir(parents=True, exist_ok=True)
        tmp = pch.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        _run(
            [*FLAGS, "-x", "c++-header", str(include_dir() / "cuda_host.h"), "-o", str(tmp)],
            "cuda_host.h",
        )
        tmp.replace(pch)
    return ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)


def _pch_dir() -> Path:
    return cache_dir() / "host" / f"pch-{_digest()[:16]}"


def _translation_unit(kernel: Kernel) -> str:
    """The kernel's source between our header and its export (line numbers kept)."""
    return (
        '#include "cuda_host.h"\n'
        f'#line 1 "{kernel.name}.cu"\n'
        f"{kernel.source}\n"
        f"KN_HOST_EXPORT({kernel.name})\n"
    )


def _key(kernel: Kernel) -> str:
    h = hashlib.sha256(_translation_unit(kernel).encode())
    h.update(f"|{_digest()}".encode())
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class HostKernel:
    """A kernel compiled for the host: `entry` is its `kn_host_launch(const LaunchDesc*)`."""

    kernel: Kernel
    path: Path
    entry: ctypes._CFuncPtr


_loaded: dict[str, HostKernel] = {}


def build(kernel: Kernel) -> HostKernel:
    """Compile (or find in the cache) and load `kernel`; a compile error raises
    KernelCompileError with the compiler's output and the numbered source."""
    key = _key(kernel)
    hit = _loaded.get(key)
    if hit is not None:
        return hit
    path = _cached(key)
    if not path.exists():
        try:
            _compile(kernel.name, _translation_unit(kernel), path)
        except KernelCompileError as e:
            raise KernelCompileError(f"{e}\n--- source ---\n{numbered(kernel.source)}") from None
    _runtime()
    lib = ctypes.CDLL(str(path))
    entry = lib.kn_host_launch
    entry.argtypes = [ctypes.c_void_p]
    entry.restype = ctypes.c_int
    hk = HostKernel(kernel, path, entry)
    _loaded[key] = hk
    return hk


def build_all(kernels: Sequence[Kernel], jobs: int | None = None) -> list[HostKernel]:
    """`build` every kernel, compiling `jobs` at a time (default: one per CPU)."""
    workers = jobs or os.cpu_count() or 1
    _runtime()  # once, before the kernels that bind to it
    with ThreadPoolExecutor(max_workers=workers) as pool:  # the work is in g++ processes
        return list(pool.map(build, kernels))


def _run(args: list[str], what: str) -> None:
    cxx = compiler()
    if cxx is None:
        raise KernelCompileError("no C++ compiler (set $CXX, or install g++)")
    res = subprocess.run([cxx, *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise KernelCompileError(
            f"{Path(cxx).name} failed to compile {what} for the host\n--- log ---\n{res.stderr}"
        )


def _compile(what: str, source: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        src = Path(tmp) / "unit.cpp"
        src.write_text(source)
        out = Path(tmp) / "unit.so"
        # the precompiled header is found first (an unusable one is skipped: the header is read)
        _run([*FLAGS, f"-I{_pch_dir()}", f"-I{include_dir()}", str(src), "-o", str(out)], what)
        out.replace(path)  # atomic: a concurrent build of the same kernel lands the same bytes
