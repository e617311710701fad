"""The ONNX Attention op (opsets 23-25) and RotaryEmbedding.

Attention becomes the IR's fused Attention op when it can (no softcap, no qk_matmul_output, a
plain softmax precision), else an explicit matmul/softmax/matmul chain. Grouped-query attention
shares each key/value head among q_num_heads / kv_num_heads query heads; rows whose every key is
masked produce zeros, as the ONNX reference defines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kn_graph.dtype import DType
from kn_graph.errors import GraphError
from kn_graph.onnx.context import NodeContext, Result, onnx_dtype, onnx_op
from kn_graph.onnx.handlers.attention_mask import Restrictions, attention_bias, fully_masked_rows
from kn_graph.ops import UnaryOp, Value
from kn_graph.shape import Shape, Size

__all__ = ["attention", "fused_attention"]


@dataclass(frozen=True, slots=True)
class Settings:
    scale: float
    softcap: float
    precision: DType | None
    qk_mode: int
    wants_qk: bool


def _to_heads(ctx: NodeContext, x: Value, heads: int | None, what: str) -> Value:
    """[B, S, H·D] -> [B, H, S, D] for the 3-D form; 4-D inputs pass through."""
    g = ctx.graph
    shape = g.shape(x)
    if shape.rank == 4:
        return x
    if shape.rank != 3 or heads is None or heads < 1:
        ctx.unsupported(f"{what} must be 4-D, or 3-D with q_num_heads/kv_num_heads, found {shape}")
    b, s, hidden = shape
    if not Size(heads).divides(hidden):
        ctx.unsupported(f"{what} hidden size {hidden} not divisible by {heads} heads")
    return g.permute(g.view(x, Shape.of(b, s, heads, hidden // heads)), [0, 2, 1, 3])


def _settings(ctx: NodeContext, q: Value) -> Settings:
    g = ctx.graph
    dtype = g.dtype(q)
    d = g.shape(q)[3].as_int("Attention head size")
    if d < 1:
        ctx.unsupported(f"the head size of Q {g.shape(q)} is 0")
    scale = (
        ctx.attr_float("scale", 1.0 / math.sqrt(d)) if ctx.has_attr("scale") else 1.0 / math.sqrt(d)
    )
    precision = None
    if ctx.has_attr("softmax_precision"):
        precision = onnx_dtype(
            ctx.attr_int("softmax_precision"), f"node '{ctx.name}' softmax_precision"
        )
        if not precision.is_float:
            ctx.unsupported(f"softmax_precision {precision}")
        if precision == dtype or (precision == DType.F32 and dtype == DType.F16):
            precision = None  # what the IR's softmax does anyway
    qk_mode = ctx.attr_int("qk_matmul_output_mode", 0)
    if qk_mode not in (0, 1, 2, 3):
        ctx.unsupported(f"qk_matmul_output_mode {qk_mode}")
    softcap = ctx.attr_float("softcap", 0.0)
    wants_qk = len(ctx.node.output) > 3 and ctx.node.output[3] != ""
    if wants_qk and qk_mode == 0 and softcap > 0:
        ctx.unsupported(
            "qk_matmul_output_mode 0 with softcap: the spec (before softcap) and the reference (after) disagree"
        )
    return Settings(scale, softcap, precision, qk_mode, wants_qk)


def _restrictions(ctx: NodeContext, past: Size, m: Size) -> Restrictions:
    causal = ctx.attr_bool("is_causal", False)
    left = ctx.attr_int("left_window_size", -1)
    right = ctx.attr_int("right_window_size", -1)
    if left < -1 or right < -1:
        ctx.unsupported(f"window sizes {left}, {right}")
    nonpad = None
    if ctx.has_input(6):
        nonpad = ctx.input(6)
        if ctx.graph.dtype(nonpad) != DType.I64 or ctx.graph[nonpad].rank != 1:
            ctx.unsupported(
                f"nonpad_kv_seqlen must be i64 [batch], found {ctx.graph.dtype(nonpad)}{ctx.graph.shape(nonpad)}"
            )
    return Restrictions(causal, left, right, past, nonpad)


def _group(ctx: NodeContext, x: Value, hkv: int) -> Value:
    """[B, Hq, m, X] viewed as [B, Hkv, reps·m, X]: query heads sharing a key/value head become
    extra rows of one matmul (no repeated K/V)."""
    g = ctx.graph
    b, hq, m, d = g.shape(x)
    return g.view(x, Shape.of(b, hkv, (hq // hkv) * m, d))


def _repeat_heads(ctx: NodeContext, x: Value, reps: int) -> Value:
    """[B, Hkv, n, D] -> [B, Hkv·reps, n, D], each head repeated `reps` times in a row."""
    return x if reps == 1 else ctx.graph.repeat_interleave(x, 1, reps)


def fused_attention(
    ctx: NodeContext, q: Value, k: Value, v: Value, bias: Value | None, causal: bool, scale: float
) -> Value:
    """softmax(q·kᵀ·scale + bias)·v as the IR's Attention op: q [B, Hq, m, D], k/v [B, Hkv, n, D]
    (each key/value head shared by Hq / Hkv query heads), bias broadcastable to [B, Hq, m, n];
    `causal` is the IR's bottom-right aligned causal limit. Returns [B, Hq, m, Dv]."""
    g = ctx.graph
    b, hq, m, _ = g.shape(q)
    hkv, n = g.shape(k)[1], g.shape(k)[2]
    reps = (hq // hkv).as_int()
    k, v = _repeat_heads(ctx, k, reps), _repeat_heads(ctx, v, reps)
    flat = b * hq

    def three(x: Value) -> Value:
        shape = g.shape(x)
        return g.view(x, Shape.of(flat, shape[2], shape[3]))

    mask = None
    if bias is not None:
        mask = g.view(g.broadcast(bias, Shape.of(b, hq, m, n)), Shape.of(flat, m, n))
    y = g.attention(three(q), three(k), three(v), mask, scale, causal)
    return g.view(y, Shape.of(b, hq, m, g.shape(v)[3]))


def _explicit(
    ctx: NodeContext,
    q: Value,
    k: Value,
    v: Value,
    bias: Value | None,
    guard: Value | None,
    s: Settings,
) -> tuple[Value, Value | None]:
    """Y and the requested qk_matmul_output, step by step as the ONNX reference computes them."""
    g = ctx.graph
    dtype = g.dtype(q)
    b, hq, m, _ = g.shape(q)
    hkv, n = g.shape(k)[1].as_int(), g.shape(k)[2]
    root = math.sqrt(s.scale)
    qk = g.matmul_nd(_group(ctx, g.mul(q, root), hkv), g.transpose(g.mul(k, root)))
    qk = g.view(qk, Shape.of(b, hq, m, n))
    raw = qk
    if s.softcap > 0:
        qk = g.mul(g.unary(UnaryOp.TANH, g.div(qk, s.softcap)), s.softcap)
    logits = qk if bias is None else g.add(qk, bias)
    x = logits if s.precision is None else g.cast(logits, s.precision)
    probs = g.softmax(x, 3)
    if guard is not None:
        probs = g.select(guard, g.scalar(0.0, g.dtype(probs)), probs)
    probs = g.cast(probs, dtype)
    y = g.view(g.matmul_nd(_group(ctx, probs, hkv), v), Shape.of(b, hq, m, g.shape(v)[3]))
    qk_out = {0: raw, 1: qk, 2: logits, 3: probs}[s.qk_mode] if s.wants_qk else None
    return y, qk_out


def _bottom_right(past: Size, m: Size, n: Size) -> bool:
    """Whether the ONNX causal offset (the past length) is the IR's n - m, provably."""
    try:
        return past == n - m
    except GraphError:  # n - m is no monomial
        return False


@onnx_op("Attention")
def attention(ctx: NodeContext) -> list[Result | None]:
    g = ctx.graph
    three_d = ctx.input_rank(0) == 3
    q_heads = ctx.attr_int("q_num_heads", 0) or None
    kv_heads = ctx.attr_int("kv_num_heads", 0) or None
    q = _to_heads(ctx, ctx.input(0), q_heads, "Q")
    k = _to_heads(ctx, ctx.input(1), kv_heads, "K")
    v = _to_heads(ctx, ctx.input(2), kv_heads, "V")
    dtype = g.dtype(q)
    if not dtype.is_float or g.dtype(k) != dtype or g.dtype(v) != dtype:
        ctx.unsupported(
            f"Q, K, V must share one float type, found {dtype}, {g.dtype(k)}, {g.dtype(v)}"
        )
    past = Size(0)
    if ctx.has_input(4) or ctx.has_input(5):
        pk, pv = ctx.input(4), ctx.input(5)
        if g[pk].rank != 4 or g[pv].rank != 4:
            ctx.unsupported(
                f"past_key/past_value must be 4-D, found {g.shape(pk)} and {g.shape(pv)}"
            )
        past = g.shape(pk)[2]
        k, v = g.concat([pk, k], 2), g.concat([pv, v], 2)
    b, hq, m, _ = g.shape(q)
    hkv, n = g.shape(k)[1], g.shape(k)[2]
    if not (hq.is_fixed and hkv.is_fixed) or hkv.as_int() < 1 or hq.as_int() % hkv.as_int():
        ctx.unsupported(f"{hq} query heads cannot share {hkv} key/value heads")
    s = _settings(ctx, q)
    r = _restrictions(ctx, past, m)
    if r.nonpad is not None and past != Size(0):
        ctx.unsupported("nonpad_kv_seqlen together with past_key/past_value")
    mask = ctx.optional_input(3)
    plain_causal = r.causal and not r.windowed and r.nonpad is None and mask is None
    fused_causal = plain_causal and _bottom_right(past, m, n)
    bias = None if fused_causal else attention_bias(ctx, mask, r, m, n, dtype)
    guard = None
    if bias is not None and not (plain_causal and past.provably_nonneg()):
        guard = fully_masked_rows(ctx, bias)
    if s.softcap > 0 or s.wants_qk or s.precision is not None:
        y, qk_out = _explicit(ctx, q, k, v, bias, guard, s)
    else:
        y, qk_out = fused_attention(ctx, q, k, v, bias, fused_causal, s.scale), None
        if guard is not None:
            y = g.select(guard, g.scalar(0.0, dtype), y)
    if three_d:
        y = g.view(g.permute(y, [0, 2, 1, 3]), Shape.of(b, m, hq * g.shape(v)[3]))
    return [y, k, v, qk_out]
