"""The device layer's whole contact surface with CUDA, as one small interface (`DeviceApi`) and
its CuPy implementation (`CupyApi`): memory, copies, streams, events, stream capture, module
loading, kernel launches, the cuBLAS and cuDNN bindings and their handles.

Keeping it this narrow is what lets the executor's logic run on a CPU against a fake device in
the tests; the real implementation below stays a thin, literal mapping onto CuPy calls (the
facts it relies on are in shared/GPU_NOTES.md). CuPy is imported only when `CupyApi` is built.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from kn_cuda_eval.cuda.cudnn.lib import CudnnLib
from kn_cuda_eval.cuda.device.cublas import CublasLib
from kn_graph.errors import CudaUnavailableError

__all__ = [
    "D2D",
    "D2H",
    "H2D",
    "CupyApi",
    "DeviceApi",
    "DeviceArray",
    "default_api",
]

log = logging.getLogger(__name__)

H2D, D2H, D2D = 1, 2, 3  # cudaMemcpyKind


@dataclass(frozen=True, slots=True)
class DeviceArray:
    """A dense device array: its address, shape and dtype, and the object that owns the memory
    (kept alive as long as this is)."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    owner: object


class Stream(Protocol):
    ptr: int

    def synchronize(self) -> None: ...
    def wait_event(self, event: Any) -> None: ...
    def begin_capture(self) -> None: ...
    def end_capture(self) -> Any: ...


class Event(Protocol):
    def record(self, stream: Any) -> None: ...
    def synchronize(self) -> None: ...


class DeviceApi(Protocol):
    """What the executor needs from CUDA. Pointers are Python ints."""

    def problem(self, index: int) -> str | None: ...
    def use(self, index: int) -> Any: ...
    def compute_capability(self, index: int) -> int: ...
    def device_name(self, index: int) -> str: ...
    def alloc(self, nbytes: int) -> tuple[int, object]: ...
    def alloc_pinned(self, nbytes: int) -> np.ndarray: ...
    def stream(self) -> Stream: ...
    def event(self) -> Event: ...
    def elapsed_ms(self, start: Event, end: Event) -> float: ...
    def current_stream_event(self) -> Event: ...
    def memcpy(self, dst: int, src: int, nbytes: int, kind: int) -> None: ...
    def memcpy_async(self, dst: int, src: int, nbytes: int, kind: int, stream: Stream) -> None: ...
    def memset_async(self, ptr: int, value: int, nbytes: int, stream: Stream) -> None: ...
    def load_function(self, index: int, name: str, cubin: bytes) -> int: ...
    def launch(
        self,
        fn: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        stream: Stream,
        params: int,
    ) -> None: ...
    def cublas(self) -> CublasLib: ...
    def blas_handle(self, index: int) -> int: ...
    def cudnn(self) -> CudnnLib: ...
    def cudnn_handle(self, index: int) -> int: ...
    def handle_lock(self, handle: int) -> threading.Lock: ...
    def wrap_device(self, x: object) -> DeviceArray | None: ...
    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> DeviceArray: ...


class CupyApi:
    """`DeviceApi` over CuPy 14, plus ctypes bindings of cuBLAS (never CuPy's GEMM wrappers:
    see `device/cublas.py`) and cuDNN."""

    def __init__(self) -> None:
        try:
            import cupy
            from cupy.cuda import driver, runtime
        except Exception as e:  # ImportError, or CuPy failing to find its CUDA libraries
            raise CudaUnavailableError(
                f"CuPy is not usable ({type(e).__name__}: {e}); install the 'cuda12' or "
                "'cuda13' extra"
            ) from e
        self.cp = cupy
        self.rt = runtime
        self.driver = driver
        self._modules: dict[tuple[int, str], tuple[object, int]] = {}
        self._blas: dict[tuple[int, int], int] = {}
        self._dnn: dict[tuple[int, int], int] = {}
        self._handle_locks: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()

    # -- devices ---------------------------------------------------------------------------
    def problem(self, index: int) -> str | None:
        try:
            n = int(self.rt.getDeviceCount())
        except Exception as e:
            return f"no CUDA driver or device ({type(e).__name__}: {e})"
        if not 0 <= index < n:
            return f"there is no CUDA device {index} ({n} found)"
        return None

    @contextmanager
    def use(self, index: int) -> Iterator[None]:
        with self.cp.cuda.Device(index):
            yield

    def compute_capability(self, index: int) -> int:
        return int(self.cp.cuda.Device(index).compute_capability)

    def device_name(self, index: int) -> str:
        name = self.rt.getDeviceProperties(index)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)

    # -- memory and copies -----------------------------------------------------------------
    def alloc(self, nbytes: int) -> tuple[int, object]:
        mem = self.cp.cuda.alloc(max(nbytes, 1))
        return int(mem.ptr), mem

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        mem = self.cp.cuda.alloc_pinned_memory(max(nbytes, 1))
        arr = np.frombuffer(mem, np.uint8, max(nbytes, 1))
        return arr  # the array's base keeps `mem` alive

    def memcpy(self, dst: int, src: int, nbytes: int, kind: int) -> None:
        self.rt.memcpy(dst, src, nbytes, kind)

    def memcpy_async(self, dst: int, src: int, nbytes: int, kind: int, stream: Stream) -> None:
        self.rt.memcpyAsync(dst, src, nbytes, kind, stream.ptr)

    def memset_async(self, ptr: int, value: int, nbytes: int, stream: Stream) -> None:
        self.rt.memsetAsync(ptr, value, nbytes, stream.ptr)

    # -- streams and events ----------------------------------------------------------------
    def stream(self) -> Stream:
        return self.cp.cuda.Stream(non_blocking=True)  # type: ignore[no-any-return]

    def event(self) -> Event:
        return self.cp.cuda.Event()  # type: ignore[no-any-return]

    def elapsed_ms(self, start: Event, end: Event) -> float:
        return float(self.cp.cuda.get_elapsed_time(start, end))

    def current_stream_event(self) -> Event:
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(self.cp.cuda.get_current_stream())
        return ev  # type: ignore[no-any-return]

    # -- kernels ---------------------------------------------------------------------------
    def load_function(self, index: int, name: str, cubin: bytes) -> int:
        """The CUfunction of `name` in `cubin`, loaded once per device (the module is kept for
        the life of the process: every launch of its function needs it)."""
        key = (index, name)
        with self._lock:
            hit = self._modules.get(key)
            if hit is None:
                m = self.cp.cuda.function.Module()
                m.load(cubin)
                f = m.get_function(name)
                hit = ((m, f), int(f.ptr))
                self._modules[key] = hit
            return hit[1]

    def launch(
        self,
        fn: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        stream: Stream,
        params: int,
    ) -> None:
        self.driver.launchKernel(fn, *grid, *block, shared_mem, stream.ptr, params, 0)

    # -- libraries ---------------------------------------------------------------------------
    def cublas(self) -> CublasLib:
        """The binding of the libcublas CuPy loads (importing `cupy.cuda.cublas` is what makes
        CuPy preload it; the direct `cupy_backends` import does not)."""
        try:
            from cupy.cuda import cublas  # noqa: F401
        except Exception as e:  # the library may still be found below
            log.info("cupy.cuda.cublas does not import (%s: %s)", type(e).__name__, e)
        from kn_cuda_eval.cuda.device.cublas import load_cublas

        return load_cublas()

    def blas_handle(self, index: int) -> int:
        """A cuBLAS handle of our own (CuPy's shared one changes state under us), one per device
        and thread that asks; F32 stays F32 unless a call's compute type says otherwise. Every
        executor built on that thread shares it, and may run on another: hold
        `handle_lock(handle)` from `cublasSetStream_v2` to the GEMM (the stream and workspace
        are the handle's state; a second thread setting its own in between would take the GEMM
        onto its stream)."""
        key = (index, threading.get_ident())
        h = self._blas.get(key)
        if h is None:
            h = self.cublas().create_handle()
            self._blas[key] = h
        return h

    def cudnn(self) -> CudnnLib:
        """cuDNN, checked to be built for CuPy's CUDA major version (mixed cu12/cu13 wheels
        would fail at the first convolution otherwise)."""
        from kn_cuda_eval.cuda.cudnn.lib import load_cudnn

        lib = load_cudnn()
        rt_major = int(self.rt.runtimeGetVersion()) // 1000
        dnn_major = lib.cudart_version() // 1000
        if dnn_major != rt_major:
            raise CudaUnavailableError(
                f"cuDNN was built for CUDA {dnn_major}, CuPy runs CUDA {rt_major} (mixed "
                "cu12/cu13 wheels: install one extra)"
            )
        return lib

    def cudnn_handle(self, index: int) -> int:
        """A cuDNN handle, one per device and thread that asks, shared as `blas_handle`'s is:
        hold `handle_lock(handle)` around every call with it (cuDNN allows no simultaneous use
        of one handle from several threads; `cudnnSetStream` is its state)."""
        key = (index, threading.get_ident())
        h = self._dnn.get(key)
        if h is None:
            ptr = ctypes.c_void_p()
            self.cudnn().call("cudnnCreate", ctypes.byref(ptr))
            h = int(ptr.value or 0)
            self._dnn[key] = h
        return h

    def handle_lock(self, handle: int) -> threading.Lock:
        """The lock every user of a cuBLAS or cuDNN handle holds while it sets the handle's
        stream (and workspace) and issues the call on it: one per handle."""
        with self._lock:
            return self._handle_locks.setdefault(handle, threading.Lock())

    # -- arrays ------------------------------------------------------------------------------
    def wrap_device(self, x: object) -> DeviceArray | None:
        """A dense device array for a CuPy array, a `__cuda_array_interface__` object or a CUDA
        DLPack tensor (zero copy unless it must be made contiguous); None for host data."""
        cp = self.cp
        if isinstance(x, np.ndarray | np.generic):
            return None
        if isinstance(x, cp.ndarray):
            arr = x
        elif hasattr(x, "__cuda_array_interface__"):
            arr = cp.asarray(x)
        elif hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
            dev_type = int(x.__dlpack_device__()[0])
            if dev_type not in (2, 3, 13):  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
                return None
            arr = cp.from_dlpack(x)
        else:
            return None
        arr = cp.ascontiguousarray(arr)
        return DeviceArray(int(arr.data.ptr), tuple(arr.shape), np.dtype(arr.dtype), arr)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> DeviceArray:
        arr = self.cp.empty(shape, dtype)
        return DeviceArray(int(arr.data.ptr), tuple(shape), np.dtype(dtype), arr)


@functools.cache
def default_api() -> CupyApi:
    """The process-wide CuPy implementation (raises CudaUnavailableError without CuPy)."""
    return CupyApi()
