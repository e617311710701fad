"""The additive bias of the ONNX Attention op: the user's mask (bool or float, last axis padded to
the total key length) composed with causal, sliding-window and key-padding restrictions, all
built from Iota so symbolic sequence lengths stay symbolic."""

from __future__ import annotations

import math
from dataclasses import dataclass

from kn_graph.dtype import DType
from kn_graph.onnx.context import NodeContext
from kn_graph.ops import BinaryOp, ReduceOp, Value
from kn_graph.shape import Shape, Size

__all__ = ["Restrictions", "attention_bias", "fully_masked_rows"]


@dataclass(frozen=True, slots=True)
class Restrictions:
    """Which keys a query may see, besides the mask: query i (of m) sees key j (of n) when
    j <= i + offset (causal), i + offset - left <= j <= i + offset + right (window, -1 =
    unbounded), and j < nonpad[b] (external cache). `offset` is past_len, or nonpad - m."""

    causal: bool
    left: int
    right: int
    offset: Size  # the static offset (past length, or 0)
    nonpad: Value | None  # i64 [B], the valid keys of each batch (external cache)

    @property
    def windowed(self) -> bool:
        return self.left >= 0 or self.right >= 0

    @property
    def any(self) -> bool:
        return self.causal or self.windowed or self.nonpad is not None


def _offset_value(ctx: NodeContext, r: Restrictions, m: Size) -> Value:
    """The causal/window offset as an i64 value broadcastable to [B, 1, m, n]."""
    g = ctx.graph
    if r.nonpad is not None:
        b = g.shape(r.nonpad)[0]
        return g.view(
            g.sub(r.nonpad, ctx.size_value(m, DType.I64) if not m.is_fixed else m.as_int()),
            Shape.of(b, 1, 1, 1),
        )
    if r.offset.is_fixed:
        return g.scalar(r.offset.as_int(), DType.I64)
    return ctx.size_value(r.offset, DType.I64)


def _allowed(ctx: NodeContext, r: Restrictions, m: Size, n: Size) -> Value | None:
    """bool, broadcastable to [B, H, m, n]: the keys the restrictions leave visible."""
    if not r.any:
        return None
    g = ctx.graph
    grid = Shape.of(1, 1, m, n)
    row, col = g.iota(grid, 2, DType.I64), g.iota(grid, 3, DType.I64)
    diff = g.sub(g.add(row, _offset_value(ctx, r, m)), col)  # (i + offset) - j
    conds: list[Value] = []
    if r.causal:
        conds.append(g.binary(BinaryOp.GE, diff, 0))
    if r.left >= 0:
        conds.append(g.binary(BinaryOp.LE, diff, r.left))
    if r.right >= 0:
        conds.append(g.binary(BinaryOp.GE, diff, -r.right))
    if r.nonpad is not None:
        b = g.shape(r.nonpad)[0]
        conds.append(g.binary(BinaryOp.LT, col, g.view(r.nonpad, Shape.of(b, 1, 1, 1))))
    out = conds[0]
    for c in conds[1:]:
        out = g.binary(BinaryOp.AND, out, c)
    return out


def _user_mask(ctx: NodeContext, mask: Value, n: Size, dtype: DType) -> Value:
    """The attn_mask input as an additive bias: True/0 keeps a key, False/-inf drops it; a last
    axis shorter than the total key length is padded with dropped keys."""
    g = ctx.graph
    shape = g.shape(mask)
    if shape.rank < 1 or shape.rank > 4:
        ctx.unsupported(f"attn_mask of rank {shape.rank}")
    last = shape[-1]
    if last != n:
        if not (last.is_fixed and n.is_fixed and last.as_int() < n.as_int()):
            ctx.unsupported(f"attn_mask's last axis {last} does not fit {n} keys")
        fill: bool | float = False if g.dtype(mask).is_bool else -math.inf
        mask = g.pad(
            mask, [(0, 0)] * (shape.rank - 1) + [(0, n.as_int() - last.as_int())], value=fill
        )
    if g.dtype(mask).is_bool:
        return g.select(mask, g.scalar(0.0, dtype), -math.inf)
    if not g.dtype(mask).is_float:
        ctx.unsupported(f"attn_mask of type {g.dtype(mask)}")
    return g.cast(mask, dtype)


def attention_bias(
    ctx: NodeContext, mask: Value | None, r: Restrictions, m: Size, n: Size, dtype: DType
) -> Value | None:
    """The additive bias (broadcastable to [B, H, m, n]), or None when every key is visible."""
    g = ctx.graph
    bias = None if mask is None else _user_mask(ctx, mask, n, dtype)
    allowed = _allowed(ctx, r, m, n)
    if allowed is None:
        return bias
    return g.select(allowed, bias if bias is not None else g.scalar(0.0, dtype), -math.inf)


def fully_masked_rows(ctx: NodeContext, bias: Value) -> Value:
    """bool [..., m, 1]: query rows whose every key is masked (their output is defined as 0)."""
    g = ctx.graph
    top = g.reduce(bias, [-1], ReduceOp.MAX, keepdims=True)
    return g.binary(BinaryOp.EQ, top, -math.inf)
