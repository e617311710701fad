"""Where GroupQueryAttention's tokens sit: each batch row's absolute positions and the KV cache
(present_key / present_value) built from the past buffer and the new keys, as onnxruntime's CPU
kernel lays them out (`contrib_gqa` has the whole contract).

Row b holds T_b = seqlens_k[b] + 1 tokens after the step; its Q_b = query_seqlens[b] (default
min(S, T_b)) new tokens start at absolute position start_b = T_b - Q_b. Cache row j of the present
holds past_key[j] for j < start_b, new key j - start_b for start_b <= j < start_b + S, and zeros
after that (onnxruntime clears a present that does not share the past's buffer).
"""

from __future__ import annotations

from dataclasses import dataclass

from kn_graph.dtype import DType
from kn_graph.onnx.context import NodeContext
from kn_graph.ops import BinaryOp, Value
from kn_graph.shape import Shape, Size

__all__ = ["RowPositions", "cache_rows", "row_positions", "size_operand"]


def size_operand(ctx: NodeContext, s: Size) -> int | Value:
    """A size as a binary operand: the int when fixed, else an i64 run-time value."""
    return s.as_int() if s.is_fixed else ctx.size_value(s, DType.I64)


@dataclass(frozen=True, slots=True)
class RowPositions:
    """Per batch row, as i64 values: `start` [B, 1] (the first new token's absolute position),
    `total` [B, 1] (T_b, the tokens in the cache after the step), `end` [B, 1] (where the new
    tokens written to the cache end: start + S, or T_b when query_seqlens marks the valid ones)
    and `pos` [B, S] (each query row's absolute position, start + s)."""

    start: Value
    total: Value
    end: Value
    pos: Value


def _per_row(ctx: NodeContext, i: int, b: Size, what: str) -> Value:
    """Input i, int32 [B], as i64 [B, 1]."""
    g = ctx.graph
    x = ctx.input(i)
    if g.dtype(x) != DType.I32 or g.shape(x) != Shape.of(b):
        ctx.unsupported(f"{what} (input {i}) must be int32 [{b}], found {g.dtype(x)}{g.shape(x)}")
    return g.view(g.cast(x, DType.I64), Shape.of(b, 1))


def row_positions(ctx: NodeContext, b: Size, s: Size) -> RowPositions:
    """Each row's positions from seqlens_k (input 5) and query_seqlens (input 16)."""
    g = ctx.graph
    total = g.add(_per_row(ctx, 5, b, "seqlens_k"), 1)
    if ctx.has_input(16):
        start = g.sub(total, _per_row(ctx, 16, b, "query_seqlens"))
        end = total
    else:  # min(S, T_b) new tokens; all S are written (onnxruntime copies the padding too)
        start = g.sub(total, g.minimum(total, size_operand(ctx, s)))
        end = g.add(start, size_operand(ctx, s))
    pos = g.add(start, g.iota(Shape.of(1, s), 1, DType.I64))
    return RowPositions(start, total, end, pos)


def cache_rows(ctx: NodeContext, past: Value, new: Value, rows: RowPositions, n: Size) -> Value:
    """Rows [0, n) of the cache after the step: past [B, Hkv, P, D] up to each row's start, the
    new keys or values [B, Hkv, S, D] from there, zeros after them. One Gather over the
    concatenation [past, new] with per-row indices, then a Select for the zeros."""
    g = ctx.graph
    b, hkv, p, d = g.shape(past)
    s = g.shape(new)[2]
    both = g.concat([past, new], 2)
    length = p + s
    j = g.iota(Shape.of(1, n), 1, DType.I64)
    rel = g.sub(j, rows.start)  # [B, n]: the new token at row j, when start <= j < end
    is_new = g.binary(
        BinaryOp.AND,
        g.binary(BinaryOp.GE, rel, 0),
        g.binary(BinaryOp.LT, j, rows.end),
    )
    is_past = g.binary(BinaryOp.LT, j, rows.start)
    idx = g.select(
        is_new,
        g.add(rel, size_operand(ctx, p)),
        g.select(is_past, g.broadcast(j, Shape.of(b, n)), 0),
    )
    base = g.mul(g.iota(Shape.of(b, 1), 0, DType.I64), size_operand(ctx, length))
    flat = g.view(g.add(idx, base), Shape.of(b * n))
    seq_major = g.view(g.permute(both, [0, 2, 1, 3]), Shape.of(b * length, hkv, d))
    picked = g.permute(g.view(g.gather(seq_major, 0, flat), Shape.of(b, n, hkv, d)), [0, 2, 1, 3])
    keep = g.view(g.binary(BinaryOp.OR, is_new, is_past), Shape.of(b, 1, n, 1))
    return g.select(keep, picked, g.scalar(0.0, g.dtype(past)))
