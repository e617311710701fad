"""onnxruntime's EmbedLayerNormalization (com.microsoft), BERT's fused embedding layer: word,
position and segment embeddings gathered and summed, then layer-normalised; the mask becomes the
mask_index (the number of ones per row) that onnxruntime's Attention reads as key lengths."""

from __future__ import annotations

from kn_graph.dtype import DType
from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.contrib_norm import SKIP_LAYER_NORM_EPSILON
from kn_graph.onnx.handlers.norm import stats_input, wants_output
from kn_graph.ops import BinaryOp, ReduceOp, Value
from kn_graph.shape import Shape, Size

__all__ = ["embed_layer_norm"]


def _ids(ctx: NodeContext, i: int, what: str, b: Size, s: Size) -> Value:
    g = ctx.graph
    ids = ctx.input(i)
    if g.dtype(ids) != DType.I32 or g.shape(ids) not in (Shape.of(b, s), Shape.of(1, s)):
        ctx.unsupported(
            f"{what} (input {i}) must be i32 [{b}, {s}], found {g.dtype(ids)}{g.shape(ids)}"
        )
    return ids


def _lookup(ctx: NodeContext, table_index: int, ids: Value, hidden: Size, what: str) -> Value:
    """Rows of the table (input table_index, [rows, hidden]) at ids [B, S]: [B, S, hidden]."""
    g = ctx.graph
    table = ctx.input(table_index)
    if g[table].rank != 2 or g.shape(table)[1] != hidden:
        ctx.unsupported(
            f"{what} (input {table_index}) must be [rows, {hidden}], found {g.shape(table)}"
        )
    rows = g.gather(table, 0, g.view(ids, Shape.of(g.shape(ids).size())))
    return g.view(rows, Shape.of(*g.shape(ids), hidden))


@onnx_op("EmbedLayerNormalization", domain="com.microsoft")
def embed_layer_norm(ctx: NodeContext) -> list[Result | None]:
    g = ctx.graph
    ctx.ignore_attrs("mask_index_type")  # shape inference only: the output is always i32 [B]
    eps = ctx.attr_float("epsilon", SKIP_LAYER_NORM_EPSILON)
    ids = ctx.input(0)
    if g[ids].rank != 2:
        ctx.unsupported(f"input_ids must be [batch, sequence], found {g.shape(ids)}")
    b, s = g.shape(ids)
    ids = _ids(ctx, 0, "input_ids", b, s)
    words = ctx.input(2)
    if g[words].rank != 2 or not g.dtype(words).is_float:
        ctx.unsupported(
            f"word_embedding must be a float [vocabulary, hidden], found {g.shape(words)}"
        )
    hidden = g.shape(words)[1]
    total = _lookup(ctx, 2, ids, hidden, "word_embedding")
    if ctx.has_input(8):
        positions = _ids(ctx, 8, "position_ids", b, s)
    else:
        positions = g.view(g.iota(Shape.of(s), 0, DType.I32), Shape.of(1, s))
    total = g.add(total, _lookup(ctx, 3, positions, hidden, "position_embedding"))
    if ctx.has_input(1) != ctx.has_input(4):
        ctx.unsupported("segment_ids and segment_embedding must be given together")
    if ctx.has_input(1):
        total = g.add(
            total, _lookup(ctx, 4, _ids(ctx, 1, "segment_ids", b, s), hidden, "segment_embedding")
        )
    dtype = g.dtype(total)
    gamma, beta = ctx.input(5), ctx.input(6)
    for v, what in ((gamma, "gamma"), (beta, "beta")):
        if g.shape(v) != Shape.of(hidden) or g.dtype(v) != dtype:
            ctx.unsupported(f"{what} must be {dtype} [{hidden}], found {g.dtype(v)}{g.shape(v)}")
    y = g.cast(g.layer_norm(stats_input(ctx, total, DType.F32), 2, eps), dtype)
    y = g.add(g.mul(y, gamma), beta)
    mask_index = None
    if wants_output(ctx, 1):
        if ctx.has_input(7):
            mask = _ids(ctx, 7, "mask", b, s)
            if g.shape(mask) != Shape.of(b, s):
                ctx.unsupported(f"mask must be [{b}, {s}], found {g.shape(mask)}")
            ones = g.binary(BinaryOp.EQ, mask, 1)
            mask_index = g.reduce(g.cast(ones, DType.I32), [1], ReduceOp.SUM)
        else:
            mask_index = g.full(0, Shape.of(b), DType.I32)
    elif ctx.has_input(7):
        _ids(ctx, 7, "mask", b, s)
    return [y, mask_index, total if wants_output(ctx, 2) else None]
