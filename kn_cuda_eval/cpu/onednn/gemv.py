"""Products of a few rows with constant float weights (a language model's decode step) over the
weights oneDNN packed for its matmul, by `gemv.c` instead of the matmul primitive.

oneDNN packs a constant weight W [k, n] once, into the layout its matmul chose (`gemm.pack`); on
AVX-512 that is BA16a64b: strips of 64 columns, each contiguous, row i of the strip at i * 64.
Its M=1 kernel reads them at 18-32 GB/s on 2 cores here, where one pass front to back over
each strip reaches up to 50 GB/s (Qwen2-0.5B's shapes, benchmarks/decode_gemv.py). The prefill's
primitives keep reading the same packed memory, so the weights stay in memory once. A layout
this module does not know (another blocking, another ISA's choice) keeps the primitive.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import struct
from importlib import resources

import numpy as np

from kn_cuda_eval.cpu.onednn.lib import MAX_NDIMS, DnnlLib
from kn_cuda_eval.planning import steps as st
from kn_graph.dtype import DType

__all__ = ["GEMV_ROWS", "HostCall", "gemv_call", "strip_layout"]

log = logging.getLogger(__name__)

GEMV_ROWS = 4
"""Products of at most this many rows run as `kn_gemv` (a decode step of up to 4 sequences)."""

# dnnl_query_t and dnnl_format_kind_t (oneDNN 3's dnnl_common_types.h)
_Q_STRIDES, _Q_NDIMS, _Q_DIMS, _Q_FORMAT_KIND = 14, 256, 257, 262
_Q_INNER_NBLKS, _Q_INNER_BLKS, _Q_INNER_IDXS = 263, 264, 265
_BLOCKED = 2
_STRIPS = (8, 16, 24, 32, 48, 64)  # the strip widths gemv.c is built for
_DimsP = ctypes.POINTER(ctypes.c_int64 * MAX_NDIMS)


@functools.cache
def _library() -> ctypes.CDLL | None:
    """gemv.c compiled once (with OpenMP: it runs on the team oneDNN runs on); None without a
    compiler."""
    from kn_cuda_eval.cpu import build

    if build.compiler() is None:
        return None
    src = resources.files("kn_cuda_eval.cpu").joinpath("gemv.c").read_text()
    try:
        lib = build._load([src], build.flags())
    except build.KernelCompileError as e:
        log.warning("gemv.c does not build: decode products stay oneDNN's (%s)", e)
        return None
    lib.kn_gemv.argtypes, lib.kn_gemv.restype = [ctypes.c_void_p], ctypes.c_int
    return lib


def _query_int(lib: DnnlLib, md: int, what: int) -> int:
    out = ctypes.c_int(0)
    lib.call("dnnl_memory_desc_query", md, what, ctypes.byref(out))
    return out.value


def _query_dims(lib: DnnlLib, md: int, what: int, n: int) -> list[int]:
    out = ctypes.c_void_p(0)
    lib.call("dnnl_memory_desc_query", md, what, ctypes.byref(out))
    return list(ctypes.cast(out, _DimsP).contents[:n])


def strip_layout(lib: DnnlLib, md: int) -> tuple[int, int] | None:
    """(B, elements from one strip to the next) when the packed weight `md` ([k, n], or [1, k, n])
    holds its columns in contiguous strips of B (inner blocks `Aa Bb` over k and n, A-row blocks
    one after another within a strip), B one `gemv.c` is built for; else None."""
    nd = _query_int(lib, md, _Q_NDIMS)
    if nd not in (2, 3) or _query_int(lib, md, _Q_FORMAT_KIND) != _BLOCKED:
        return None
    if nd == 3 and _query_dims(lib, md, _Q_DIMS, nd)[0] != 1:
        return None
    if _query_int(lib, md, _Q_INNER_NBLKS) != 2:
        return None
    kd, nd_ = nd - 2, nd - 1
    a, b = _query_dims(lib, md, _Q_INNER_BLKS, 2)
    if _query_dims(lib, md, _Q_INNER_IDXS, 2) != [kd, nd_] or b not in _STRIPS:
        return None
    strides = _query_dims(lib, md, _Q_STRIDES, nd)
    if strides[kd] != a * b:
        return None
    return b, strides[nd_]


class HostCall:
    """`kn_gemv` in a primitive's place: the step loop calls it as kernel id -2 (`q[0]` the
    function, `q[1:]` its arguments); `slots` are the indices of `q` holding arena addresses
    (index, byte offset), moved by `rebase`."""

    def __init__(self, q: ctypes.Array[ctypes.c_longlong], slots: list[tuple[int, int]]) -> None:
        self.q = q
        self.slots = slots
        self._fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(q[0])

    def rebase(self, base: int) -> None:
        for i, off in self.slots:
            self.q[i] = base + off

    def __call__(self) -> int:
        return int(self._fn(ctypes.addressof(self.q) + ctypes.sizeof(ctypes.c_longlong)))


def _bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", x))[0]


def gemv_call(
    lib: DnnlLib,
    s: st.MatMul,
    packed_md: int,
    packed_mem: int,
    src: np.ndarray,
    dst: np.ndarray,
    base: int,
    threads: int,
) -> HostCall | None:
    """`kn_gemv` for one piece of a constant-weight product (src [1, rows, k] @ packed weights ->
    dst [1, rows, cols], views of the arena at `base`), or None when it does not apply: not
    float32, a batch, more than GEMV_ROWS rows, operands not contiguous along k and the
    columns, a layout `strip_layout` does not know, no compiler."""
    if s.dtype is not DType.F32 or s.batch != 1 or not 0 < src.shape[1] <= GEMV_ROWS:
        return None
    if src.strides[2] != 4 or dst.strides[2] != 4 or src.strides[1] % 4 or dst.strides[1] % 4:
        return None
    gemv = _library()
    layout = None if gemv is None else strip_layout(lib, packed_md)
    if gemv is None or layout is None:
        return None
    width, strip = layout
    handle = ctypes.c_void_p(0)
    lib.call("dnnl_memory_get_data_handle", packed_mem, ctypes.byref(handle))
    x_off, y_off = src.ctypes.data - base, dst.ctypes.data - base
    fn = ctypes.cast(gemv.kn_gemv, ctypes.c_void_p).value
    rows, k, cols = src.shape[1], src.shape[2], dst.shape[2]
    q = (ctypes.c_longlong * 14)(
        fn, base + x_off, src.strides[1] // 4, base + y_off, dst.strides[1] // 4,
        handle.value, strip, k, cols, rows, width, threads, _bits(s.alpha), _bits(s.beta),
    )  # fmt: skip
    return HostCall(q, [(1, x_off), (3, y_off)])
