"""A CPU stand-in for the CUDA device (`FakeApi`, a `DeviceApi`), so that the executor's own logic
— allocation layout, uploads, pinned staging, argument packing, stream capture and replay, the
status word, profiling — runs in CI without a GPU.

It is strict where the device is: memory lives at fake 64-bit addresses (a pointer outside every
allocation raises), kernel launches are decoded from the packed parameter block exactly as the
driver reads it and must match a call of the launch list, cuBLAS C calls are interpreted from their
raw column-major arguments on the stream and workspace the handle holds (and `blas`, CuPy's own
cuBLAS module, behaves as CuPy 14.2's: no calls during capture, GEMMs re-pointed at the legacy
stream), cuDNN calls from the descriptors set through the ctypes binding, and
synchronous calls during a capture fail as they do on CUDA. A handle's stream is its state, read
when a call is issued: `preempt` (on the fake cuBLAS and cuDNN) runs right after every
SetStream, so a test can switch threads there and catch two executors racing on one handle. What it computes comes from the
emulator (kernels) or from plain NumPy (libraries) — so it proves the plumbing, not the kernels.
"""

from __future__ import annotations

import bisect
import ctypes
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from kn_cuda_eval.cuda.cudnn.lib import PROTOTYPES, ActivationMode, ConvFwdAlgo, CudnnLib, MathType
from kn_cuda_eval.cuda.device.api import D2D, D2H, H2D, DeviceArray
from kn_cuda_eval.cuda.device.calls import (
    CUBLAS_COMPUTE_32F,
    CUBLAS_COMPUTE_32F_FAST_TF32,
    CUBLAS_COMPUTE_64F,
    CUBLAS_OP_N,
    CUBLAS_OP_T,
    CUDA_R_16F,
    CUDA_R_32F,
    CUDA_R_64F,
    KernelCall,
    LaunchList,
    c_parameters,
)
from kn_cuda_eval.cuda.device.cublas import PROTOTYPES as CUBLAS_PROTOTYPES
from kn_cuda_eval.cuda.device.cublas import CublasLib
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.emulator import _conv, _step
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType

BASE = 0x9000_0000_0000_0000  # non-canonical on x86-64: never a host address
GUARD = 1 << 20


class FakeCudaError(RuntimeError):
    pass


# -- memory ----------------------------------------------------------------------------------------
class Memory:
    """Device allocations at fake addresses, 1 MiB apart."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.blocks: list[np.ndarray] = []
        self.next = BASE

    def alloc(self, n: int) -> int:
        start = self.next
        self.starts.append(start)
        self.blocks.append(np.zeros(max(n, 1), np.uint8))
        self.next = (start + max(n, 1) + GUARD + 255) // 256 * 256
        return start

    def find(self, ptr: int, n: int) -> tuple[np.ndarray, int]:
        """The block holding [ptr, ptr + n) and ptr's offset in it."""
        i = bisect.bisect_right(self.starts, ptr) - 1
        if i < 0:
            raise FakeCudaError(f"illegal address {ptr:#x}")
        off = ptr - self.starts[i]
        block = self.blocks[i]
        if off + n > block.size:
            raise FakeCudaError(f"access [{ptr:#x}, +{n}) outside its allocation of {block.size} B")
        return block, off

    def bytes(self, ptr: int, n: int) -> np.ndarray:
        block, off = self.find(ptr, n)
        return block[off : off + n]

    def is_device(self, ptr: int) -> bool:
        return ptr >= BASE


# -- streams, events, graphs --------------------------------------------------------------------------
@dataclass
class FakeGraph:
    ops: list[Callable[[], None]]
    uploaded: bool = False

    def upload(self, stream: FakeStream) -> None:
        self.uploaded = True

    def launch(self, stream: FakeStream) -> None:
        stream.api.graph_launches += 1
        for op in self.ops:
            stream.submit(op, cost=0.0005)


@dataclass(eq=False)
class FakeStream:
    api: FakeApi
    ptr: int
    capturing: list[Callable[[], None]] | None = None
    clock: float = 0.0
    waits: int = 0
    pending: int = 0
    """Operations submitted since the last synchronize (work the host has not waited for)."""

    def submit(self, op: Callable[[], None], cost: float = 0.001) -> None:
        if self.capturing is not None:
            self.capturing.append(op)
        else:
            op()
            self.clock += cost
            self.pending += 1

    def synchronize(self) -> None:
        if self.capturing is not None:
            raise FakeCudaError("cudaErrorStreamCaptureUnsupported: synchronize while capturing")
        self.pending = 0

    def wait_event(self, event: FakeEvent) -> None:
        self.waits += 1

    def begin_capture(self) -> None:
        if self.api.fail_capture:
            raise FakeCudaError("cudaErrorStreamCaptureUnsupported (injected)")
        self.capturing = []

    def end_capture(self) -> FakeGraph:
        if self.capturing is None:
            raise FakeCudaError("cudaErrorIllegalState: not capturing")
        ops, self.capturing = self.capturing, None
        self.api.captures += 1
        return FakeGraph(ops)


@dataclass
class FakeEvent:
    time: float | None = None

    def record(self, stream: FakeStream) -> None:
        if stream.capturing is not None:
            raise FakeCudaError("event record while capturing is not part of this executor")
        self.time = stream.clock

    def synchronize(self) -> None:
        pass


# -- cuBLAS ---------------------------------------------------------------------------------------------
_BLAS_NP = {CUDA_R_32F: np.float32, CUDA_R_64F: np.float64, CUDA_R_16F: np.float16}
LEGACY_STREAM = 0  # CuPy's current stream unless one is made current: the legacy stream
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

    def __init__(self, api: FakeApi) -> None:
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


# -- cuDNN ------------------------------------------------------------------------------------------------
def _ints(arr: Any, n: int) -> tuple[int, ...]:
    return tuple(int(arr[i]) for i in range(n))


_DNN_NP = {0: np.float32, 1: np.float64, 2: np.float16}


class FakeCudnnLib:
    """Every prototype of the binding as a Python function: descriptors are remembered, the
    handle functions and the fused convolution are emulated over the fake memory."""

    def __init__(self, api: FakeApi) -> None:
        self.api = api
        self.objs: dict[int, dict[str, Any]] = {}
        self.next = 0x9000
        self.convs: list[dict[str, Any]] = []
        self.refuse: set[int] = set()  # algorithms the fused call answers NOT_SUPPORTED
        self.preempt: Callable[[], None] | None = None  # called after every cudnnSetStream
        for name in PROTOTYPES:
            impl = getattr(self, "_" + name, None)
            if impl is None:
                impl = self._generic(name)
            setattr(self, name, _Fn(impl))

    def _new(self, kind: str, out: Any) -> int:
        self.next += 16
        self.objs[self.next] = {"kind": kind}
        out._obj.value = self.next
        return 0

    def _generic(self, name: str) -> Callable[..., int]:
        if name.startswith("cudnnCreate") and name.endswith("Descriptor"):
            return lambda out: self._new(name[len("cudnnCreate") :], out)
        if name.startswith("cudnnDestroy"):
            return lambda d: 0 if self.objs.pop(_v(d), None) is not None else 4
        return lambda *args: 9  # NOT_SUPPORTED: the executor does not call it

    def _cudnnGetVersion(self) -> int:
        return 92800

    def _cudnnGetCudartVersion(self) -> int:
        return 13000

    def _cudnnGetErrorString(self, status: int) -> bytes:
        return f"FAKE_STATUS_{status}".encode()

    def _cudnnCreate(self, out: Any) -> int:
        return self._new("Handle", out)

    def _cudnnSetStream(self, h: Any, stream: Any) -> int:
        self.objs[_v(h)]["stream"] = _v(stream)
        if self.preempt is not None:
            self.preempt()
        return 0

    def _cudnnSetTensorNdDescriptor(self, d: Any, dt: int, nb: int, dims: Any, strides: Any) -> int:
        dd, ss = _ints(dims, nb), _ints(strides, nb)
        if nb < 4 or any(x <= 0 for x in dd) or any(x < 0 for x in ss):
            return 3  # BAD_PARAM
        self.objs[_v(d)].update(dtype=dt, dims=dd, strides=ss)
        return 0

    def _cudnnSetFilterNdDescriptor(self, d: Any, dt: int, fmt: int, nb: int, dims: Any) -> int:
        self.objs[_v(d)].update(dtype=dt, format=fmt, dims=_ints(dims, nb))
        return 0

    def _cudnnSetConvolutionNdDescriptor(
        self, d: Any, n: int, pads: Any, strides: Any, dil: Any, mode: int, comp: int
    ) -> int:
        self.objs[_v(d)].update(
            pads=_ints(pads, n),
            strides=_ints(strides, n),
            dilations=_ints(dil, n),
            mode=mode,
            compute=comp,
            groups=1,
            math=0,
        )
        return 0

    def _cudnnSetConvolutionGroupCount(self, d: Any, g: int) -> int:
        self.objs[_v(d)]["groups"] = g
        return 0

    def _cudnnSetConvolutionMathType(self, d: Any, m: int) -> int:
        self.objs[_v(d)]["math"] = m
        return 0

    def _cudnnSetActivationDescriptor(self, d: Any, mode: int, nan: int, coef: float) -> int:
        self.objs[_v(d)]["mode"] = mode
        return 0

    WORKSPACE: ClassVar[dict[ConvFwdAlgo, int]] = {
        ConvFwdAlgo.IMPLICIT_PRECOMP_GEMM: 4096,
        ConvFwdAlgo.WINOGRAD_NONFUSED: 1 << 16,
    }

    def _cudnnGetConvolutionForwardAlgorithm_v7(self, h, x, w, c, y, req, count, perf) -> int:  # type: ignore[no-untyped-def]
        math = self.objs[_v(c)]["math"]
        offers = [
            (
                ConvFwdAlgo.WINOGRAD_NONFUSED,
                int(MathType.TENSOR_OP),
            ),  # must be refused for exact F32
            (ConvFwdAlgo.WINOGRAD_NONFUSED, math),
            (ConvFwdAlgo.IMPLICIT_PRECOMP_GEMM, math),
        ]
        for i, (algo, mt) in enumerate(offers[:req]):
            perf[i].algo = int(algo)
            perf[i].status = 0
            perf[i].memory = self.WORKSPACE[algo]
            perf[i].mathType = mt
        count._obj.value = min(req, len(offers))
        return 0

    def _cudnnGetConvolutionForwardWorkspaceSize(self, h, x, w, c, y, algo, out) -> int:  # type: ignore[no-untyped-def]
        out._obj.value = self.WORKSPACE.get(ConvFwdAlgo(algo), 0)
        return 0

    def _cudnnConvolutionBiasActivationForward(
        self, h, a1, xd, x, wd, w, cd, algo, ws, wss, a2, zd, z, bd, b, ad, yd, y
    ) -> int:  # type: ignore[no-untyped-def]
        api, o = self.api, self.objs
        X, W, C, Z, B, A, Y = (o[_v(d)] for d in (xd, wd, cd, zd, bd, ad, yd))
        if A["mode"] == int(ActivationMode.IDENTITY) and algo != int(
            ConvFwdAlgo.IMPLICIT_PRECOMP_GEMM
        ):
            return 9  # NOT_SUPPORTED, as the real library
        if algo in self.refuse:
            return 9
        need = self.WORKSPACE.get(ConvFwdAlgo(algo), 0)
        if need and (ws is None or wss < need):
            return 3
        if need:
            api.mem.find(_v(ws), wss)
        dt = np.dtype(_DNN_NP[X["dtype"]])
        scalar = ctypes.c_double if dt == np.float64 else ctypes.c_float
        al1, al2 = scalar.from_address(_v(a1)).value, scalar.from_address(_v(a2)).value
        stream = api.stream_by_ptr(o[_v(h)]["stream"])
        self.convs.append(
            {
                "math": C["math"],
                "algo": algo,
                "alpha2": al2,
                "act": A["mode"],
                "stream": stream.ptr,
                "thread": threading.get_ident(),
            }
        )
        x, w, z, b, y = (_v(p) for p in (x, w, z, b, y))

        def op() -> None:
            block, base = api.block_of(y)
            dty = DType.from_np(dt)

            def view(ptr: int, d: dict[str, Any]) -> StridedView:
                strides = d.get("strides") or tuple(
                    int(np.prod(d["dims"][i + 1 :])) for i in range(len(d["dims"]))
                )
                v = StridedView(ptr - base, d["dims"], strides, dty)
                lo, hi = v.byte_extent()
                api.mem.find(base + lo, hi - lo)
                return v

            xv, wv, yv = view(x, X), view(w, W), view(y, Y)
            zv, bv = view(z, Z), view(b, B)
            k = len(C["pads"])
            zval = None if al2 == 0 else np.array(_nd(block, zv), np.float64)
            conv = st.Conv(
                xv, wv, None, None, yv, C["strides"], C["pads"], C["dilations"], C["groups"], False
            )
            assert len(X["dims"]) == k + 2
            _conv(block, conv)
            r = al1 * np.array(_nd(block, yv), np.float64) + np.array(_nd(block, bv), np.float64)
            if zval is not None:
                r = r + al2 * zval
            if A["mode"] == int(ActivationMode.RELU):
                r = np.maximum(r, 0)
            _nd(block, yv)[...] = r.astype(dt)

        stream.submit(op)
        return 0


def _kernel(block: np.ndarray, op: st.Step, args: tuple[Any, ...]) -> None:
    """What a generated kernel does: the emulator's step, except that a gather index out of
    range sets bit 0 of the status word (its pointer is the last argument) and stores 0."""
    if not isinstance(op, st.Gather):
        _step(block, op)
        return
    x = _nd(block, op.x)
    idx = _nd(block, op.indices).astype(np.int64)
    n = op.x.shape[op.axis]
    bad = (idx < 0) | (idx >= n)
    out = np.take(x, np.where(bad, 0, idx), axis=op.axis)
    if bad.any():
        sel = [slice(None)] * out.ndim
        sel[op.axis] = bad  # type: ignore[call-overload]
        out[tuple(sel)] = 0
        status = args[-1].offset
        block[status : status + 4].view(np.uint32)[0] |= 1
    _nd(block, op.out)[...] = out


def _nd(block: np.ndarray, v: StridedView) -> np.ndarray:
    from kn_cuda_eval.planning.emulator import _nd as nd

    return nd(block, v)


def _v(x: Any) -> int:
    """A pointer argument as an int (ctypes passes ints, c_void_p or None)."""
    if x is None:
        return 0
    if isinstance(x, ctypes.c_void_p):
        return int(x.value or 0)
    return int(x)


class _Fn:
    """A Python function that tolerates the restype/argtypes a binding sets on it; `strict`
    checks the arguments against the argtypes as a foreign call would (count, types, and that
    a C int is not truncated)."""

    def __init__(self, f: Callable[..., Any], strict: bool = False) -> None:
        self.f = f
        self.strict = strict
        self.restype: Any = None
        self.argtypes: Any = None

    def __call__(self, *args: Any) -> Any:
        if self.strict:
            assert self.argtypes is not None, "prototype not declared"
            assert len(args) == len(self.argtypes), (len(args), len(self.argtypes))
            for k, (t, a) in enumerate(zip(self.argtypes, args, strict=True)):
                t.from_param(a)  # raises ctypes.ArgumentError-like TypeError on a bad type
                if t is ctypes.c_int and isinstance(a, int):
                    assert -(2**31) <= a < 2**31, f"argument {k} ({a}) truncated to a C int"
        return self.f(*args)


# -- the api ---------------------------------------------------------------------------------------------
@dataclass(eq=False)
class FakeDeviceArray:
    """What `return_device=True` hands out on the fake device (a CuPy array on the real one)."""

    api: FakeApi
    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype

    def get(self) -> np.ndarray:
        n = int(np.prod(self.shape)) * self.dtype.itemsize
        if n == 0:
            return np.zeros(self.shape, self.dtype)
        return self.api.mem.bytes(self.ptr, n).view(self.dtype).reshape(self.shape).copy()


@dataclass(eq=False)
class FakeApi:
    """A `DeviceApi` on the CPU. Call `expect(launches)` before evaluating, so kernel launches
    can be matched to the calls (and steps) they implement."""

    capability: int = 90
    fail_capture: bool = False
    mem: Memory = field(default_factory=Memory)
    streams: list[FakeStream] = field(default_factory=list)
    expected: dict[str, list[KernelCall]] = field(default_factory=dict)
    functions: dict[int, str] = field(default_factory=dict)
    launches: int = 0
    graph_launches: int = 0
    captures: int = 0
    pinned: list[np.ndarray] = field(default_factory=list)
    log: list[tuple[str, int, int]] = field(default_factory=list)
    """(call, stream, destination) of every copy, memset and launch; a synchronous cudaMemcpy is
    on the legacy stream, which a non-blocking stream does not wait for."""

    def __post_init__(self) -> None:
        self.legacy = FakeStream(self, LEGACY_STREAM)  # never captures: work on it runs at once
        self.cublas_c = FakeCublasC(self)
        self.cublas_lib = CublasLib(self.cublas_c, "fake")
        self.blas = FakeCupyCublas(self.cublas_c)  # CuPy's module: must stay unused
        self.lib = CudnnLib(FakeCudnnLib(self))
        self.cudnn_error: Exception | None = None  # raised by cudnn() when set (cuDNN missing)
        self._dnn: int | None = None
        self._blas: int | None = None
        self._handle_locks: dict[int, threading.Lock] = {}

    def expect(self, launches: LaunchList) -> None:
        for c in launches.calls:
            if isinstance(c, KernelCall):
                self.expected.setdefault(c.name, []).append(c)

    # -- DeviceApi ------------------------------------------------------------------------------------
    def problem(self, index: int) -> str | None:
        return None if index == 0 else f"there is no CUDA device {index} (1 found)"

    @contextmanager
    def use(self, index: int) -> Iterator[None]:
        yield

    def compute_capability(self, index: int) -> int:
        return self.capability

    def device_name(self, index: int) -> str:
        return "Fake GPU"

    def alloc(self, nbytes: int) -> tuple[int, object]:
        return self.mem.alloc(nbytes), None

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        a = np.zeros(max(nbytes, 1), np.uint8)
        self.pinned.append(a)
        return a

    def stream(self) -> FakeStream:
        s = FakeStream(self, 0x3000 + 16 * len(self.streams))
        self.streams.append(s)
        return s

    def stream_by_ptr(self, ptr: int) -> FakeStream:
        if ptr == LEGACY_STREAM:
            return self.legacy
        for s in self.streams:
            if s.ptr == ptr:
                return s
        raise FakeCudaError(f"unknown stream {ptr:#x}")

    def event(self) -> FakeEvent:
        return FakeEvent()

    def elapsed_ms(self, start: FakeEvent, end: FakeEvent) -> float:
        assert start.time is not None and end.time is not None
        return end.time - start.time

    def current_stream_event(self) -> FakeEvent:
        return FakeEvent(0.0)

    def _copy(self, dst: int, src: int, n: int, kind: int) -> None:
        if kind == H2D:
            assert not self.mem.is_device(src) and self.mem.is_device(dst)
            self.mem.bytes(dst, n)[...] = np.frombuffer(ctypes.string_at(src, n), np.uint8)
        elif kind == D2H:
            assert self.mem.is_device(src) and not self.mem.is_device(dst)
            ctypes.memmove(dst, self.mem.bytes(src, n).ctypes.data, n)
        else:
            assert kind == D2D and self.mem.is_device(src) and self.mem.is_device(dst)
            self.mem.bytes(dst, n)[...] = self.mem.bytes(src, n)

    def memcpy(self, dst: int, src: int, nbytes: int, kind: int) -> None:
        if any(s.capturing is not None for s in self.streams):
            raise FakeCudaError("synchronous cudaMemcpy while a stream is capturing")
        self.log.append(("memcpy", LEGACY_STREAM, dst))
        self._copy(dst, src, nbytes, kind)

    def memcpy_async(self, dst: int, src: int, nbytes: int, kind: int, stream: FakeStream) -> None:
        self.log.append(("memcpy_async", stream.ptr, dst))
        stream.submit(lambda: self._copy(dst, src, nbytes, kind))

    def memset_async(self, ptr: int, value: int, nbytes: int, stream: FakeStream) -> None:
        self.log.append(("memset_async", stream.ptr, ptr))

        def op() -> None:
            if nbytes:
                self.mem.bytes(ptr, nbytes)[...] = value

        stream.submit(op)

    def load_function(self, index: int, name: str, cubin: bytes) -> int:
        assert cubin[:4] == b"\x7fELF", "a cubin is an ELF image"
        fn = 0x1_0000 + 16 * len(self.functions)
        self.functions[fn] = name
        return fn

    def block_of(self, ptr: int) -> tuple[np.ndarray, int]:
        block, off = self.mem.find(ptr, 1)
        return block, ptr - off

    def launch(
        self,
        fn: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        stream: FakeStream,
        params: int,
    ) -> None:
        name = self.functions[fn]
        self.log.append(("launch", stream.ptr, fn))
        calls = self.expected.get(name)
        if not calls:
            raise FakeCudaError(f"launch of {name}, which no expected call uses")
        _, idx, cparams = c_parameters(calls[0].launch.kernel.source)
        ptrs = (ctypes.c_void_p * len(cparams)).from_address(params)
        got = []
        for p, addr in zip(cparams, ptrs, strict=True):
            t = p.numpy_type(idx)
            got.append(np.frombuffer(ctypes.string_at(addr, t.itemsize), t)[0])
        self.launches += 1
        for c in calls:
            first = next((int(v) for v, p in zip(got, cparams, strict=True) if p.pointer), None)
            if first is None:
                continue
            _, base = self.block_of(first)
            want = c.packed(base)
            if all(a.dtype == b.dtype and a == b for a, b in zip(want, got, strict=True)) and (
                c.launch.grid,
                c.launch.block,
            ) == (grid, block):
                blk = self.mem.find(base, 1)[0]
                stream.submit(lambda c=c, blk=blk: _kernel(blk, c.op, c.launch.args))
                return
        raise FakeCudaError(f"launch of {name} with arguments no expected call has: {got}")

    def cublas(self) -> CublasLib:
        return self.cublas_lib

    def blas_handle(self, index: int) -> int:
        """One handle for the whole fake device (the real api keeps one per device and thread:
        executors built on one thread share it, which is the case this models)."""
        if self._blas is None:
            self._blas = self.cublas_lib.create_handle()
        return self._blas

    def cudnn(self) -> CudnnLib:
        if self.cudnn_error is not None:
            raise self.cudnn_error
        return self.lib

    def cudnn_handle(self, index: int) -> int:
        if self._dnn is None:
            p = ctypes.c_void_p()
            self.lib.call("cudnnCreate", ctypes.byref(p))
            self._dnn = int(p.value or 0)
        return self._dnn

    def handle_lock(self, handle: int) -> threading.Lock:
        return self._handle_locks.setdefault(handle, threading.Lock())

    def wrap_device(self, x: object) -> DeviceArray | None:
        if isinstance(x, FakeDeviceArray):
            return DeviceArray(x.ptr, x.shape, x.dtype, x)
        return None

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> DeviceArray:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        ptr = self.mem.alloc(n)
        arr = FakeDeviceArray(self, ptr, tuple(shape), np.dtype(dtype))
        return DeviceArray(ptr, tuple(shape), np.dtype(dtype), arr)

    def device_array(self, a: np.ndarray) -> FakeDeviceArray:
        """Test helper: a copy of `a` on the fake device."""
        d = self.empty(a.shape, a.dtype)
        if a.nbytes:
            self.mem.bytes(d.ptr, a.nbytes)[...] = (
                np.ascontiguousarray(a).view(np.uint8).reshape(-1)
            )
        return d.owner  # type: ignore[return-value]
