"""RotaryEmbedding (opset 23): rotate pairs of features by position-dependent angles.

Pairs are (x[i], x[i + d/2]) or, interleaved, (x[2i], x[2i+1]); only the first
rotary_embedding_dim features rotate. The caches are gathered by position_ids when given.
"""

from __future__ import annotations

from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.ops import Value
from kn_graph.shape import Shape, Size

__all__ = ["rotary_embedding", "rotate_pairs"]


def _cache(ctx: NodeContext, i: int, b: Size, s: Size, half: int) -> Value:
    """cos or sin as [B, S, d/2]: gathered rows of the cache by position_ids, or the cache itself."""
    g = ctx.graph
    cache = ctx.input(i)
    shape = g.shape(cache)
    which = ("cos_cache", "sin_cache")[i - 1]
    if not g.dtype(cache).is_float:
        ctx.unsupported(f"{which} must be a float tensor, found {g.dtype(cache)}")
    if not ctx.has_input(3):
        if shape.rank != 3 or shape[2] != Size(half):
            ctx.unsupported(
                f"without position_ids {which} must be [batch, sequence, {half}] "
                f"(rotary_embedding_dim / 2 last), found {shape}"
            )
        return cache
    pos = ctx.input(3)
    pos_shape = g.shape(pos)
    if shape.rank != 2 or shape[1] != Size(half):
        ctx.unsupported(f"with position_ids {which} must be [positions, {half}], found {shape}")
    if pos_shape != Shape.of(b, s) or not g.dtype(pos).is_int:
        ctx.unsupported(
            f"position_ids must be integers of shape [{b}, {s}], found {g.dtype(pos)}{pos_shape}"
        )
    rows = g.gather(cache, 0, g.view(pos, Shape.of(b * s)))
    return g.view(rows, Shape.of(b, s, half))


def rotate_pairs(ctx: NodeContext, x: Value, cos: Value, sin: Value, interleaved: bool) -> Value:
    """x (last axis: the rotated features) with its pairs rotated by cos/sin (broadcastable to
    x with a last axis of half the size); the pairs are halves or, interleaved, neighbours."""
    g = ctx.graph
    axis = g[x].rank - 1
    d = g.shape(x)[axis].as_int()
    if interleaved:
        x1, x2 = g.slice(x, axis, 0, d, 2), g.slice(x, axis, 1, d, 2)
    else:
        x1, x2 = g.slice(x, axis, 0, d // 2), g.slice(x, axis, d // 2, d)
    real = g.sub(g.mul(cos, x1), g.mul(sin, x2))
    imag = g.add(g.mul(sin, x1), g.mul(cos, x2))
    if not interleaved:
        return g.concat([real, imag], axis)
    pairs = g.concat([g.unsqueeze(real, [-1]), g.unsqueeze(imag, [-1])], axis + 1)
    return g.view(pairs, g.shape(x))


@onnx_op("RotaryEmbedding")
def rotary_embedding(ctx: NodeContext) -> Result:
    g = ctx.graph
    x = ctx.input(0)
    shape = g.shape(x)
    num_heads = ctx.attr_int("num_heads", 0)
    interleaved = ctx.attr_bool("interleaved", False)
    if not g.dtype(x).is_float:
        ctx.unsupported(f"expected a float input, found {g.dtype(x)}")
    match shape.rank:
        case 4:  # [B, H, S, D]: the caches broadcast over heads as [B, 1, S, d/2]
            b, _, s, d_size = shape
            work = x
        case 3:  # [B, S, H*D] -> [B, S, H, D]: the caches broadcast as [B, S, 1, d/2]
            b, s, hidden = shape
            if num_heads < 1 or not Size(num_heads).divides(hidden):
                ctx.unsupported(f"3-D input {shape} needs num_heads dividing its hidden size")
            d_size = hidden // num_heads
            work = g.view(x, Shape.of(b, s, num_heads, d_size))
        case _:
            ctx.unsupported(f"expected a 3-D or 4-D input, found {shape}")
    d = d_size.as_int("RotaryEmbedding head size")
    rd = ctx.attr_int("rotary_embedding_dim", 0) or d
    if rd > d or rd % 2:
        ctx.unsupported(f"rotary_embedding_dim {rd} for head size {d}")
    head_axis = 1 if shape.rank == 4 else 2
    cos, sin = (g.unsqueeze(_cache(ctx, i, b, s, rd // 2), [head_axis]) for i in (1, 2))
    last = g[work].rank - 1
    rotated = rotate_pairs(ctx, g.slice(work, last, 0, rd), cos, sin, interleaved)
    if rd < d:
        rotated = g.concat([rotated, g.slice(work, last, rd, d)], last)
    return g.view(rotated, shape)
