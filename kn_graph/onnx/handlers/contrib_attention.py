"""onnxruntime's Attention and MultiHeadAttention (com.microsoft), lowered to the IR's Attention op.

Both mask as onnxruntime's CPU kernel does: a key masked by the mask input (0/1 values, key
lengths, end/start positions) gets `mask_filter_value` (-10000 by default) *added* to its score,
not -inf, so a row whose every key is masked is a softmax over the filtered scores; the causal
limit (unidirectional) is -inf, which is the IR's own bottom-right aligned causal flag.
"""

from __future__ import annotations

import math

from kn_graph.dtype import DType
from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.attention import fused_attention
from kn_graph.onnx.handlers.norm import wants_output
from kn_graph.ops import BinaryOp, Value
from kn_graph.shape import Shape, Size

__all__ = ["contrib_attention", "key_mask_bias", "multi_head_attention", "split_heads"]

MASK_FILTER_VALUE = -10000.0
"""onnxruntime's default `mask_filter_value`: what a masked key adds to its score."""


def split_heads(ctx: NodeContext, x: Value, heads: int, what: str) -> Value:
    """[B, S, H·D] -> [B, H, S, D]."""
    g = ctx.graph
    shape = g.shape(x)
    if shape.rank != 3 or not Size(heads).divides(shape[2]):
        ctx.unsupported(f"{what} must be [batch, sequence, {heads}·head_size], found {shape}")
    b, s, hidden = shape
    return g.permute(g.view(x, Shape.of(b, s, heads, hidden // heads)), [0, 2, 1, 3])


def _merge_heads(ctx: NodeContext, y: Value) -> Value:
    """[B, H, S, D] -> [B, S, H·D]."""
    g = ctx.graph
    b, h, s, d = g.shape(y)
    return g.view(g.permute(y, [0, 2, 1, 3]), Shape.of(b, s, h * d))


def _filtered(ctx: NodeContext, keep: Value, filter_value: float, dtype: DType) -> Value:
    """0 where `keep`, else the filter value."""
    return ctx.graph.select(keep, ctx.graph.scalar(0.0, dtype), filter_value)


def key_mask_bias(
    ctx: NodeContext, i: int, b: Size, m: Size, n: Size, filter_value: float, dtype: DType
) -> Value:
    """Input i as an additive bias broadcastable to [B, H, m, n]: key lengths [B], end and start
    positions [2·B], or a raw 0/1 mask [B, n] or [B, m, n]."""
    g = ctx.graph
    mask = ctx.input(i)
    shape = g.shape(mask)
    if not g.dtype(mask).is_int:
        ctx.unsupported(f"the mask (input {i}) must be integers, found {g.dtype(mask)}")
    col = g.iota(Shape.of(1, n), 1, g.dtype(mask))
    if shape == Shape.of(b):
        keep = g.binary(BinaryOp.LT, col, g.view(mask, Shape.of(b, 1)))
        return g.view(_filtered(ctx, keep, filter_value, dtype), Shape.of(b, 1, 1, n))
    if shape == Shape.of(2 * b):
        end = g.view(g.slice_raw(mask, 0, 0, 1, b), Shape.of(b, 1))
        start = g.view(g.slice_raw(mask, 0, b, 1, b), Shape.of(b, 1))
        keep = g.binary(
            BinaryOp.AND, g.binary(BinaryOp.LT, col, end), g.binary(BinaryOp.GE, col, start)
        )
        return g.view(_filtered(ctx, keep, filter_value, dtype), Shape.of(b, 1, 1, n))
    if shape in (Shape.of(b, n), Shape.of(b, m, n)):
        rows = shape[1] if shape.rank == 3 else Size(1)
        keep = g.binary(BinaryOp.GT, mask, 0)
        return g.view(_filtered(ctx, keep, filter_value, dtype), Shape.of(b, 1, rows, n))
    ctx.unsupported(
        f"mask (input {i}) of shape {shape}: supported are [{b}] key lengths, [{2 * b}] end and "
        f"start positions, and 0/1 masks [{b}, {n}] or [{b}, {m}, {n}]"
    )


def _attend(
    ctx: NodeContext,
    q: Value,
    k: Value,
    v: Value,
    mask_index: int,
    bias_index: int,
    causal: bool,
) -> Value:
    """softmax(q·kᵀ·scale + mask + causal + attention_bias)·v for q [B, H, m, D] and k/v
    [B, H, n, D] (n counts past keys): [B, m, H·Dv]."""
    g = ctx.graph
    dtype = g.dtype(q)
    b, _, m, d = g.shape(q)
    n = g.shape(k)[2]
    head = d.as_int("the head size")
    scale = ctx.attr_float("scale", 0.0) or 1.0 / math.sqrt(head)
    filter_value = ctx.attr_float("mask_filter_value", MASK_FILTER_VALUE)
    parts: list[Value] = []
    if ctx.has_input(mask_index):
        parts.append(key_mask_bias(ctx, mask_index, b, m, n, filter_value, dtype))
    if ctx.has_input(bias_index):
        bias = ctx.input(bias_index)
        if g.dtype(bias) != dtype or g[bias].rank != 4:
            ctx.unsupported(
                f"attention_bias must be {dtype} [B or 1, H or 1, {m}, {n}], found "
                f"{g.dtype(bias)}{g.shape(bias)}"
            )
        parts.append(bias)
    total = None
    for p in parts:
        total = p if total is None else g.add(total, p)
    return _merge_heads(ctx, fused_attention(ctx, q, k, v, total, causal, scale))


@onnx_op("Attention", domain="com.microsoft")
def contrib_attention(ctx: NodeContext) -> list[Result | None]:
    """BERT/GPT-2 self-attention with packed Q/K/V weights [Din, Dq + Dk + Dv], optional bias,
    mask_index, past [2, B, H, P, D] and attention_bias; outputs and present [2, B, H, P+S, D]."""
    g = ctx.graph
    heads = ctx.attr_int("num_heads")
    causal = ctx.attr_bool("unidirectional", False)
    if ctx.attr_bool("do_rotary", False):
        ctx.unsupported("do_rotary=1 (rotary embedding inside Attention)")
    if ctx.attr_int("rotary_embedding_dim", 0):
        ctx.unsupported("rotary_embedding_dim (used only with do_rotary)")
    if ctx.attr_bool("past_present_share_buffer", False) or ctx.has_input(6):
        ctx.unsupported("past_present_share_buffer / past_sequence_length (a shared KV buffer)")
    x, w = ctx.input(0), ctx.input(1)
    if g[x].rank != 3 or g[w].rank != 2 or not g.dtype(x).is_float:
        ctx.unsupported(
            f"expected input [B, S, Din] and weights [Din, D], found {g.shape(x)}, {g.shape(w)}"
        )
    total = g.shape(w)[1].as_int("the packed Q/K/V width")
    sizes = ctx.attr_ints("qkv_hidden_sizes") or [total // 3] * 3
    if len(sizes) != 3 or sum(sizes) != total or sizes[0] != sizes[1] or min(sizes) < 1:
        ctx.unsupported(f"qkv_hidden_sizes {sizes} for packed weights of width {total}")
    if any(s % heads for s in sizes) or heads < 1:
        ctx.unsupported(f"qkv_hidden_sizes {sizes} not divisible into {heads} heads")
    proj = g.matmul_nd(x, w)
    if ctx.has_input(2):
        proj = g.add(proj, ctx.input(2))
    if g.shape(proj)[2] != Size(total) or g[proj].rank != 3:
        ctx.unsupported(f"bias {g.shape(ctx.input(2))} does not fit the projection [.., {total}]")
    starts = [0, sizes[0], sizes[0] + sizes[1]]
    q, k, v = (
        split_heads(ctx, g.slice(proj, 2, s0, s0 + n), heads, what)
        for s0, n, what in zip(starts, sizes, ("Q", "K", "V"), strict=True)
    )
    present = None
    if ctx.has_input(4):
        past = ctx.input(4)
        if g[past].rank != 5 or sizes[0] != sizes[2]:
            ctx.unsupported(
                f"past must be [2, B, H, P, D] with Q, K, V of one size, found {g.shape(past)}"
            )
        pk, pv = (g.squeeze(g.slice(past, 0, i, i + 1), [0]) for i in (0, 1))
        k, v = g.concat([pk, k], 2), g.concat([pv, v], 2)
    if wants_output(ctx, 1):
        if sizes[1] != sizes[2]:
            ctx.unsupported("the present output with K and V of different sizes")
        present = g.concat([g.unsqueeze(k, [0]), g.unsqueeze(v, [0])], 0)
    return [_attend(ctx, q, k, v, 3, 5, causal), present]


def _packed(ctx: NodeContext, x: Value, parts: int, what: str) -> list[Value]:
    """[B, S, H, parts, D] -> `parts` values [B, H, S, D]."""
    g = ctx.graph
    if g.shape(x)[3] != Size(parts):
        ctx.unsupported(f"packed {what} must be [B, S, H, {parts}, D], found {g.shape(x)}")
    return [g.permute(g.squeeze(g.slice(x, 3, i, i + 1), [3]), [0, 2, 1, 3]) for i in range(parts)]


def _mha_inputs(ctx: NodeContext, heads: int) -> tuple[Value, Value, Value, bool]:
    """Q, K, V as [B, H, S, D] (bias added) and whether K/V are projected keys of this step."""
    g = ctx.graph
    query = ctx.input(0)
    bias = ctx.optional_input(3)
    if g[query].rank == 5:
        if ctx.has_input(1) or ctx.has_input(2) or bias is not None:
            ctx.unsupported("packed Q/K/V [B, S, H, 3, D] with key, value or bias inputs")
        q, k, v = _packed(ctx, query, 3, "Q/K/V")
        return q, k, v, True
    key = ctx.input(1)
    if g[key].rank == 5:
        if ctx.has_input(2) or bias is not None:
            ctx.unsupported("packed K/V [B, L, H, 2, D] with value or bias inputs")
        k, v = _packed(ctx, key, 2, "K/V")
        return split_heads(ctx, query, heads, "query"), k, v, True
    value = ctx.input(2)
    dq, dk, dv = (g.shape(t)[-1] for t in (query, key, value))
    if bias is not None:
        if g[key].rank != 3 or g[value].rank != 3:
            ctx.unsupported("bias with key/value already split into heads [B, H, L, D]")
        widths = [s.as_int("the hidden sizes") for s in (dq, dk, dv)]
        if g.shape(bias) != Shape.of(sum(widths)):
            ctx.unsupported(f"bias {g.shape(bias)} must be [{sum(widths)}] (Q, K, V widths)")
        offs = [0, widths[0], widths[0] + widths[1]]
        query, key, value = (
            g.add(t, g.slice(bias, 0, o, o + w))
            for t, o, w in zip((query, key, value), offs, widths, strict=True)
        )
    q = split_heads(ctx, query, heads, "query")
    if g[key].rank == 4 and g[value].rank == 4:
        return q, key, value, False
    return q, split_heads(ctx, key, heads, "key"), split_heads(ctx, value, heads, "value"), True


@onnx_op("MultiHeadAttention", domain="com.microsoft")
def multi_head_attention(ctx: NodeContext) -> list[Result | None]:
    """Self or cross attention of projected Q, K, V ([B, S, H·D], packed [B, S, H, 3, D] or
    [B, L, H, 2, D], or K/V already in heads [B, H, L, D]) with bias, key_padding_mask,
    attention_bias and past_key/past_value; outputs and present_key/present_value."""
    g = ctx.graph
    heads = ctx.attr_int("num_heads")
    causal = ctx.attr_bool("unidirectional", False)
    if heads < 1:
        ctx.unsupported(f"num_heads {heads}")
    for i, what in ((8, "past_sequence_length (a shared KV buffer)"), (9, "cache_indirection")):
        if ctx.has_input(i):
            ctx.unsupported(f"input {i}, {what}")
    if wants_output(ctx, 3):
        ctx.unsupported("output 3 (qk)")
    if not g.dtype(ctx.input(0)).is_float:
        ctx.unsupported(f"query must be a float tensor, found {g.dtype(ctx.input(0))}")
    q, k, v, fresh = _mha_inputs(ctx, heads)
    if ctx.has_input(6) or ctx.has_input(7):
        if not fresh:
            ctx.unsupported("past_key/past_value with key/value already split into heads")
        k, v = g.concat([ctx.input(6), k], 2), g.concat([ctx.input(7), v], 2)
    for t, what in ((k, "key"), (v, "value")):
        if g[t].rank != 4 or g.shape(t)[1] != Size(heads) or g.dtype(t) != g.dtype(q):
            ctx.unsupported(
                f"{what} must be [B, {heads}, L, D] of {g.dtype(q)}, found {g.shape(t)}"
            )
    y = _attend(ctx, q, k, v, 4, 5, causal)
    return [y, k if wants_output(ctx, 1) else None, v if wants_output(ctx, 2) else None, None]
