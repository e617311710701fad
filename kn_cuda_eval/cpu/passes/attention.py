"""Large attention steps on the host as GEMMs and softmaxes over scratch rows.

The planner's Attention step is one fused kernel (online softmax, nothing materialised): right
for a GPU and for short sequences, but on the CPU its inner products run far below the GEMM
primitives' speed. The SD 1.5 UNet's self-attention (2·8 heads, 4096 tokens, head dim 40) took
1.0 s a step that way, 6.4 s of a 14 s UNet step, where onnxruntime runs MatMul, Softmax,
MatMul. So an attention with at least `MIN_SCORES` scores per head and a head dim of at least
`MIN_HEAD_DIM` (F32; an additive mask and the causal diagonal are applied by the softmax)
runs per batch row, group of heads and block of query rows as

    S = scale · q_blk · kᵀ   (a GEMM into scratch)   P = softmax(causal?(S + mask_blk)) (kernel)
    out_blk = P · v          (a GEMM into the output's rows)

with blocks of at most `BLOCK_BYTES` of scores, so the scratch stays small; when a whole head
fits in a block, the heads of a batch row go together, up to `GROUP_BYTES` of scores (one GEMM
batched over them: fewer pieces to build and to call). The pieces are ordinary plan steps
(`st.MatMul` from `plan_gemm`, `st.Softmax`), run by the same oneDNN runners and compiled
kernels as the rest of the plan.
"""

from __future__ import annotations

import math

from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.gemm import plan_gemm
from kn_cuda_eval.planning.program import Bin, Const, Index, Instr, Load, Program, Sel
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType
from kn_graph.errors import PlanError
from kn_graph.ops import BinaryOp

__all__ = ["BLOCK_BYTES", "GROUP_BYTES", "MIN_HEAD_DIM", "MIN_SCORES", "split_attention"]

# scores per (batch, head) from which GEMMs beat the fused kernel (2 threads, AVX-512):
# ViT-B/16 (197 tokens) 211 -> 150 ms, BERT-base (128) 143 -> 93 ms; at 1,024 BERT was slower
MIN_SCORES = 4096
# and from this head dim: with d = 2-4 (the tiny SD UNet) the GEMMs lose, 4.7 ms vs 3.2-3.6 ms
MIN_HEAD_DIM = 16
BLOCK_BYTES = 16 << 20  # scores of one block of query rows
# scores of the heads one GEMM computes together when a whole head fits in a block: BERT-base at
# 128 tokens made 3 pieces a (batch row, head), 864 softmax kernels and 937 oneDNN GEMMs to
# build at 3 rows (0.5 s of a 0.7 s executor build); batched over its 12 heads, 3 a batch row
# (build 0.09 s), evaluation unchanged (2 threads, 110-127 ms a sequence for groups of 64 kB to
# 16 MB, 480-555 ms at 512 tokens: noise). 4 MB keeps the scratch (scores and probabilities)
# at 8 MB.
GROUP_BYTES = 4 << 20


class _NoCopy(Exception):
    pass


def _refuse(v: StridedView) -> StridedView:
    raise _NoCopy


def split_attention(
    s: st.Attention, scratch: int
) -> tuple[list[st.MatMul | st.Softmax], int] | None:
    """The steps computing `s` with scores and probabilities in the arena at `scratch` (64-byte
    aligned) and the scratch bytes they need; None when `s` stays one fused step."""
    q, k, v, out = s.q, s.k, s.v, s.out
    if any(x.dtype is not DType.F32 for x in (q, k, v, out)):
        return None
    if s.mask is not None and s.mask.dtype is not DType.F32:
        return None
    b1, b2, m, d = q.shape
    n, dv = k.shape[2], v.shape[3]
    shared = k.strides[1] == 0 and v.strides[1] == 0  # grouped-query heads: one GEMM's rows
    if (b2 if shared else 1) * m * n < MIN_SCORES or min(d, dv) < MIN_HEAD_DIM:
        return None
    rows = max(1, min(m, BLOCK_BYTES // (4 * n)))
    heads = max(1, min(b2, GROUP_BYTES // (4 * m * n))) if rows == m else 1
    for h in dict.fromkeys((heads, 1)):  # heads together when their scores fit, else one by one
        size = h * rows * n * 4
        s_off, p_off = scratch, scratch + -(-size // 64) * 64
        try:
            steps = [
                t
                for i in range(b1)
                for j in range(0, b2, h)
                for r0 in range(0, m, rows)
                for t in _block(s, i, j, min(h, b2 - j), r0, min(rows, m - r0), s_off, p_off)
            ]
        except (_NoCopy, PlanError):  # an operand a GEMM cannot read in place, a strided output
            continue
        return steps, p_off + size - scratch
    return None


def _block(
    s: st.Attention, i: int, j: int, h: int, r0: int, r: int, s_off: int, p_off: int
) -> list[st.MatMul | st.Softmax]:
    """GEMM, softmax, GEMM for query rows [r0, r0 + r) of heads [j, j + h) of batch row i: one
    GEMM batched over the heads (oneDNN splits the heads over the threads), one softmax over
    all their rows."""
    d, n = s.q.shape[3], s.k.shape[2]
    qh, kh, vh, oh = (_heads(x, i, j, h) for x in (s.q, s.k, s.v, s.out))
    kt = StridedView(kh.offset, (h, d, n), (kh.strides[0], kh.strides[2], kh.strides[1]), F32)
    qb, ob = qh.slice(1, r0, 1, r), oh.slice(1, r0, 1, r)
    sv = StridedView.dense(s_off, (h, r, n), F32)
    pv = StridedView.dense(p_off, (h, r, n), F32)
    mm1 = plan_gemm(qb, kt, sv, s.scale, _refuse)
    sm = st.Softmax(_scores(s, i, j, h, r0, r, sv), pv)
    mm2 = plan_gemm(pv, vh, ob, 1.0, _refuse)
    if not isinstance(mm1, st.MatMul) or not isinstance(mm2, st.MatMul):
        raise _NoCopy
    return [mm1, sm, mm2]


F32 = DType.F32
I64 = DType.I64


def _scores(
    s: st.Attention, i: int, j: int, h: int, r0: int, r: int, scores: StridedView
) -> st.Expr:
    """The softmax's input for query rows [r0, r0 + r) of heads [j, j + h) of batch row i: the
    scores, plus the mask's rows, with keys past the causal diagonal (key > query + n - m) set
    to -inf."""
    m, n = s.q.shape[2], s.k.shape[2]
    ins = [scores]
    instrs: list[Instr] = [Load(0, F32)]
    x = 0
    if s.mask is not None:
        ins.append(_heads(s.mask, i, j, h).slice(1, r0, 1, r))
        instrs += [Load(1, F32), Bin(BinaryOp.ADD, 0, 1, F32)]
        x = len(instrs) - 1
    idx: tuple[StridedView, ...] = ()
    if s.causal:  # index views: the query row r0 + a, the key column b
        idx = (
            StridedView(8 * r0, (h, r, n), (0, 1, 0), I64),
            StridedView(0, (h, r, n), (0, 0, 1), I64),
        )
        base = len(instrs)
        instrs += [
            Index(0, I64),
            Index(1, I64),
            Const(n - m, I64),
            Bin(BinaryOp.ADD, base, base + 2, I64),
            Bin(BinaryOp.GT, base + 1, base + 3, DType.BOOL),
            Const(-math.inf, F32),
            Sel(base + 4, base + 5, x, F32),
        ]
        x = len(instrs) - 1
    return st.Expr((h, r, n), tuple(ins), idx, Program(tuple(instrs), (x,)))


def _heads(x: StridedView, i: int, j: int, h: int) -> StridedView:
    """Heads [j, j + h) of batch row i of a [B1, B2, R, C] view, as [h, R, C]."""
    s0, s1, s2, s3 = x.strides
    off = x.offset + (i * s0 + j * s1) * x.itemsize
    return StridedView(off, (h, x.shape[2], x.shape[3]), (s1 if h > 1 else 0, s2, s3), x.dtype)
