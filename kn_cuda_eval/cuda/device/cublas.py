"""The `ctypes` binding of the cuBLAS CuPy has loaded (host side): handle, stream, workspace,
math mode and the two GEMMs the executor issues, every prototype declared, every status checked.

Why not CuPy's wrappers (checked in CuPy 14.2's `cupy_backends/cuda/libs/cublas.pyx`):
`cublas.setStream` raises NotImplementedError on a capturing stream, and `gemmEx` /
`gemmStridedBatchedEx` first re-point the handle at CuPy's *current* stream (the legacy stream
0), which overrides ours and resets the workspace. So no GEMM could be captured in a CUDA graph
and every eager one raced with the kernels on the executor's non-blocking stream. Here the C API
is called directly: per GEMM `cublasSetStream_v2`, then `cublasSetWorkspace_v2` (SetStream
resets the workspace to cuBLAS's own pool), then the GEMM.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import re
from ctypes import POINTER, c_char_p, c_int, c_longlong, c_size_t, c_void_p
from pathlib import Path
from typing import Any

from kn_graph.errors import CudaUnavailableError, KnError

__all__ = ["PROTOTYPES", "CublasError", "CublasLib", "find_cublas", "load_cublas"]

log = logging.getLogger(__name__)

CUBLAS_DEFAULT_MATH = 0  # cublasMath_t: F32 stays F32 unless a call's compute type says TF32

_H = c_void_p  # cublasHandle_t (an opaque pointer); cudaStream_t likewise
_P = c_void_p  # device or host data pointers
_STATUS = c_int  # cublasStatus_t
_E = c_int  # cublasOperation_t, cudaDataType, cublasComputeType_t, cublasGemmAlgo_t, cublasMath_t
_LL = c_longlong

# cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
#     cublasOperation_t transb, int m, int n, int k, const void* alpha,
#     const void* A, cudaDataType Atype, int lda, const void* B, cudaDataType Btype, int ldb,
#     const void* beta, void* C, cudaDataType Ctype, int ldc,
#     cublasComputeType_t computeType, cublasGemmAlgo_t algo)
_GEMM_EX = (
    _H, _E, _E, c_int, c_int, c_int, _P,
    _P, _E, c_int,
    _P, _E, c_int,
    _P, _P, _E, c_int,
    _E, _E,
)  # fmt: skip
# cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
#     cublasOperation_t transb, int m, int n, int k, const void* alpha,
#     const void* A, cudaDataType Atype, int lda, long long int strideA,
#     const void* B, cudaDataType Btype, int ldb, long long int strideB,
#     const void* beta, void* C, cudaDataType Ctype, int ldc, long long int strideC,
#     int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo)
_GEMM_STRIDED_BATCHED_EX = (
    _H, _E, _E, c_int, c_int, c_int, _P,
    _P, _E, c_int, _LL,
    _P, _E, c_int, _LL,
    _P, _P, _E, c_int, _LL,
    c_int, _E, _E,
)  # fmt: skip

# Prototypes as cublas_api.h (cuBLAS 12 and 13) declares them; each comment is the C signature.
PROTOTYPES: dict[str, tuple[Any, tuple[Any, ...]]] = {
    # cublasStatus_t cublasCreate_v2(cublasHandle_t* handle)
    "cublasCreate_v2": (_STATUS, (POINTER(c_void_p),)),
    # cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
    "cublasDestroy_v2": (_STATUS, (_H,)),
    # cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int* version)
    "cublasGetVersion_v2": (_STATUS, (_H, POINTER(c_int))),
    # const char* cublasGetStatusName(cublasStatus_t status)
    "cublasGetStatusName": (c_char_p, (c_int,)),
    # const char* cublasGetStatusString(cublasStatus_t status)
    "cublasGetStatusString": (c_char_p, (c_int,)),
    # cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
    "cublasSetMathMode": (_STATUS, (_H, _E)),
    # cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId)
    "cublasSetStream_v2": (_STATUS, (_H, c_void_p)),
    # cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace,
    #                                      size_t workspaceSizeInBytes)
    "cublasSetWorkspace_v2": (_STATUS, (_H, _P, c_size_t)),
    "cublasGemmEx": (_STATUS, _GEMM_EX),
    "cublasGemmStridedBatchedEx": (_STATUS, _GEMM_STRIDED_BATCHED_EX),
}


class CublasError(KnError):
    """A cuBLAS call returned an error status; the message names the call and the status."""

    def __init__(self, function: str, status: int, text: str) -> None:
        self.function = function
        self.status = status
        super().__init__(f"{function} failed with status {status} ({text})")


class CublasLib:
    """A loaded (or stand-in) libcublas with every prototype declared. `call(name, *args)`
    raises CublasError on a non-zero status."""

    def __init__(self, lib: Any, path: str = "") -> None:
        self.lib = lib
        self.path = path
        for name, (restype, argtypes) in PROTOTYPES.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = list(argtypes)

    def call(self, name: str, *args: Any) -> None:
        if name not in PROTOTYPES:
            raise KeyError(f"{name} has no declared prototype")
        status = getattr(self.lib, name)(*args)
        if status != 0:
            raise CublasError(name, int(status), self.status_text(int(status)))

    def status_text(self, status: int) -> str:
        try:
            name = self.lib.cublasGetStatusName(status)
            text = self.lib.cublasGetStatusString(status)
        except Exception as e:  # an error while describing an error: keep the number
            return f"no description: {type(e).__name__}"
        return " ".join(x.decode() if isinstance(x, bytes) else str(x) for x in (name, text))

    def create_handle(self) -> int:
        """A new handle with the default math mode (F32 stays F32)."""
        h = c_void_p()
        self.call("cublasCreate_v2", ctypes.byref(h))
        self.call("cublasSetMathMode", h.value, CUBLAS_DEFAULT_MATH)
        return int(h.value or 0)

    def version(self, handle: int) -> int:
        v = c_int()
        self.call("cublasGetVersion_v2", handle, ctypes.byref(v))
        return int(v.value)


_LOADED = re.compile(r"\s(/\S*/libcublas\.so(?:\.\d+)*)$")


def _loaded_paths(maps: str) -> list[str]:
    """Paths of libcublas (not libcublasLt) mapped into this process, from /proc/self/maps."""
    out: list[str] = []
    for line in maps.splitlines():
        m = _LOADED.search(line)
        if m and m.group(1) not in out:
            out.append(m.group(1))
    return out


def find_cublas() -> tuple[str, str]:
    """(path, how it was found) of the libcublas to bind: the copy already loaded in this
    process (CuPy's, mapped in /proc/self/maps, or by soname without loading another), else the
    one cuda.pathfinder loads. CudaUnavailableError lists every attempt when none works."""
    tried: list[str] = []
    try:
        paths = _loaded_paths(Path("/proc/self/maps").read_text())
    except OSError as e:
        paths = []
        tried.append(f"/proc/self/maps: {e}")
    if paths:
        if len(paths) > 1:
            log.warning("several libcublas are loaded (%s); binding the first", ", ".join(paths))
        return paths[0], "already loaded"
    tried.append("no libcublas mapped in this process")
    for soname in ("libcublas.so.13", "libcublas.so.12"):
        try:
            ctypes.CDLL(soname, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            tried.append(f"{soname}: not loaded")
            continue
        return soname, "already loaded (soname)"
    try:
        import cuda.pathfinder as pf

        loaded = pf.load_nvidia_dynamic_lib("cublas")
        if loaded.abs_path:
            return str(loaded.abs_path), f"cuda.pathfinder ({loaded.found_via})"
        tried.append("cuda.pathfinder: no path")
    except Exception as e:
        tried.append(f"cuda.pathfinder: {type(e).__name__}: {e}")
    raise CudaUnavailableError(
        "cuBLAS (libcublas) could not be found: " + "; ".join(tried) + "; install the 'cuda12' "
        "or 'cuda13' extra"
    )


@functools.cache
def load_cublas() -> CublasLib:
    """The binding over `find_cublas()`'s library (CudaUnavailableError when absent)."""
    path, how = find_cublas()
    try:
        lib = CublasLib(ctypes.CDLL(path), path)
    except (OSError, AttributeError) as e:
        raise CudaUnavailableError(f"cuBLAS at {path} is not usable: {e}") from e
    log.info("cuBLAS: %s (%s)", path, how)
    return lib
