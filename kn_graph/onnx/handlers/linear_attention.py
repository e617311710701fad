"""LinearAttention (opset 27): a recurrent key-value state, unrolled over the (fixed) sequence.

Each step optionally decays the state (gated rules), corrects the value by what the state already
retrieves for the key (delta rules), adds the outer product key ⊗ value, and reads the state with
the query. Computed in f32 as the ONNX reference does; grouped query heads share a state.
"""

from __future__ import annotations

import math

from kn_graph.dtype import DType
from kn_graph.onnx.context import MAX_UNROLL, NodeContext, Result, onnx_op
from kn_graph.ops import Value
from kn_graph.shape import Shape, Size

__all__ = ["linear_attention"]

_RULES = ("linear", "gated", "delta", "gated_delta")


def _heads(ctx: NodeContext, x: Value, heads: int, what: str) -> Value:
    """[B, T, H·D] -> [B, H, T, D] in f32."""
    g = ctx.graph
    shape = g.shape(x)
    if shape.rank != 3 or not Size(heads).divides(shape[2]):
        ctx.unsupported(f"{what} must be [B, T, {heads}·D], found {shape}")
    b, t, hd = shape
    y = g.permute(g.view(x, Shape.of(b, t, heads, hd // heads)), [0, 2, 1, 3])
    return g.cast(y, DType.F32)


def _step(ctx: NodeContext, v: Value, t: int) -> Value:
    """Step t of a [B, H, T, D] tensor as [B, H, 1, D]."""
    return ctx.graph.slice_raw(v, 2, t, 1, 1)


@onnx_op("LinearAttention")
def linear_attention(ctx: NodeContext) -> list[Result | None]:
    g = ctx.graph
    rule = ctx.attr_str("update_rule", "gated_delta")
    if rule not in _RULES:
        ctx.unsupported(f"update_rule '{rule}'")
    hq, hkv = ctx.attr_int("q_num_heads"), ctx.attr_int("kv_num_heads")
    if hq < 1 or hkv < 1 or hq % hkv:
        ctx.unsupported(f"q_num_heads {hq} must be a positive multiple of kv_num_heads {hkv}")
    ctx.ignore_attrs("chunk_size")  # a tuning hint without effect on the result
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gating != ctx.has_input(4) or delta != ctx.has_input(5):
        ctx.unsupported(
            f"update_rule '{rule}' with decay {ctx.has_input(4)} and beta {ctx.has_input(5)}"
        )
    query = ctx.input(0)
    out_dtype = g.dtype(query)
    q, k, v = (
        _heads(ctx, query, hq, "query"),
        _heads(ctx, ctx.input(1), hkv, "key"),
        _heads(ctx, ctx.input(2), hkv, "value"),
    )
    b, _, steps, dk = g.shape(q)
    dv = g.shape(v)[3]
    steps_n = steps.as_int("LinearAttention sequence length")
    if steps_n > MAX_UNROLL:
        ctx.unsupported(f"a sequence of {steps_n} steps (supported: up to {MAX_UNROLL})")
    group = hq // hkv
    scale = ctx.attr_float("scale", 0.0) or 1.0 / math.sqrt(dk.as_int("LinearAttention head size"))
    decay = _decay(ctx, hkv, dk) if gating else None
    beta = _beta(ctx, hkv) if delta else None
    state_dtype = out_dtype
    if ctx.has_input(3):
        past = ctx.input(3)
        if g.shape(past) != Shape.of(b, hkv, dk, dv):
            ctx.unsupported(f"past_state {g.shape(past)} must be [{b}, {hkv}, {dk}, {dv}]")
        state_dtype = g.dtype(past)
        state = g.cast(past, DType.F32)
    else:
        state = g.full(0.0, Shape.of(b, hkv, dk, dv), DType.F32)
    outs = []
    for t in range(steps_n):
        k_t, v_t = _step(ctx, k, t), _step(ctx, v, t)  # [B, Hkv, 1, D]
        if decay is not None:
            state = g.mul(state, g.transpose(g.exp(_step(ctx, decay, t))))  # [B, Hkv, dk|1, 1]
        if beta is not None:
            retrieved = g.matmul_nd(k_t, state)  # [B, Hkv, 1, dv]
            v_t = g.mul(_step(ctx, beta, t), g.sub(v_t, retrieved))
        state = g.add(state, g.mul(g.transpose(k_t), v_t))  # + k ⊗ v
        q_t = g.view(_step(ctx, q, t), Shape.of(b, hkv, group, dk))
        outs.append(g.view(g.mul(g.matmul_nd(q_t, state), scale), Shape.of(b, hq, 1, dv)))
    y = g.concat(outs, 2)  # [B, Hq, T, dv]
    y = g.view(g.permute(y, [0, 2, 1, 3]), Shape.of(b, steps, hq * dv))
    return [g.cast(y, out_dtype), g.cast(state, state_dtype)]


def _decay(ctx: NodeContext, hkv: int, dk: Size) -> Value:
    """decay [B, T, Hkv] or [B, T, Hkv·dk] as [B, Hkv, T, 1|dk] in f32."""
    g = ctx.graph
    decay = ctx.input(4)
    shape = g.shape(decay)
    if shape.rank != 3 or shape[2] not in (Size(hkv), dk * hkv):
        ctx.unsupported(f"decay {shape} must end with {hkv} or {hkv}·{dk}")
    width = Size(1) if shape[2] == Size(hkv) else dk
    y = g.permute(g.view(decay, Shape.of(shape[0], shape[1], hkv, width)), [0, 2, 1, 3])
    return g.cast(y, DType.F32)


def _beta(ctx: NodeContext, hkv: int) -> Value:
    """beta [B, T, Hkv|1] as [B, Hkv|1, T, 1] in f32."""
    g = ctx.graph
    beta = ctx.input(5)
    shape = g.shape(beta)
    if shape.rank != 3 or shape[2] not in (Size(hkv), Size(1)):
        ctx.unsupported(f"beta {shape} must end with {hkv} or 1")
    y = g.permute(g.view(beta, Shape.of(shape[0], shape[1], shape[2], 1)), [0, 2, 1, 3])
    return g.cast(y, DType.F32)
