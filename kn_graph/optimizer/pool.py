"""A clamp from below before a max pool moves after it: max over the window taps of max(x, c)
is max(max over the taps of x, c) — max is associative and commutative, and NaN spreads through
both forms alike (`np.maximum`), so the result is the same bit for bit. The ReLU between a
convolution and its max pool then costs one pass over the pooled values (fused into the pool's
kernel) instead of one over the convolution's whole output.

The IR's max pool (`nn.pool`) is a tree of Max over strided slices of its input; the rewrite
fires at the top of such a tree whose every leaf is a chain of slices of one value r = max(x, c)
(c a scalar constant, not NaN) that nothing else uses:

    %1 = max(%0, 0.0)                         %1 = slice(%0 ...)  %2 = slice(%0 ...)
    %2 = slice(%1 ...)   %3 = slice(%1 ...)   ──▶   %3 = max(%1, %2)
    %4 = max(%2, %3)                                %4 = max(%3, 0.0)
"""

from __future__ import annotations

import math

from kn_graph.ops import Binary, BinaryOp, Slice, Value
from kn_graph.optimizer.core import Rewriter, rewrite
from kn_graph.optimizer.patterns import compact, scalar

__all__ = ["max_through_pool"]


def _leaves(rw: Rewriter, v: Value) -> list[Value]:
    """The operands of the Max tree topped by `v`, left to right, looking through inner Max
    nodes that only this tree uses."""
    g = rw.old
    match g[v].op:
        case Binary(a, b, BinaryOp.MAX):
            out: list[Value] = []
            for x in (a, b):
                inner = isinstance(g[x].op, Binary) and g[x].op.op is BinaryOp.MAX  # type: ignore[union-attr]
                out += _leaves(rw, x) if inner and g.is_hidden_with_uses(x, 1) else [x]
            return out
    return [v]


def _base(rw: Rewriter, v: Value) -> Value | None:
    """The value below the chain of slices `v` is (None when `v` is not a slice)."""
    g = rw.old
    if not isinstance(g[v].op, Slice):
        return None
    while isinstance(op := g[v].op, Slice):
        v = op.x
    return v


def _clamped_below(rw: Rewriter, r: Value) -> tuple[Value, float] | None:
    """r as max(x, c) with c a scalar constant that is not NaN."""
    info = rw.info(r)
    match info.op:
        case Binary(a, b, BinaryOp.MAX) if not info.dtype.is_bool:
            for x, c in ((a, b), (b, a)):
                s = scalar(rw.new, rw.get(c))
                if s is not None and not math.isnan(s) and compact(rw.new, rw.get(x)) is None:
                    return x, s
    return None


@rewrite("max_through_pool")
def max_through_pool(rw: Rewriter, v: Value) -> Value | None:
    """Seen from the top of a Max tree over slices of max(x, c) that nothing else reads,
    rebuild it over slices of x, with the clamp after."""
    g = rw.old
    leaves = _leaves(rw, v)
    bases = {_base(rw, leaf) for leaf in leaves}
    if len(leaves) < 2 or len(bases) != 1 or None in bases:
        return None  # not all slices of one value
    (r,) = bases
    assert r is not None
    readers: dict[Value, set[Value]] = {}  # every slice of the tree under r, by what it reads
    for leaf in set(leaves):
        u = leaf
        while u != r:
            x = g[u].op.x  # type: ignore[union-attr]
            readers.setdefault(x, set()).add(u)
            u = x
    for u, users in readers.items():  # the tree's slices and r are read by the tree only
        if not g.is_hidden_with_uses(u, len(users)):
            return None
    if any(not g.is_hidden_with_uses(leaf, leaves.count(leaf)) for leaf in set(leaves)):
        return None
    clamped = _clamped_below(rw, r)
    if clamped is None:
        return None
    x, c = clamped
    new = rw.new
    made: dict[Value, Value] = {r: rw.get(x)}

    def rebuilt(u: Value) -> Value:
        if u not in made:
            op = g[u].op
            assert isinstance(op, Slice)
            made[u] = new.slice_raw(rebuilt(op.x), op.axis, op.start, op.step, g[u].shape[op.axis])
        return made[u]

    top = rebuilt(leaves[0])
    for leaf in leaves[1:]:
        top = new.maximum(top, rebuilt(leaf))
    dt = new[top].dtype
    return new.maximum(top, new.scalar(c if dt.is_float else int(c), dt))
