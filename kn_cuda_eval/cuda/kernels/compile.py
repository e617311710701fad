"""NVRTC compilation of generated kernels to cubins — no GPU needed, so CI compiles every kernel.

`compile_kernel(kernel, arch)` returns a `CompiledKernel` (cubin bytes and the ptxas resource
usage), cached in memory and on disk by (source, arch, NVRTC version). Always a cubin for an
explicit `-arch=sm_XY`, never PTX: PTX from an NVRTC newer than the driver does not load.
The cache directory is `$KN_KERNEL_CACHE`, else `~/.cache/kyanite/kernels`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import threading
from dataclasses import dataclass

from kn_cuda_eval.codegen.cache import cache_dir, numbered
from kn_cuda_eval.cuda.kernels.launch import Kernel
from kn_graph.errors import CudaUnavailableError, KernelCompileError

__all__ = ["CompiledKernel", "compile_kernel", "nvrtc_version", "supported_archs"]

_OPTIONS = ("--std=c++17", "--ptxas-options=-v", "-default-device")


@dataclass(frozen=True, slots=True)
class CompiledKernel:
    name: str
    arch: int
    cubin: bytes
    registers: int
    spill_bytes: int
    log: str


def _nvrtc():  # type: ignore[no-untyped-def]
    try:
        from cupy.cuda import nvrtc
    except Exception as e:  # ImportError, or CuPy failing to find NVRTC
        raise CudaUnavailableError(
            f"NVRTC is not available ({type(e).__name__}: {e}); install the 'nvrtc' extra "
            "(or 'cuda12'/'cuda13')"
        ) from e
    return nvrtc


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    return tuple(_nvrtc().getVersion())  # type: ignore[return-value]


@functools.cache
def supported_archs() -> tuple[int, ...]:
    return tuple(int(a) for a in _nvrtc().getSupportedArchs())


@functools.cache
def _include_dir() -> str:
    try:
        import cuda.pathfinder as pf

        d = pf.find_nvidia_header_directory("cudart")
    except Exception as e:
        raise CudaUnavailableError(
            f"cannot locate the CUDA runtime headers with cuda.pathfinder: {e}"
        ) from e
    if d is None:
        raise CudaUnavailableError(
            "the CUDA runtime headers (cuda_fp16.h) were not found; install nvidia-cuda-runtime"
        )
    return str(d)


def clamp_arch(arch: int) -> int:
    """The device's architecture clamped to the newest one this NVRTC supports."""
    archs = supported_archs()
    ok = [a for a in archs if a <= arch]
    if not ok:
        raise KernelCompileError(
            f"sm_{arch} is older than every architecture NVRTC supports ({archs})"
        )
    return max(ok)


_memory: dict[str, CompiledKernel] = {}
_lock = threading.Lock()
_USAGE = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _key(kernel: Kernel, arch: int) -> str:
    h = hashlib.sha256(kernel.source.encode())
    h.update(f"|sm_{arch}|nvrtc{nvrtc_version()}|{_OPTIONS}".encode())
    return h.hexdigest()


def compile_kernel(kernel: Kernel, arch: int) -> CompiledKernel:
    """The cubin of `kernel` for sm_`arch` (e.g. 80, 90); raises KernelCompileError with the log
    and the numbered source when NVRTC rejects it."""
    key = _key(kernel, arch)
    hit = _memory.get(key)
    if hit is not None:
        return hit
    path = cache_dir() / key[:2] / key
    try:
        meta = json.loads(path.with_suffix(".json").read_text())
        ck = CompiledKernel(
            kernel.name,
            arch,
            path.with_suffix(".cubin").read_bytes(),
            meta["registers"],
            meta["spill_bytes"],
            meta["log"],
        )
    except (OSError, ValueError, KeyError):
        ck = _compile(kernel, arch)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(ck.cubin)
            tmp.replace(path.with_suffix(".cubin"))
            meta = {
                "name": ck.name,
                "registers": ck.registers,
                "spill_bytes": ck.spill_bytes,
                "log": ck.log,
            }
            tmp.write_text(json.dumps(meta))
            tmp.replace(path.with_suffix(".json"))
        except OSError:
            pass  # a read-only cache only costs time
    with _lock:
        _memory[key] = ck
    return ck


def _compile(kernel: Kernel, arch: int) -> CompiledKernel:
    nvrtc = _nvrtc()
    opts = [f"-arch=sm_{arch}", *_OPTIONS]
    if "#include <cuda_fp16.h>" in kernel.source:  # only f16 kernels need the runtime headers
        opts.append(f"-I{_include_dir()}")
    prog = nvrtc.createProgram(kernel.source, f"{kernel.name}.cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as e:
            log = nvrtc.getProgramLog(prog)
            raise KernelCompileError(
                f"NVRTC failed to compile {kernel.name} for sm_{arch}: {e}\n--- log ---\n{log}\n--- source ---\n{numbered(kernel.source)}"
            ) from None
        log = nvrtc.getProgramLog(prog)
        cubin = bytes(nvrtc.getCUBIN(prog))
    finally:
        nvrtc.destroyProgram(prog)
    regs = max((int(x) for x in _USAGE.findall(log)), default=0)
    spills = max((int(a) + int(b) for a, b in _SPILL.findall(log)), default=0)
    return CompiledKernel(kernel.name, arch, cubin, regs, spills, log)
