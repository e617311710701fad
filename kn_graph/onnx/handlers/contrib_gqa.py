"""onnxruntime's GroupQueryAttention (com.microsoft), the attention of onnxruntime-genai's LLMs
(Llama, Qwen2, Phi, Mistral, Gemma), lowered to Gather/Select/Attention (or matmul/softmax) of
the IR. The contract, as onnxruntime 1.32's CPU kernel implements it and our tests confirm:

- Q [B, S, H·D] with K, V [B, S, Hkv·D], or packed QKV [B, S, (H + 2·Hkv)·D] (key and value
  absent). Query head h reads key/value head h // (H / Hkv): Hkv must divide H.
- Row b holds T_b = seqlens_k[b] + 1 tokens after the step (seqlens_k is total length - 1);
  its Q_b = min(S, T_b) new tokens (query_seqlens[b] when given) start at absolute position
  start_b = T_b - Q_b, so query row s sits at start_b + s. A first prompt (no past tokens)
  thus starts at 0 and rows s >= T_b are right padding (onnxruntime leaves their outputs
  unspecified; we match its CPU kernel there too, except windowed rows with a sink, below).
- present_key / present_value [B, Hkv, C, D]: past_key[j] for j < start_b, the new keys
  (after rotary) from start_b on, zeros after them. Without query_seqlens all S new rows are
  written (onnxruntime copies the padding too); with it only the Q_b valid ones.
  C is S without a past; with a past of P positions, total_sequence_length T must be P + S
  (a growing cache, C = P + S) or at most P (a shared, past_present_share_buffer-style buffer
  of fixed capacity, C = P): C = max(T, P). That depends on T's *value*: a constant or a shape
  (onnxruntime-genai computes T as Shape(attention_mask)[1]) gives a (symbolic) size; a graph
  input raises StaticInputRequiredError, so `load_onnx` returns a `ValueSpecializedModel` that
  loads the model once per value of T. Without a past, T is not read (it must equal S).
- Query row s sees keys j <= start_b + s and j < T_b (causal, bottom-right aligned per row);
  with local_window_size W > 0 only j > start_b + s - W (W keys, itself included); a padding
  row left without keys outputs zeros. With causal=0 it sees every key j < T_b. Attention
  reads the first T keys of the cache (T >= every T_b), not a shared buffer's whole capacity.
- Scores are q·kᵀ·scale (scale defaults to 1/sqrt(D)), then softcap·tanh(score/softcap) when
  softcap > 0, plus attention_bias [B or 1, H or 1, S, T]; masked keys are -inf.
- head_sink [H] adds exp(sink_h) to each softmax denominator (a logit that takes part in the
  softmax and is dropped); smooth_softmax=1 without head_sink is a sink of 0.
- do_rotary rotates Q and the new K before caching, from rows of cos_cache/sin_cache
  [max_positions, R/2] at each token's absolute position; only the first R features rotate,
  as halves or, with rotary_interleaved, neighbours (`rotary.rotate_pairs`). position_ids
  [B, S] replaces the positions, except in a first prompt (T == S, decided at run time when
  symbolic), where onnxruntime reads only position_ids[0, 0] and every row counts from it.

Where we differ: a windowed padding row left without keys, with head_sink or smooth_softmax,
is zeros here and some other unspecified value in onnxruntime.

Refused (`ctx.unsupported`): a quantized KV cache (k_scale, v_scale, non-NONE quant types),
q_norm_weight/k_norm_weight (onnxruntime's CPU kernel refuses them too), sliding_window_cache=1
(a window-sized buffer that evicts internally), output_qk / qk_output, and non-float inputs.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from kn_graph.dtype import DType
from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.attention import fused_attention
from kn_graph.onnx.handlers.contrib_attention import split_heads
from kn_graph.onnx.handlers.contrib_gqa_cache import RowPositions, cache_rows, row_positions
from kn_graph.onnx.handlers.norm import wants_output
from kn_graph.onnx.handlers.rotary import rotate_pairs
from kn_graph.ops import BinaryOp, UnaryOp, Value
from kn_graph.shape import Shape, Size

__all__ = ["group_query_attention"]


@dataclass(frozen=True, slots=True)
class Heads:
    """The attributes that shape the computation."""

    q: int  # num_heads
    kv: int  # kv_num_heads
    scale: float  # 0: 1/sqrt(head size)
    softcap: float
    window: int  # local_window_size, -1: none
    causal: bool
    smooth: bool  # smooth_softmax


def _heads(ctx: NodeContext) -> Heads:
    """The attributes, with the configurations we refuse named."""
    h, hkv = ctx.attr_int("num_heads"), ctx.attr_int("kv_num_heads")
    if h < 1 or hkv < 1 or h % hkv:
        ctx.unsupported(
            f"num_heads {h} must be a positive multiple of kv_num_heads {hkv} (each key/value "
            f"head serves num_heads / kv_num_heads query heads)"
        )
    if ctx.attr_bool("sliding_window_cache", False):
        ctx.unsupported("sliding_window_cache=1 (a window-sized cache that evicts internally)")
    for attr in ("k_quant_type", "v_quant_type"):
        if ctx.attr_str(attr, "NONE") != "NONE":
            ctx.unsupported(f"{attr} {ctx.attr_str(attr)!r} (a quantized KV cache)")
    if ctx.attr_int("qk_output", 0) or wants_output(ctx, 3):
        ctx.unsupported("output_qk / qk_output (the attention scores as an output)")
    for i, what in ((12, "k_scale"), (13, "v_scale"), (14, "q_norm_weight"), (15, "k_norm_weight")):
        if ctx.has_input(i):
            ctx.unsupported(f"input {i}, {what}")
    ctx.ignore_attrs("kv_cache_bit_width", "qk_norm_epsilon", "q_norm_epsilon", "k_norm_epsilon")
    causal = ctx.attr_bool("causal", True)
    window = ctx.attr_int("local_window_size", -1)
    if not causal and window != -1:
        ctx.unsupported(f"local_window_size {window} with causal=0")
    return Heads(
        h,
        hkv,
        ctx.attr_float("scale", 0.0),
        ctx.attr_float("softcap", 0.0),
        window,
        causal,
        ctx.attr_bool("smooth_softmax", False),
    )


def _qkv(ctx: NodeContext, heads: Heads) -> tuple[Value, Value, Value]:
    """Q [B, H, S, D] and the new K, V [B, Hkv, S, D], from separate or packed inputs."""
    g = ctx.graph
    query = ctx.input(0)
    shape = g.shape(query)
    if shape.rank != 3 or not g.dtype(query).is_float:
        ctx.unsupported(f"query must be a float [B, S, hidden], found {g.dtype(query)}{shape}")
    if ctx.has_input(1) != ctx.has_input(2):
        ctx.unsupported("key and value must both be given, or both absent (packed QKV)")
    if ctx.has_input(1):
        key, value = ctx.input(1), ctx.input(2)
        for t, what in ((key, "key"), (value, "value")):
            if g.dtype(t) != g.dtype(query) or g[t].rank != 3 or g.shape(t)[:2] != shape[:2]:
                ctx.unsupported(
                    f"{what} must be {g.dtype(query)} [{shape[0]}, {shape[1]}, Hkv·D], found "
                    f"{g.dtype(t)}{g.shape(t)}"
                )
        q = split_heads(ctx, query, heads.q, "query")
        k, v = split_heads(ctx, key, heads.kv, "key"), split_heads(ctx, value, heads.kv, "value")
        if g.shape(k)[3] != g.shape(q)[3] or g.shape(v)[3] != g.shape(q)[3]:
            ctx.unsupported(
                f"key and value heads must have query's head size {g.shape(q)[3]}, found "
                f"{g.shape(k)[3]} and {g.shape(v)[3]}"
            )
        return q, k, v
    width = heads.q + 2 * heads.kv
    if not Size(width).divides(shape[2]):
        ctx.unsupported(f"packed QKV width {shape[2]} is not (num_heads + 2·kv_num_heads)·D")
    d = (shape[2] // width).as_int("the head size")
    bounds = (0, heads.q * d, (heads.q + heads.kv) * d, width * d)
    parts = [g.slice(query, 2, a, z) for a, z in itertools.pairwise(bounds)]
    counts = (heads.q, heads.kv, heads.kv)
    q, k, v = (
        split_heads(ctx, x, n, what)
        for x, n, what in zip(parts, counts, ("query", "key", "value"), strict=True)
    )
    return q, k, v


def _rotary(ctx: NodeContext, x: Value, pos: Value, interleaved: bool) -> Value:
    """x [B, heads, S, D] with its first R features rotated at positions pos [B, S]."""
    g = ctx.graph
    b, _, s, d_size = g.shape(x)
    d = d_size.as_int("the head size")
    caches = []
    for i, what in ((7, "cos_cache"), (8, "sin_cache")):
        if not ctx.has_input(i):
            ctx.unsupported(f"do_rotary=1 without {what} (input {i})")
        cache = ctx.input(i)
        shape = g.shape(cache)
        if g[cache].rank != 2 or not shape[1].is_fixed or 2 * shape[1].as_int() > d:
            ctx.unsupported(f"{what} must be [positions, at most {d // 2}], found {shape}")
        if g.dtype(cache) != g.dtype(x):
            ctx.unsupported(f"{what} must be {g.dtype(x)}, found {g.dtype(cache)}")
        rows = g.gather(cache, 0, g.view(pos, Shape.of(b * s)))
        caches.append(g.view(rows, Shape.of(b, 1, s, shape[1])))
    cos, sin = caches
    rd = 2 * g.shape(cos)[3].as_int()
    if g.shape(cos) != g.shape(sin):
        ctx.unsupported(f"cos_cache and sin_cache differ: {g.shape(cos)}, {g.shape(sin)}")
    rotated = rotate_pairs(ctx, g.slice(x, 3, 0, rd), cos, sin, interleaved)
    return rotated if rd == d else g.concat([rotated, g.slice(x, 3, rd, d)], 3)


def _positions_for_rotary(ctx: NodeContext, rows: RowPositions, t: Size, b: Size) -> Value:
    """Each token's absolute position, or position_ids [B, S] when given. onnxruntime reads
    only position_ids[0, 0] in a first prompt (total_sequence_length == S): every row then
    counts from it."""
    if not ctx.has_input(9):
        return rows.pos
    g = ctx.graph
    s = g.shape(rows.pos)[1]
    pos = ctx.input(9)
    if not g.dtype(pos).is_int or g.shape(pos) != Shape.of(b, s):
        ctx.unsupported(
            f"position_ids must be integers [{b}, {s}], found {g.dtype(pos)}{g.shape(pos)}"
        )
    pos = g.cast(pos, DType.I64)
    first_row = g.add(g.slice(g.slice(pos, 0, 0, 1), 1, 0, 1), g.iota(Shape.of(1, s), 1))
    if t == s:
        return g.broadcast(first_row, Shape.of(b, s))
    first = g.binary(BinaryOp.EQ, ctx.size_value(t, DType.I64), ctx.size_value(s, DType.I64))
    return g.select(g.view(first, Shape.of(1, 1)), first_row, pos)


def _allowed(ctx: NodeContext, heads: Heads, rows: RowPositions, n: Size) -> Value:
    """bool [B, 1, S, n]: the keys each query row sees."""
    g = ctx.graph
    b, s = g.shape(rows.pos)
    j = g.iota(Shape.of(1, 1, 1, n), 3, DType.I64)
    allowed = g.binary(BinaryOp.LT, j, g.view(rows.total, Shape.of(b, 1, 1, 1)))
    if not heads.causal:
        return allowed
    pos = g.view(rows.pos, Shape.of(b, 1, s, 1))
    allowed = g.binary(BinaryOp.AND, allowed, g.binary(BinaryOp.LE, j, pos))
    if heads.window > 0:
        allowed = g.binary(
            BinaryOp.AND, allowed, g.binary(BinaryOp.GT, j, g.sub(pos, heads.window))
        )
    return allowed


def _bias(ctx: NodeContext, heads: Heads, rows: RowPositions, n: Size, dtype: DType) -> Value:
    """The additive bias [B, 1 or H, S, n]: attention_bias where a key is visible, else -inf."""
    g = ctx.graph
    b, s = g.shape(rows.pos)
    extra: Value = g.scalar(0.0, dtype)
    if ctx.has_input(10):
        extra = ctx.input(10)
        shape = g.shape(extra)
        fits = shape.rank == 4 and (shape[2], shape[3]) == (s, n)
        if g.dtype(extra) != dtype or not fits or shape[0] not in (Size(1), b):
            ctx.unsupported(
                f"attention_bias must be {dtype} [{b} or 1, {heads.q} or 1, {s}, {n}], found "
                f"{g.dtype(extra)}{shape}"
            )
    return g.select(_allowed(ctx, heads, rows, n), extra, -math.inf)


def _sink(ctx: NodeContext, heads: Heads, dtype: DType) -> Value | None:
    """The softmax sink per head as [1, H, 1, 1], or None without one."""
    g = ctx.graph
    if ctx.has_input(11):
        sink = ctx.input(11)
        if g.dtype(sink) != dtype or g.shape(sink) != Shape.of(heads.q):
            ctx.unsupported(
                f"head_sink must be {dtype} [{heads.q}], found {g.dtype(sink)}{g.shape(sink)}"
            )
        return g.view(sink, Shape.of(1, heads.q, 1, 1))
    return g.full(0.0, Shape.of(1, heads.q, 1, 1), dtype) if heads.smooth else None


def _explicit(
    ctx: NodeContext, heads: Heads, q: Value, k: Value, v: Value, bias: Value, scale: float
) -> Value:
    """softmax(softcap(q·kᵀ·scale) + bias [, sink])·v step by step: [B, H, S, D]."""
    g = ctx.graph
    reps = heads.q // heads.kv
    if reps > 1:
        k, v = g.repeat_interleave(k, 1, reps), g.repeat_interleave(v, 1, reps)
    scores = g.mul(g.matmul_nd(q, g.transpose(k)), scale)
    if heads.softcap > 0:
        scores = g.mul(g.unary(UnaryOp.TANH, g.div(scores, heads.softcap)), heads.softcap)
    scores = g.add(scores, bias)
    sink = _sink(ctx, heads, g.dtype(q))
    if sink is None:
        return g.matmul_nd(g.softmax(scores, 3), v)
    b, h, s, n = g.shape(scores)
    with_sink = g.concat([scores, g.broadcast(sink, Shape.of(b, h, s, 1))], 3)
    return g.matmul_nd(g.slice(g.softmax(with_sink, 3), 3, 0, n), v)


def _total(ctx: NodeContext, s: Size) -> Size:
    """total_sequence_length T as a size. Without a past onnxruntime requires T == S, so its
    value is not read; with one, T decides the present's length: a constant or a shape gives a
    (symbolic) size, a graph input raises StaticInputRequiredError (value specialization)."""
    if ctx.has_input(3) != ctx.has_input(4):
        ctx.unsupported("past_key and past_value must both be given, or both absent")
    if not ctx.has_input(3):
        ctx.raw_input(6)
        return s
    (t,) = ctx.input_sizes(6, "total_sequence_length (it decides the present's length)")
    return t


def _check_past(ctx: NodeContext, past_k: Value, past_v: Value, new: Value) -> tuple[Value, Value]:
    """past_key and past_value: one dtype with the new keys, both [B, Hkv, P, D]. A batch,
    head count or head size the export left symbolic (the genai builder names the head size
    `kv_cache_dim`) is taken as the new keys' under a guard checked at every binding."""
    g = ctx.graph
    b, hkv, _, d = g.shape(new)
    out = []
    for name, past in (("past_key", past_k), ("past_value", past_v)):
        shape = g.shape(past)
        fits = shape.rank == 4 and all(
            x == y or not (x.is_fixed and y.is_fixed)
            for x, y in zip((shape[0], shape[1], shape[3]), (b, hkv, d), strict=True)
        )
        if not fits or g.dtype(past) != g.dtype(new):
            ctx.unsupported(
                f"past_key and past_value must be {g.dtype(new)} [{b}, {hkv}, P, {d}], found "
                f"{g.dtype(past_k)}{g.shape(past_k)} and {g.dtype(past_v)}{g.shape(past_v)}"
            )
        for axis, size in ((0, b), (1, hkv), (3, d)):
            past = g.assume_size(past, axis, size, f"{name} axis {axis}")
        out.append(past)
    if g.shape(out[0])[2] != g.shape(out[1])[2]:
        out[1] = g.assume_size(out[1], 2, g.shape(out[0])[2], "past_value's length")
    return out[0], out[1]


def _empty_rows(ctx: NodeContext, heads: Heads, rows: RowPositions) -> Value | None:
    """bool [B, 1, S, 1]: padding rows that a local window leaves without keys (their first
    visible key pos - W + 1 is past the row's last token); onnxruntime outputs zeros there."""
    if heads.window <= 0 or not heads.causal:
        return None
    g = ctx.graph
    b, s = g.shape(rows.pos)
    empty = g.binary(BinaryOp.GE, g.sub(rows.pos, heads.window - 1), rows.total)
    return g.view(empty, Shape.of(b, 1, s, 1))


def _caches(
    ctx: NodeContext, k: Value, v: Value, rows: RowPositions, t: Size
) -> tuple[tuple[Value, Value], tuple[Value, Value]]:
    """(present_key, present_value) and the first T keys and values, which attention reads."""
    if not ctx.has_input(3):
        return (k, v), (k, v)
    g = ctx.graph
    past_k, past_v = ctx.input(3), ctx.input(4)
    past_k, past_v = _check_past(ctx, past_k, past_v, k)
    pairs = ((past_k, k), (past_v, v))
    c = Size.max(t, g.shape(past_k)[2])  # a growing cache (T = P + S) or a fixed one (T <= P)
    pk, pv = (cache_rows(ctx, p, x, rows, c) for p, x in pairs)
    if t == c:
        return (pk, pv), (pk, pv)
    # rows [0, T) of the cache are the first T of the present (T <= C): a view, not the rows
    # gathered once more (onnxruntime-genai's T and P are separate symbols, C = max(T, P))
    keys, values = (g.slice_raw(x, 2, 0, 1, t) for x in (pk, pv))
    return (pk, pv), (keys, values)


@onnx_op("GroupQueryAttention", domain="com.microsoft")
def group_query_attention(ctx: NodeContext) -> list[Result | None]:
    g = ctx.graph
    heads = _heads(ctx)
    q, k, v = _qkv(ctx, heads)
    dtype = g.dtype(q)
    b, _, s, d = g.shape(q)
    rows = row_positions(ctx, b, s)
    t = _total(ctx, s)
    if ctx.attr_bool("do_rotary", False):
        pos = _positions_for_rotary(ctx, rows, t, b)
        interleaved = ctx.attr_bool("rotary_interleaved", False)
        q, k = _rotary(ctx, q, pos, interleaved), _rotary(ctx, k, pos, interleaved)
    else:
        ctx.ignore_attrs("rotary_interleaved")
        for i in (7, 8, 9):
            if ctx.has_input(i):
                ctx.unsupported(f"input {i} (cos_cache, sin_cache, position_ids) without do_rotary")
    present, (keys, values) = _caches(ctx, k, v, rows, t)
    scale = heads.scale or 1.0 / math.sqrt(d.as_int("the head size"))
    bias = _bias(ctx, heads, rows, t, dtype)
    if heads.softcap > 0 or ctx.has_input(11) or heads.smooth:
        y = _explicit(ctx, heads, q, keys, values, bias, scale)
    else:
        y = fused_attention(ctx, q, keys, values, bias, False, scale)
    empty = _empty_rows(ctx, heads, rows)
    if empty is not None:
        y = g.select(empty, g.scalar(0.0, dtype), y)
    out = g.view(g.permute(y, [0, 2, 1, 3]), Shape.of(b, s, heads.q * d))
    return [out, present[0], present[1], None]
