"""A batched product whose right operand repeats each of G groups R times (grouped-query
attention's `repeat_kv`) becomes one product per group, with the R left operands of a group
stacked as rows.

Optimum's (and most exporters') GQA attention expands the keys and values from G KV heads to
H = G·R query heads before the products:

    k  [B, G, L, D] -> view [B, G, 1, L, D] -> broadcast [B, G, R, L, D] -> view [B, H, L, D]
       (-> permute [B, H, D, L] -> · scale) -> view [B·H, D, L] = b;   out = matmul(a, b)

A planner stores a broadcast with a zero stride, but no single batch stride reads b's H heads
from G copies, so every decode step materialized R copies of the whole cache (Qwen2-0.5B: 3 x
2.3 MB a layer, ~165 MB a token at 640 positions) for the GEMM to read. Instead:

    out = view(matmul(view(a [B·H, m, k] -> [B·G, R·m, k]), view(k' [B, G, ...] -> [B·G, k, n])))

with k' the chain applied to the G heads (the permutation and elementwise ops with a uniform
constant operand commute with the repeat). Every output element is the same dot product (a
GEMM of other dimensions may sum it in another order). The left operand's heads h = g·R + r
are row-major, so [B·H, m, k] -> [B·G, R·m, k] is a reshape.
"""

from __future__ import annotations

from kn_graph.ops import Binary, Broadcast, MatMul, Permute, Value, View
from kn_graph.optimizer.core import Rewriter, rewrite
from kn_graph.shape import Shape, Size

__all__ = ["group_shared_matmul"]


def _repeat_chain(rw: Rewriter, b: Value) -> tuple[Value, list[Binary | Permute], int] | None:
    """For b = view([B·H, k, n]) of a chain of elementwise-with-a-constant and last-two-axes
    permutations over view(broadcast(view(x [B, G, L, D]) -> [B, G, R, L, D]) -> [B, H, L, D]):
    (x, the chain's ops outermost last, R); else None."""
    g = rw.old
    if not isinstance(g[b].op, View) or g[b].shape.rank != 3:
        return None
    cur = g[b].op.x
    ops: list[Binary | Permute] = []
    while True:
        op = g[cur].op
        if isinstance(op, Permute) and list(op.perm) == [0, 1, 3, 2]:
            ops.append(op)
            cur = op.x
        elif isinstance(op, Binary) and g[cur].shape.rank == 4:
            other = op.b if op.a == _chain_side(g, op) else op.a
            if g.scalar_value(other) is None:
                return None
            ops.append(op)
            cur = _chain_side(g, op)
        else:
            break
    if isinstance(g[cur].op, Broadcast) and not ops:  # view [B·H, L, D] of it directly
        bc = cur
    elif isinstance(g[cur].op, View) and g[cur].shape.rank == 4:
        bc = g[cur].op.x
    else:
        return None
    if not isinstance(g[bc].op, Broadcast) or g[bc].shape.rank != 5:
        return None
    v5 = g[bc].op.x
    if not isinstance(g[v5].op, View):
        return None
    x = g[v5].op.x
    bsz, groups, reps, length, dim = g[bc].shape.dims
    if g[v5].shape != Shape.of(bsz, groups, 1, length, dim) or g[x].shape != Shape.of(
        bsz, groups, length, dim
    ):
        return None
    heads = groups * reps
    if cur != bc:
        ok = g[cur].shape == Shape.of(bsz, heads, length, dim)
    else:
        ok = g[b].shape == Shape.of(bsz * heads, length, dim)
    if not ok or reps == Size(1):
        return None
    r = reps.fixed_value()
    return (x, ops[::-1], r) if r is not None and r > 1 else None


def _chain_side(g: object, op: Binary) -> Value:
    """The operand of `op` that is not a uniform constant (the chain goes on through it)."""
    return op.a if g.scalar_value(op.a) is None else op.b  # type: ignore[attr-defined]


@rewrite("group_shared_matmul")
def group_shared_matmul(rw: Rewriter, v: Value) -> Value | None:
    g = rw.old
    op = g[v].op
    if not isinstance(op, MatMul):
        return None
    found = _repeat_chain(rw, op.b)
    if found is None:
        return None
    x, ops, r = found
    batch, m, k = g[op.a].shape.dims
    n = g[op.b].shape[2]
    new = rw.new
    y = rw.get(x)  # [B, G, L, D]
    for o in ops:
        if isinstance(o, Permute):
            y = new.permute(y, o.perm)
        else:
            side = _chain_side(g, o)
            c = g.scalar_value(o.b if side == o.a else o.a)
            y = new.binary(o.op, y, c) if side == o.a else new.binary(o.op, c, y)  # type: ignore[arg-type]
    bsz, groups = new.shape(y)[0], new.shape(y)[1]
    if batch != bsz * groups * r:
        return None
    rows = new.view(rw.get(op.a), Shape.of(bsz * groups, m * r, k))
    right = new.view(y, Shape.of(bsz * groups, k, n))
    out = new.matmul(rows, right)
    return new.view(out, Shape.of(batch, m, n))
