"""Einsum as permutes, views, reductions and batched matmuls.

Each operand first loses its repeated labels (diagonals, a constant gather) and the labels no one
else needs (a sum); operands are then contracted pairwise, left to right, as one MatMul over
[batch, kept, contracted] layouts; the result is permuted to the requested output order.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.ops import ReduceOp, Value
from kn_graph.shape import Shape, Size, broadcast_shapes

__all__ = ["einsum"]

_ELLIPSIS_LABELS = "0123456789"
"""Private labels for the dimensions an ellipsis stands for (equations use letters only)."""


@dataclass(frozen=True, slots=True)
class Term:
    """An operand (or partial result) with one label per axis."""

    value: Value
    labels: str


def _expand(ctx: NodeContext, term: str, rank: int, ell_rank: int) -> str:
    """Replace '...' with right-aligned private labels for the broadcast dimensions."""
    if "..." not in term:
        if len(term) != rank:
            ctx.unsupported(f"term '{term}' has {len(term)} labels for an operand of rank {rank}")
        return term
    head, _, tail = term.partition("...")
    n = rank - len(head) - len(tail)
    if n < 0 or "." in head + tail:
        ctx.unsupported(f"term '{term}' does not fit an operand of rank {rank}")
    return head + _ELLIPSIS_LABELS[ell_rank - n : ell_rank] + tail


def _parse(ctx: NodeContext, equation: str, ranks: list[int]) -> tuple[list[str], str]:
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        ctx.unsupported(f"equation '{equation}' has {len(terms)} terms for {len(ranks)} inputs")
    allowed = set(string.ascii_letters + ".")
    if not set(lhs.replace(",", "")) <= allowed or not set(rhs) <= allowed:
        ctx.unsupported(
            f"equation '{equation}' has characters other than letters, ',', '...' and '->'"
        )
    ell_ranks = [
        r - len(t.replace("...", "")) for t, r in zip(terms, ranks, strict=True) if "..." in t
    ]
    ell_rank = max(ell_ranks, default=0)
    if ell_rank > len(_ELLIPSIS_LABELS):
        ctx.unsupported(f"an ellipsis of {ell_rank} dimensions")
    expanded = [_expand(ctx, t, r, ell_rank) for t, r in zip(terms, ranks, strict=True)]
    if arrow:
        out = rhs.replace("...", _ELLIPSIS_LABELS[:ell_rank]) if "..." in rhs else rhs
        if "." in out:
            ctx.unsupported(f"malformed output term '{rhs}'")
    else:
        letters = "".join(expanded)
        out = _ELLIPSIS_LABELS[:ell_rank] + "".join(
            sorted(c for c in set(letters) if c.isalpha() and letters.count(c) == 1)
        )
    if len(set(out)) != len(out) or not set(out) <= set("".join(expanded)):
        ctx.unsupported(f"output term '{rhs}' repeats a label or names one no input has")
    return expanded, out


def _diagonal(ctx: NodeContext, t: Term) -> Term:
    """Take the diagonal of every label that an operand repeats ('ii' -> 'i')."""
    g = ctx.graph
    while True:
        dup = next((c for c in t.labels if t.labels.count(c) > 1), None)
        if dup is None:
            return t
        i = t.labels.index(dup)
        j = t.labels.index(dup, i + 1)
        rank = len(t.labels)
        rest = [a for a in range(rank) if a not in (i, j)]
        x = g.permute(t.value, [*rest, i, j])
        shape = g.shape(x)
        n = shape[-1].as_int("einsum diagonal size")
        if shape[-2] != Size(n):
            ctx.unsupported(f"label '{dup}' has sizes {shape[-2]} and {n}")
        flat = g.view(x, Shape(shape.dims[:-2]) + Shape.of(n * n))
        diag = g.gather(flat, rank - 2, g.constant(np.arange(n, dtype=np.int64) * (n + 1)))
        t = Term(diag, "".join(t.labels[a] for a in rest) + dup)


def _sum_out(ctx: NodeContext, t: Term, keep: set[str]) -> Term:
    axes = [i for i, c in enumerate(t.labels) if c not in keep]
    if not axes:
        return t
    v = ctx.graph.reduce(t.value, axes, ReduceOp.SUM)
    return Term(v, "".join(c for c in t.labels if c in keep))


def _sizes(ctx: NodeContext, t: Term) -> dict[str, Size]:
    return dict(zip(t.labels, ctx.graph.shape(t.value).dims, strict=True))


def _contract(ctx: NodeContext, a: Term, b: Term, keep: set[str]) -> Term:
    """One batched matmul: a as [batch, a-only, contracted], b as [batch, contracted, b-only]."""
    g = ctx.graph
    a, b = _sum_out(ctx, a, keep | set(b.labels)), _sum_out(ctx, b, keep | set(a.labels))
    batch = [c for c in a.labels if c in b.labels and c in keep]
    contracted = [c for c in a.labels if c in b.labels and c not in keep]
    a_only = [c for c in a.labels if c not in b.labels]
    b_only = [c for c in b.labels if c not in a.labels]
    sa, sb = _sizes(ctx, a), _sizes(ctx, b)
    for c in contracted:
        if sa[c] != sb[c]:
            ctx.unsupported(f"label '{c}' has sizes {sa[c]} and {sb[c]}")
    batch_shape = broadcast_shapes(
        Shape(tuple(sa[c] for c in batch)),
        Shape(tuple(sb[c] for c in batch)),
        equate=g._equate_or_none(),
    )
    av = g.permute(a.value, [a.labels.index(c) for c in batch + a_only + contracted])
    bv = g.permute(b.value, [b.labels.index(c) for c in batch + contracted + b_only])
    k = Shape(tuple(sa[c] for c in contracted))
    m, n = Shape(tuple(sa[c] for c in a_only)), Shape(tuple(sb[c] for c in b_only))
    if not contracted:  # an outer/elementwise product: no matmul needed
        ones_m, ones_n = Shape.of(*([1] * m.rank)), Shape.of(*([1] * n.rank))
        pa = g.view(av, Shape(tuple(sa[c] for c in batch)) + m + ones_n)
        pb = g.view(bv, Shape(tuple(sb[c] for c in batch)) + ones_m + n)
        return Term(g.mul(pa, pb), "".join(batch + a_only + b_only))
    av = g.broadcast(av, batch_shape + m + k)
    bv = g.broadcast(bv, batch_shape + k + n)
    nb = batch_shape.size()
    prod = g.matmul(
        g.view(av, Shape.of(nb, m.size(), k.size())), g.view(bv, Shape.of(nb, k.size(), n.size()))
    )
    out = g.view(prod, batch_shape + m + n)
    return Term(out, "".join(batch + a_only + b_only))


@onnx_op("Einsum")
def einsum(ctx: NodeContext) -> Result:
    g = ctx.graph
    values = ctx.inputs()
    if not values:
        ctx.unsupported("no inputs")
    terms, out = _parse(ctx, ctx.attr_str("equation"), [g[v].rank for v in values])
    ops = [_diagonal(ctx, Term(v, t)) for v, t in zip(values, terms, strict=True)]
    acc = ops[0]
    for i, nxt in enumerate(ops[1:], start=1):
        later = set(out).union(*(o.labels for o in ops[i + 1 :]))
        acc = _contract(ctx, acc, nxt, later)
    acc = _sum_out(ctx, acc, set(out))
    return g.permute(acc.value, [acc.labels.index(c) for c in out])
