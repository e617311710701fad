"""GEMM steps on the host: a oneDNN matmul over arena views (prepacked constant weights, alpha
and beta as post-ops), or NumPy's matmul (OpenBLAS) for F64 — the CPU counterpart of
`kn_cuda_eval.cuda.device.cublas`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import numpy as np

from kn_cuda_eval.cpu.onednn.gemv import gemv_call
from kn_cuda_eval.cpu.onednn.lib import (
    ARG_DST,
    ARG_SCRATCHPAD,
    ARG_SRC,
    ARG_WEIGHTS,
    DATA_TYPES,
    QUERY_WEIGHTS_MD,
    DnnlLib,
    engine,
)
from kn_cuda_eval.cpu.onednn.memory import Owner, Packing, Workspace, impl_name, md_strides
from kn_cuda_eval.cpu.onednn.postops import ELTWISE_LINEAR, PostOpCall, eltwise, sum_into
from kn_cuda_eval.cpu.onednn.runner import Runner, arena_base, build_owned, exec_args, pack
from kn_cuda_eval.cpu.onednn.threads import blas_thread_setter, omp_thread_setter, thread_count
from kn_cuda_eval.planning import steps as st
from kn_graph.dtype import DType

__all__ = ["batch1", "gemm_runner", "operand_desc"]

log = logging.getLogger(__name__)


def _operands(arena: np.ndarray, s: st.MatMul) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The step in row-major terms over arena views: dst [batch, n, m] = src [batch, n, k] @
    wei [batch, k, m] (cuBLAS's Cᵀ = op(B)ᵀ·op(A)ᵀ; the graph's own product)."""
    from kn_cuda_eval.planning.emulator import view_array

    a, b, c = view_array(arena, s.a), view_array(arena, s.b), view_array(arena, s.c)
    wei = a.transpose(0, 2, 1) if s.transa else a  # op(A)ᵀ: [batch, k, m]
    src = b.transpose(0, 2, 1) if s.transb else b  # op(B)ᵀ: [batch, n, k]
    return src, wei, c


def _blas_wins(s: st.MatMul) -> bool:
    """The measured pick of `gemm_runner` (benchmarks/onednn_steps.py)."""
    return s.dtype is DType.F64


def gemm_runner(
    step: st.MatMul,
    arena: np.ndarray,
    threads: int,
    *,
    backend: str = "auto",
    constant_weights: bool = False,
    workspace: Workspace | None = None,
    packing: Packing | None = None,
) -> Callable[[], None] | None:
    """A runner for a GEMM step over `arena`, or None (the caller then runs `emulate_step`).

    The step is cuBLAS's column-major Cᵀ = op(B)ᵀ·op(A)ᵀ; in row-major terms it is dst [b, n, m]
    = src [b, n, k] @ wei [b, k, m] on views of the arena, transposes being strides, a batch
    stride of 0 a broadcast batch of 1, alpha an `eltwise_linear` post-op and beta a `sum`.

    `constant_weights`: the graph's right operand (cuBLAS's A, `step.a`) is a plan constant
    (the caller checks `plan.constants`): it is then packed once, here, into the layout oneDNN's
    matmul prefers, as onnxruntime prepacks its weights; the arena must hold the constants.

    Pick rule (`backend="auto"`; measured by benchmarks/onednn_steps.py, 2 threads, AVX-512):
    oneDNN matmul for F32 and F16, NumPy matmul (OpenBLAS dgemm) on the arena views only for
    F64, which oneDNN has no CPU matmul for. OpenBLAS tied oneDNN on BERT's 128x768x768, lost
    on the batched attention products (1.6-2x), and won 128x768x3072 against plain weights —
    which prepacked weights take back; and its workers spin for about 0.1 s after each call,
    which makes the next OpenMP region (a oneDNN primitive, a compiled fused step) on the same
    cores 10-30x slower: one thread pool, not two, is the rule. F16 accumulates in F32 in
    oneDNN, while NumPy's F16 matmul has no BLAS. `backend="onednn"` / `"blas"` force a side
    (the benchmark's comparison). A layout oneDNN refuses (`dnnl_unimplemented`) or a zero or
    negative inner stride gives None."""
    s = step
    if s.batch * s.m * s.n == 0 or s.k == 0:
        return None
    if backend == "blas" or (backend == "auto" and _blas_wins(s)):
        return _blas(s, arena, thread_count(threads))
    dt = DATA_TYPES.get(s.dtype)
    if dt is None or s.a.dtype is not s.dtype or s.b.dtype is not s.dtype:
        return None
    n = thread_count(threads)
    return build_owned(
        s, lambda lib, o: _matmul(lib, o, s, dt, arena, n, constant_weights, workspace, packing)
    )


def operand_desc(o: Owner, v: np.ndarray, batch: int, dt: int) -> int | None:
    """The descriptor of a 3-d operand view, or None for strides oneDNN cannot take; a broadcast
    batch (stride 0) becomes a batch of 1, and a product of batch 1 is 2-d."""
    shape, es = list(v.shape), [x // v.itemsize for x in v.strides]
    if any(x < 0 for x in es) or any(
        x == 0 and d > 1 for x, d in zip(es[1:], shape[1:], strict=True)
    ):
        return None
    if batch == 1:
        shape, es = shape[1:], es[1:]
    elif es[0] == 0:
        shape[0] = 1
    return o.md(shape, dt, md_strides(shape, es))


PIECE_BYTES = 64 << 20
"""Constant weights larger than this are packed, and run, in pieces of columns of about this
size (`_pieces`): packing reads the plain weights — a mapped model file's pages, given back
after each piece — so a weight is never resident twice, plain and packed, beyond one piece
(Qwen2-0.5B's 544 MB LM head raised the peak RSS by as much while it was packed at once)."""


def _pieces(wei: np.ndarray, constant_weights: bool, batch: int) -> list[tuple[int, int]]:
    """Column ranges [j0, j1) of wei [batch, k, cols] packed and run as primitives of their own:
    one range but for a large constant weight of batch 1 (widths multiples of 64 columns)."""
    cols = wei.shape[2]
    size = wei.shape[1] * cols * wei.itemsize
    if not constant_weights or batch != 1 or size <= PIECE_BYTES:
        return [(0, cols)]
    width = -(-cols // -(-size // PIECE_BYTES))
    width = -(-width // 64) * 64
    return [(j, min(j + width, cols)) for j in range(0, cols, width)]


def _piece_packing(packing: Packing | None, wei: np.ndarray, j0: int, j1: int) -> Packing | None:
    """The packing of wei's columns [j0, j1): its own key, its own first byte."""
    if packing is None or (j0 == 0 and j1 == wei.shape[2]):
        return packing
    at = None if packing.source_at is None else packing.source_at + j0 * wei.strides[2]
    return dataclasses.replace(packing, key=(packing.key, j0, j1), source_at=at)


def _matmul(
    lib: DnnlLib,
    o: Owner,
    s: st.MatMul,
    dt: int,
    arena: np.ndarray,
    threads: int,
    constant_weights: bool,
    ws: Workspace | None = None,
    packing: Packing | None = None,
) -> Runner | None:
    base = arena_base(arena)
    omp_thread_setter()(threads)
    src, wei_all, dst_all = _operands(arena, s)
    post: list[PostOpCall] = []
    if s.alpha != 1.0:
        post.append(eltwise(ELTWISE_LINEAR, s.alpha, 0.0))
    if s.beta != 0.0:
        post.append(sum_into(s.beta))
    attr = o.attr(post)
    if ws is not None:
        ws.begin()
    calls: list[tuple[int, object]] = []
    views: list[tuple[int, int]] = []
    impl = ""
    for j0, j1 in _pieces(wei_all, constant_weights, s.batch):
        wei, dst = wei_all[:, :, j0:j1], dst_all[:, :, j0:j1]
        descs = [operand_desc(o, v, s.batch, dt) for v in (src, wei, dst)]
        if any(d is None for d in descs):
            o.close()
            return None
        src_md, wei_md, dst_md = (d for d in descs if d is not None)
        wei_q = (
            o.md(wei.shape[1:] if s.batch == 1 else batch1(wei), dt, None)
            if constant_weights
            else wei_md
        )
        pd = o.pd(
            "dnnl_matmul_primitive_desc_create", engine()[0], src_md, wei_q, None, dst_md, attr
        )
        if pd is None:
            log.debug("oneDNN has no matmul for %s", s.describe())
            o.close()
            return None
        prim, spad = o.primitive(pd, ws)
        offs = [v.ctypes.data - base for v in (src, wei, dst)]
        mems = [
            o.memory(md, base + off) for md, off in zip((src_md, wei_md, dst_md), offs, strict=True)
        ]
        piece_views = list(zip(mems, offs, strict=True))
        wei_mem = mems[1]
        impl = impl_name(lib, pd)
        if constant_weights:  # prepacked once into the layout the matmul chose
            packed_md = lib.fns["dnnl_primitive_desc_query_md"](pd, QUERY_WEIGHTS_MD, 0)
            wei_mem = pack(o, wei_md, packed_md, mems[1], s, _piece_packing(packing, wei, j0, j1))
            piece_views = [piece_views[0], piece_views[2]]
            few = gemv_call(lib, s, packed_md, wei_mem, src, dst, base, threads)
            if few is not None:  # a decode-sized product: our pass over the same packed weights
                calls.append(few)
                impl = "kn_gemv"
                continue
        args = exec_args(
            [(ARG_SRC, mems[0]), (ARG_WEIGHTS, wei_mem), (ARG_DST, mems[2]), (ARG_SCRATCHPAD, spad)]
        )
        calls.append((prim, args))
        views += piece_views
    return Runner(s, arena, o, calls, views, threads, impl)  # type: ignore[arg-type]


def batch1(v: np.ndarray) -> list[int]:
    """The dims a 3-d operand's descriptor has (batch 1 when it is broadcast)."""
    return [1 if v.strides[0] == 0 else v.shape[0], *v.shape[1:]]


def _blas(s: st.MatMul, arena: np.ndarray, threads: int) -> Callable[[], None] | None:
    """NumPy matmul (BLAS where the views allow) straight into the arena's output view."""
    if s.beta != 0.0:
        return None
    src, wei, dst = _operands(arena, s)
    alpha = dst.dtype.type(s.alpha)
    set_threads = blas_thread_setter()
    matmul, multiply = np.matmul, np.multiply

    def run() -> None:
        set_threads(threads)
        matmul(src, wei, out=dst)
        if alpha != 1:
            multiply(dst, alpha, out=dst)

    return run
