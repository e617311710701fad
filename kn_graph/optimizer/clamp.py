"""Clamp fusion: chains of Min/Max with scalar constants (relu, relu6, clip, and exporters'
repetitions of them) become at most one Min followed by one Max.

Any such chain equals max(min(x, hi), lo): applying min(·, a) to it gives hi' = min(hi, a),
lo' = min(lo, a); applying max(·, b) gives lo' = max(lo, b) (lattice distributivity), and when
lo > hi the form correctly yields the constant lo.

relu then Clip(0, 6) (constants, views and broadcasts omitted on the left):

    %4: f32[8] = max(%0, %3)                 %1: f32[1] = const [0.0]
    %8: f32[8] = min(%4, %7)        ──▶      %2: f32[1] = const [6.0]
    %9: f32[8] = max(%8, %3)                 %3: f32[8] = broadcast(%2)
                                             %4: f32[8] = min(%0, %3)
                                             %5: f32[8] = broadcast(%1)
                                             %6: f32[8] = max(%4, %5)
"""

from __future__ import annotations

import math

from kn_graph.ops import Binary, BinaryOp, Value
from kn_graph.optimizer.core import Rewriter, rewrite
from kn_graph.optimizer.patterns import compact, feeds_const_binary, scalar

__all__ = ["fuse_clamp"]

_CLAMP = frozenset({BinaryOp.MIN, BinaryOp.MAX})


def _link(rw: Rewriter, v: Value) -> tuple[Value, BinaryOp, float] | None:
    """`v` as min/max of a non-constant value with a scalar constant that is not NaN."""
    info = rw.info(v)
    match info.op:
        case Binary(a, b, op) if op in _CLAMP and not info.dtype.is_bool:
            for x, c in ((a, b), (b, a)):
                s = scalar(rw.new, rw.get(c))
                if s is not None and not math.isnan(s) and compact(rw.new, rw.get(x)) is None:
                    return x, op, s
    return None


@rewrite("fuse_clamp")
def fuse_clamp(rw: Rewriter, v: Value) -> Value | None:
    """Seen from the top of a Min/Max-by-scalar chain whose inner values are hidden with one use,
    rebuild it as min(x, hi) then max(·, lo) when that takes fewer ops."""
    top = _link(rw, v)
    if top is None or feeds_const_binary(rw, v, _CLAMP, lambda g, c: scalar(g, c) is not None):
        return None
    links = [top]
    while rw.old.is_hidden_with_uses(links[-1][0], 1) and (nxt := _link(rw, links[-1][0])):
        links.append(nxt)
    lo, hi = -math.inf, math.inf
    for _, op, c in reversed(links):
        if op is BinaryOp.MIN:
            hi, lo = min(hi, c), min(lo, c)
        else:
            lo = max(lo, c)
    kept = (hi != math.inf) + (lo != -math.inf)
    if kept >= len(links):
        return None
    g = rw.new
    y = rw.get(links[-1][0])
    dt = g[y].dtype
    if hi != math.inf:
        y = g.minimum(y, g.scalar(_exact(hi, dt.is_float), dt))
    if lo != -math.inf:
        y = g.maximum(y, g.scalar(_exact(lo, dt.is_float), dt))
    return y


def _exact(c: float, is_float: bool) -> float | int:
    """The bound as the dtype's number (integer bounds were read through float and are exact
    up to 2^53, far beyond any clamp an exporter writes)."""
    return c if is_float else int(c)
