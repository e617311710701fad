"""A fake cuDNN over the fake device's memory (`fake_device.FakeApi`): every prototype of the
binding as a Python function, descriptors remembered as they are set through the ctypes binding,
and the fused convolution computed with the emulator's convolution and plain NumPy on the stream
the handle holds.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from kn_cuda_eval.cuda.cudnn.lib import PROTOTYPES, ActivationMode, ConvFwdAlgo, MathType
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.emulator import _conv
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType
from tests.kn_cuda_eval.cuda.fake_ffi import _Fn, _v
from tests.kn_cuda_eval.cuda.fake_runtime import FakeDevice, _nd


def _ints(arr: Any, n: int) -> tuple[int, ...]:
    return tuple(int(arr[i]) for i in range(n))


_DNN_NP = {0: np.float32, 1: np.float64, 2: np.float16}


class FakeCudnnLib:
    """Every prototype of the binding as a Python function: descriptors are remembered, the
    handle functions and the fused convolution are emulated over the fake memory."""

    def __init__(self, api: FakeDevice) -> None:
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
