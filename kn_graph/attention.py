"""Lowering the fused Attention op back to matmul/softmax for devices (or tests) that lack it.

The optimizer's `detect_attention` fuses the pattern; `decompose_attention` is its inverse, so a
backend without an attention kernel still runs an optimized graph:

>>> from kn_graph import DType, Graph, Shape
>>> g = Graph()
>>> q, k, v = (g.input(Shape.of(2, 3, 4), DType.F32, n) for n in "qkv")
>>> print(g[decompose_attention(g, q, k, v, None, 0.5, False)].op.NAME)
matmul
"""

from __future__ import annotations

import math

from kn_graph.dtype import DType
from kn_graph.errors import GraphError
from kn_graph.graph import Graph
from kn_graph.ops import BinaryOp, Value
from kn_graph.shape import Shape, Size

__all__ = ["causal_allowed", "decompose_attention"]


def causal_allowed(g: Graph, m: Size, n: Size) -> Value:
    """bool [m, n]: key j is visible to query i when j <= i + (n - m) (bottom-right aligned).

    Built from Iota so a symbolic sequence length stays symbolic; when n - m is not a monomial
    (two unrelated symbols) the offset is counted at run time (`Graph.size_value`)."""
    shape = Shape.of(m, n)
    row = g.iota(shape, 0, DType.I64)
    col = g.iota(shape, 1, DType.I64)
    if m == n:
        return g.binary(BinaryOp.LE, col, row)
    offset = n - m
    v = offset.fixed_value()
    return g.binary(
        BinaryOp.LE, col, g.add(row, v if v is not None else g.size_value(offset, DType.I64))
    )


def decompose_attention(
    g: Graph,
    q: Value,
    k: Value,
    v: Value,
    mask: Value | None,
    scale: float,
    causal: bool,
) -> Value:
    """softmax(q·kᵀ·scale + mask [+ causal -inf])·v from the core ops, validated like the fused
    op (so a bad operand fails the same way whichever form is built)."""
    qi, ki, vi = g[q], g[k], g[v]
    if qi.rank != 3 or ki.rank != 3 or vi.rank != 3:
        raise GraphError(
            f"attention: expected q [b,m,d], k [b,n,d], v [b,n,dv], found q {qi.shape}, k {ki.shape}, v {vi.shape}"
        )
    m, n = qi.shape[1], ki.shape[1]
    if not math.isfinite(scale):
        raise GraphError(f"attention: scale {scale} is not finite")
    s = g.matmul(q, g.permute(k, (0, 2, 1)))
    s = g.mul(s, float(scale))
    if mask is not None:
        if g[mask].shape != g[s].shape:
            raise GraphError(f"attention: mask must be {g[s].shape}, found {g[mask].shape}")
        s = g.add(s, mask)
    if causal:
        allowed = g.broadcast(g.view(causal_allowed(g, m, n), Shape.of(1, m, n)), g[s].shape)
        s = g.select(allowed, s, -math.inf)
    return g.matmul(g.softmax(s, 2), v)
