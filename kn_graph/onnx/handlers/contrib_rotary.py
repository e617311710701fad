"""onnxruntime's RotaryEmbedding (com.microsoft), which predates ONNX's: inputs in the order
input, position_ids, cos_cache, sin_cache; position_ids is [B, S], or [1] holding the position of
the first token (the others follow it). The rotation is ONNX's (`rotary.rotate_pairs`)."""

from __future__ import annotations

from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.rotary import rotate_pairs
from kn_graph.ops import Value
from kn_graph.shape import Shape, Size

__all__ = ["contrib_rotary_embedding"]


def _positions(ctx: NodeContext, b: Size, s: Size) -> Value:
    """The positions as [B or 1, S] integers."""
    g = ctx.graph
    pos = ctx.input(1)
    shape = g.shape(pos)
    if not g.dtype(pos).is_int:
        ctx.unsupported(f"position_ids must be integers, found {g.dtype(pos)}")
    if shape == Shape.of(1):
        steps = g.iota(Shape.of(1, s), 1, g.dtype(pos))
        return g.add(steps, g.view(pos, Shape.of(1, 1)))
    if shape != Shape.of(b, s):
        ctx.unsupported(f"position_ids must be [1] or [{b}, {s}], found {shape}")
    return pos


def _cache(ctx: NodeContext, i: int, pos: Value, half: int) -> Value:
    """Rows of cos or sin ([max_positions, half]) at the positions: [B or 1, S, half]."""
    g = ctx.graph
    cache = ctx.input(i)
    if g[cache].rank != 2 or g.shape(cache)[1] != Size(half):
        what = ("cos_cache", "sin_cache")[i - 2]
        ctx.unsupported(f"{what} must be [positions, {half}], found {g.shape(cache)}")
    rows = g.gather(cache, 0, g.view(pos, Shape.of(g.shape(pos).size())))
    return g.view(rows, Shape.of(*g.shape(pos), half))


@onnx_op("RotaryEmbedding", domain="com.microsoft")
def contrib_rotary_embedding(ctx: NodeContext) -> Result:
    g = ctx.graph
    x = ctx.input(0)
    shape = g.shape(x)
    num_heads = ctx.attr_int("num_heads", 0)
    interleaved = ctx.attr_bool("interleaved", False)
    if ctx.attr_bool("is_packed_batching", False):
        ctx.unsupported("is_packed_batching=1 (ragged batches)")
    if ctx.attr_float("scale", 1.0) != 1.0:  # onnxruntime's kernels ignore it: meaning unknown
        ctx.unsupported(f"scale {ctx.attr_float('scale', 1.0)} (onnxruntime defines only 1.0)")
    if not g.dtype(x).is_float:
        ctx.unsupported(f"expected a float input, found {g.dtype(x)}")
    half_cache = g.shape(ctx.input(2))[-1].as_int("the cos_cache width")
    match shape.rank:
        case 4:  # [B, H, S, D]
            b, _, s, d_size = shape
            work, head_axis = x, 1
        case 3:  # [B, S, H·D]
            b, s, hidden = shape
            heads = num_heads or (hidden // (2 * half_cache)).as_int("the number of heads")
            if heads < 1 or not Size(heads).divides(hidden):
                ctx.unsupported(f"num_heads {heads} does not divide the hidden size {hidden}")
            d_size = hidden // heads
            work, head_axis = g.view(x, Shape.of(b, s, heads, d_size)), 2
        case _:
            ctx.unsupported(f"expected a 3-D or 4-D input, found {shape}")
    d = d_size.as_int("the head size")
    rd = ctx.attr_int("rotary_embedding_dim", 0) or d
    if rd > d or rd % 2 or rd // 2 != half_cache:
        ctx.unsupported(f"rotary_embedding_dim {rd} for head size {d} and caches of {half_cache}")
    pos = _positions(ctx, b, s)
    cos, sin = (g.unsqueeze(_cache(ctx, i, pos, half_cache), [head_axis]) for i in (2, 3))
    last = g[work].rank - 1
    rotated = rotate_pairs(ctx, g.slice(work, last, 0, rd), cos, sin, interleaved)
    if rd < d:
        rotated = g.concat([rotated, g.slice(work, last, rd, d)], last)
    return g.view(rotated, shape)
