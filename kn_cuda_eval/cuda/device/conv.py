"""Convolutions on the device, behind a small `ConvBackend` interface (so the cuDNN frontend can be
added later): `CudnnBackend` runs a `ConvCall` with `cudnnConvolutionBiasActivationForward`
through the ctypes binding — descriptors built once, an algorithm chosen once (cuDNN's
heuristics, restricted to FMA math for exact F32), the workspace taken from the arena. The cuDNN
handle may be shared with other executors run on other threads: every call with it holds the
handle's lock (`DeviceApi.handle_lock`), from `cudnnSetStream` to the convolution."""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Protocol, TypeVar

from kn_cuda_eval.cuda.cudnn.descriptors import (
    ActivationDescriptor,
    ConvDescriptor,
    FilterDescriptor,
    TensorDescriptor,
    compute_type,
    data_type,
)
from kn_cuda_eval.cuda.cudnn.lib import AlgoPerf, ConvFwdAlgo, CudnnError, CudnnLib, MathType
from kn_cuda_eval.cuda.device.calls import ConvCall
from kn_graph.dtype import DType

__all__ = ["ConvBackend", "CudnnBackend", "PreparedConv"]

log = logging.getLogger(__name__)

_ALGO_COUNT = 8  # CUDNN_CONVOLUTION_FWD_ALGO_COUNT
_FALLBACK = ConvFwdAlgo.IMPLICIT_PRECOMP_GEMM  # works with both activations
_D = TypeVar("_D", TensorDescriptor, FilterDescriptor, ConvDescriptor, ActivationDescriptor)


class _Closable(Protocol):
    def close(self) -> None: ...


class PreparedConv(Protocol):
    workspace: int
    """Bytes of workspace this convolution needs."""

    @property
    def description(self) -> str: ...

    def run(self, base: int, workspace: int, stream: int) -> None: ...
    def close(self) -> None: ...


class ConvBackend(Protocol):
    name: str

    def prepare(self, call: ConvCall) -> PreparedConv: ...


class CudnnBackend:
    """cuDNN through `kn_cuda_eval.cuda.cudnn` (legacy API, deprecated since 9.0 but exported).
    `lock`: held around every call with `handle` (the handle's own lock when it is shared)."""

    name = "cudnn"

    def __init__(
        self,
        lib: CudnnLib,
        handle: int,
        workspace_limit: int,
        lock: threading.Lock | None = None,
    ) -> None:
        self.lib = lib
        self.handle = handle
        self.workspace_limit = workspace_limit
        self.lock = lock if lock is not None else threading.Lock()

    def prepare(self, call: ConvCall) -> _CudnnConv:
        with self.lock:  # the algorithm and workspace queries use the handle too
            return _CudnnConv(self, call)


class _CudnnConv:
    def __init__(self, backend: CudnnBackend, call: ConvCall) -> None:
        lib = backend.lib
        self.lib = lib
        self.handle = backend.handle
        self.lock = backend.lock
        self.call = call
        g = call.geometry
        dt = data_type(g.dtype)
        self._descs: list[_Closable] = []
        try:
            self.x = self._keep(TensorDescriptor(lib, dt, g.x_dims, g.x_strides))
            self.w = self._keep(FilterDescriptor(lib, dt, g.w_dims))
            self.y = self._keep(TensorDescriptor(lib, dt, g.y_dims, g.y_strides))
            self.z = self._keep(TensorDescriptor(lib, dt, g.y_dims, call.z_strides))
            self.b = self._keep(TensorDescriptor(lib, dt, call.bias_dims, call.bias_strides))
            self.conv = self._keep(
                ConvDescriptor(
                    lib, g.pads, g.strides, g.dilations, g.groups, compute_type(g.dtype), call.math
                )
            )
            self.act = self._keep(ActivationDescriptor(lib, call.activation))
            self.algo, need = self._choose(backend.workspace_limit)
            # room for the fallback too: run() retries with it if the fused call refuses the algo
            self.workspace = max(need, self._workspace_of(_FALLBACK))
        except BaseException:
            self.close()
            raise
        scalar = ctypes.c_double if g.dtype is DType.F64 else ctypes.c_float
        self._alpha1 = scalar(1.0)
        self._alpha2 = scalar(call.alpha2)

    @property
    def description(self) -> str:
        c = self.call
        return (
            f"cudnnConvolutionBiasActivationForward algo={self.algo.name.lower()} "
            f"{c.activation.name.lower()}{' +z' if c.alpha2 else ''} ws={self.workspace} B"
        )

    def _keep(self, d: _D) -> _D:
        self._descs.append(d)
        return d

    def _workspace_of(self, algo: ConvFwdAlgo) -> int:
        size = ctypes.c_size_t()
        self.lib.call(
            "cudnnGetConvolutionForwardWorkspaceSize",
            self.handle,
            self.x.ptr,
            self.w.ptr,
            self.conv.ptr,
            self.y.ptr,
            int(algo),
            ctypes.byref(size),
        )
        return int(size.value)

    def _choose(self, limit: int) -> tuple[ConvFwdAlgo, int]:
        """The required algorithm, else the heuristics' best one that fits the workspace limit
        and does not change the math (FMA stays FMA: no TF32 unless asked)."""
        fixed = self.call.algo
        if fixed is not None:
            return fixed, self._workspace_of(fixed)
        perf = (AlgoPerf * _ALGO_COUNT)()
        count = ctypes.c_int()
        self.lib.call(
            "cudnnGetConvolutionForwardAlgorithm_v7",
            self.handle,
            self.x.ptr,
            self.w.ptr,
            self.conv.ptr,
            self.y.ptr,
            _ALGO_COUNT,
            ctypes.byref(count),
            perf,
        )
        exact = self.call.math is MathType.FMA
        for p in perf[: count.value]:
            if p.status != 0 or p.memory > limit:
                continue
            if exact and p.mathType not in (int(MathType.FMA), int(MathType.DEFAULT)):
                continue
            try:
                algo = ConvFwdAlgo(p.algo)
            except ValueError:
                continue
            return algo, int(p.memory)
        log.info("no heuristic algorithm fits step %d; using %s", self.call.step, _FALLBACK.name)
        return _FALLBACK, self._workspace_of(_FALLBACK)

    def run(self, base: int, workspace: int, stream: int) -> None:
        with self.lock:  # no other thread re-points the handle between the two calls
            self.lib.call("cudnnSetStream", self.handle, stream)
            try:
                self._forward(base, workspace)
            except CudnnError as e:
                if self.algo is _FALLBACK:
                    raise
                log.warning(
                    "step %d: the fused convolution refused %s (%s); using %s from now on",
                    self.call.step,
                    self.algo.name,
                    e,
                    _FALLBACK.name,
                )
                self.algo = _FALLBACK
                self._forward(base, workspace)

    def _forward(self, base: int, workspace: int) -> None:
        c = self.call
        self.lib.call(
            "cudnnConvolutionBiasActivationForward",
            self.handle,
            ctypes.addressof(self._alpha1),
            self.x.ptr,
            base + c.x,
            self.w.ptr,
            base + c.w,
            self.conv.ptr,
            int(self.algo),
            workspace if self.workspace else None,
            self.workspace,  # reserved in the arena: the chosen algorithm's need or more
            ctypes.addressof(self._alpha2),
            self.z.ptr,
            base + c.z,
            self.b.ptr,
            base + c.bias,
            self.act.ptr,
            self.y.ptr,
            base + c.y,
        )

    def close(self) -> None:
        for d in self._descs:
            d.close()
        self._descs.clear()
