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
SetStream, so a test can switch threads there and catch two executors racing on one handle. What
it computes comes from the emulator (kernels) or from plain NumPy (libraries) — so it proves the
plumbing, not the kernels.

This module is the device itself (launches, copies, handles) and assembles the parts:
`fake_runtime` (memory, streams, events, graphs), `fake_cublas`, `fake_cudnn` and `fake_ffi`
(the ctypes side the two libraries share).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kn_cuda_eval.cuda.cudnn.lib import CudnnLib
from kn_cuda_eval.cuda.device.api import D2D, D2H, H2D, DeviceArray
from kn_cuda_eval.cuda.device.calls import KernelCall, LaunchList, c_parameters
from kn_cuda_eval.cuda.device.cublas import CublasLib
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.emulator import _step
from tests.kn_cuda_eval.cuda.fake_cublas import FakeCublasC, FakeCupyCublas
from tests.kn_cuda_eval.cuda.fake_cudnn import FakeCudnnLib
from tests.kn_cuda_eval.cuda.fake_runtime import (
    LEGACY_STREAM,
    FakeCudaError,
    FakeEvent,
    FakeStream,
    Memory,
    _nd,
)


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
