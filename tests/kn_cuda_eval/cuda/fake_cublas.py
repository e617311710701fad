"""A fake cuBLAS over the fake device's memory (`fake_device.FakeApi`): the C functions, whose
calls are interpreted from their raw column-major arguments on the stream and workspace the handle
holds, and `FakeCupyCublas`, CuPy's own cuBLAS module, which behaves as CuPy 14.2's (no calls
during capture, GEMMs re-pointed at the legacy stream), so that code using it fails as on the
device. What it computes comes from plain NumPy.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kn_cuda_eval.cuda.device.calls import (
    CUBLAS_COMPUTE_32F,
    CUBLAS_COMPUTE_32F_FAST_TF32,
    CUBLAS_COMPUTE_64F,
    CUBLAS_OP_N,
    CUBLAS_OP_T,
    CUDA_R_16F,
    CUDA_R_32F,
    CUDA_R_64F,
)
from kn_cuda_eval.cuda.device.cublas import PROTOTYPES as CUBLAS_PROTOTYPES
from tests.kn_cuda_eval.cuda.fake_ffi import _Fn, _v
from tests.kn_cuda_eval.cuda.fake_runtime import LEGACY_STREAM, FakeDevice

_BLAS_NP = {CUDA_R_32F: np.float32, CUDA_R_64F: np.float64, CUDA_R_16F: np.float16}
CUPY_CAPTURE_ERROR = "calling cuBLAS API during stream capture is currently unsupported"


@dataclass(frozen=True)
class GemmRecord:
    """One GEMM as the library saw it when it was issued."""

    function: str
    stream: int
    """The stream the handle pointed at."""
    workspace: tuple[int, int] | None
    """The user workspace (pointer, bytes) set on the handle; None: cuBLAS's own pool."""
    compute: int
    captured: bool
    thread: int = 0
    """The host thread that issued it."""


class FakeCublasC:
    """libcublas's C functions — the prototypes of `kn_cuda_eval.cuda.device.cublas`, whose argtypes
    convert every argument as ctypes would — over the fake memory. The handle keeps what the real
    library keeps (stream, user workspace, math mode; cublasSetStream_v2 resets the workspace to
    cuBLAS's own pool); GEMMs are interpreted from their raw column-major arguments, computed
    with NumPy on the stream the handle points at, and recorded in `gemms`."""

    def __init__(self, api: FakeDevice) -> None:
        self.api = api
        self.streams: dict[int, int] = {}
        self.workspaces: dict[int, tuple[int, int]] = {}
        self.math: dict[int, int] = {}
        self.gemms: list[GemmRecord] = []
        self.fail: dict[str, int] = {}  # GEMM function -> the status it returns (injected)
        self.preempt: Callable[[], None] | None = None  # called after every SetStream
        self.next = 0x5000
        for name in CUBLAS_PROTOTYPES:
            setattr(self, name, _Fn(getattr(self, "_" + name), strict=True))

    def _cublasCreate_v2(self, out: Any) -> int:
        self.next += 1
        out._obj.value = self.next
        self.math[self.next] = 0
        return 0

    def _cublasDestroy_v2(self, h: Any) -> int:
        return 0 if self.math.pop(_v(h), None) is not None else 1  # NOT_INITIALIZED

    def _cublasGetVersion_v2(self, h: Any, out: Any) -> int:
        out._obj.value = 130100
        return 0

    def _cublasGetStatusName(self, status: int) -> bytes:
        return f"FAKE_CUBLAS_STATUS_{status}".encode()

    def _cublasGetStatusString(self, status: int) -> bytes:
        return b"fake status"

    def _cublasSetMathMode(self, h: Any, mode: int) -> int:
        if _v(h) not in self.math:
            return 1
        self.math[_v(h)] = mode
        return 0

    def _cublasSetStream_v2(self, h: Any, stream: Any) -> int:
        if _v(h) not in self.math:
            return 1
        self.api.stream_by_ptr(_v(stream))
        self.streams[_v(h)] = _v(stream)
        self.workspaces.pop(_v(h), None)  # as cuBLAS: back to its own workspace pool
        if self.preempt is not None:
            self.preempt()
        return 0

    def _cublasSetWorkspace_v2(self, h: Any, ptr: Any, nbytes: int) -> int:
        if _v(h) not in self.math:
            return 1
        if nbytes:
            self.api.mem.find(_v(ptr), nbytes)
        self.workspaces[_v(h)] = (_v(ptr), nbytes)
        return 0

    def _cublasGemmEx(self, *args: Any) -> int:
        h, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc, comp, _ = args
        g = (h, ta, tb, m, n, k, alpha, a, at, lda, 0, b, bt, ldb, 0, beta, c, ct, ldc, 0, 1, comp)
        return self._gemm("cublasGemmEx", *g)

    def _cublasGemmStridedBatchedEx(self, *args: Any) -> int:
        return self._gemm("cublasGemmStridedBatchedEx", *args[:-1])

    def _gemm(self, fn: str, *args: Any) -> int:
        (
            h,
            ta,
            tb,
            m,
            n,
            k,
            alpha,
            a,
            at,
            lda,
            sa,
            b,
            bt,
            ldb,
            sb,
            beta,
            c,
            ct,
            ldc,
            sc,
            batch,
            comp,
        ) = args
        api = self.api
        h, alpha, beta, a, b, c = (_v(x) for x in (h, alpha, beta, a, b, c))
        if h not in self.math:
            return 1
        if fn in self.fail:
            return self.fail[fn]
        assert at == bt == ct, "mixed GEMM types"
        assert ta in (CUBLAS_OP_N, CUBLAS_OP_T) and tb in (CUBLAS_OP_N, CUBLAS_OP_T)
        dt = np.dtype(_BLAS_NP[at])
        allowed = (
            {CUBLAS_COMPUTE_64F}
            if dt == np.float64
            else {CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_FAST_TF32}
        )
        assert comp in allowed, (comp, dt)
        scalar = ctypes.c_double if comp == CUBLAS_COMPUTE_64F else ctypes.c_float
        al = scalar.from_address(alpha).value  # host pointer mode: read when the call is made
        be = scalar.from_address(beta).value
        stream = api.stream_by_ptr(self.streams.get(h, LEGACY_STREAM))
        ws = self.workspaces.get(h)
        self.gemms.append(
            GemmRecord(
                fn, stream.ptr, ws, comp, stream.capturing is not None, threading.get_ident()
            )
        )

        def mat(ptr: int, rows: int, cols: int, ld: int, sbatch: int) -> np.ndarray:
            size = dt.itemsize
            span = ((batch - 1) * sbatch + (cols - 1) * ld + rows) * size
            block, off = api.mem.find(ptr, span)
            return np.ndarray(
                (batch, rows, cols),
                dt,
                buffer=block,
                offset=off,
                strides=(sbatch * size, size, ld * size),
            )

        def op() -> None:
            ra, ca = (m, k) if ta == CUBLAS_OP_N else (k, m)
            rb, cb = (k, n) if tb == CUBLAS_OP_N else (n, k)
            am = mat(a, ra, ca, lda, sa)
            bm = mat(b, rb, cb, ldb, sb)
            cm = mat(c, m, n, ldc, sc)
            opa = am if ta == CUBLAS_OP_N else am.transpose(0, 2, 1)
            opb = bm if tb == CUBLAS_OP_N else bm.transpose(0, 2, 1)
            ctp = np.float64 if dt == np.float64 else np.float32
            with np.errstate(all="ignore"):
                r = np.matmul(opa.astype(ctp), opb.astype(ctp)) * ctp(al)
                if be != 0:
                    r = r + ctp(be) * cm.astype(ctp)
            cm[...] = r.astype(dt)

        stream.submit(op)
        return 0


class FakeCupyCublas:
    """`cupy.cuda.cublas` as CuPy 14.2 behaves (`cupy_backends/cuda/libs/cublas.pyx`), over the
    same fake library: `setStream` raises NotImplementedError on a capturing stream, and
    `gemmEx` / `gemmStridedBatchedEx` first `setStream(handle, current stream)` — the legacy
    stream here, which also drops the workspace — then call the C function. Code that issues
    GEMMs through it fails as it would on the device; `calls` names every use."""

    def __init__(self, c: FakeCublasC) -> None:
        self.c = c
        self.calls: list[str] = []

    def _check(self, status: int) -> None:
        if status:
            raise RuntimeError(f"CUBLAS_STATUS {status}")  # CuPy's CUBLASError

    def create(self) -> int:
        self.calls.append("create")
        out = ctypes.c_void_p()
        self._check(self.c.cublasCreate_v2(ctypes.byref(out)))
        return int(out.value or 0)

    def setMathMode(self, handle: int, mode: int) -> None:
        self.calls.append("setMathMode")
        self._check(self.c.cublasSetMathMode(handle, mode))

    def getVersion(self, handle: int) -> int:
        self.calls.append("getVersion")
        return 130100

    def setStream(self, handle: int, stream: int) -> None:
        self.calls.append("setStream")
        if self.c.api.stream_by_ptr(stream).capturing is not None:
            raise NotImplementedError(CUPY_CAPTURE_ERROR)
        self._check(self.c.cublasSetStream_v2(handle, stream))

    def gemmEx(self, *args: Any) -> None:
        self.calls.append("gemmEx")
        self.setStream(args[0], LEGACY_STREAM)  # CuPy's _setStream(handle)
        self._check(self.c.cublasGemmEx(*args))

    def gemmStridedBatchedEx(self, *args: Any) -> None:
        self.calls.append("gemmStridedBatchedEx")
        self.setStream(args[0], LEGACY_STREAM)
        self._check(self.c.cublasGemmStridedBatchedEx(*args))
