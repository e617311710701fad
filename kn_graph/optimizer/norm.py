"""Layernorm detection: the arithmetic exporters emit for a layer normalisation becomes one
Layernorm op (the affine Mul/Add after it stays separate), which a device runs as one kernel.

Recognised (ONNX ReduceMean lowers to Reduce MEAN plus a keepdims View; Sub/Div broadcast it):

    m = mean(x, axes);  d = x - m;  var = mean(d², axes)   with d² = pow(d, 2) or d·d
    y = d / sqrt(var + eps)            (TorchScript, opset < 17)
    y = d · reciprocal(sqrt(var + eps)) | d · (1 / sqrt(var + eps)) | d · pow(var + eps, -0.5)

Every intermediate value must be hidden with exactly the uses the pattern makes of it, so no
work another user needs is duplicated.

    %0: f32[B,8] = input #0 "x"                 %0: f32[B,8] = input #0 "x"
    %1: f32[B] = reduce_mean(%0) axes=[1]  ──▶   %1: f32[B,8] = layernorm(%0) axis=1 eps=1e-05
    %2: f32[B,1] = view(%1)
    %3: f32[B,8] = broadcast(%2)
    %4: f32[B,8] = sub(%0, %3)
    ... (pow 2, reduce_mean, view, add eps)
    %15: f32[B,1] = sqrt(%14)
    %16: f32[B,8] = broadcast(%15)
    %17: f32[B,8] = div(%4, %16)
"""

from __future__ import annotations

from kn_graph.ops import Binary, BinaryOp, Reduce, ReduceOp, Unary, UnaryOp, Value, View
from kn_graph.optimizer.core import Rewriter, rewrite
from kn_graph.optimizer.patterns import approx, scalar, strip_broadcast
from kn_graph.shape import Shape, Size

__all__ = ["detect_layernorm"]


def _keepdims_mean(
    rw: Rewriter, v: Value, hidden: list[Value]
) -> tuple[Value, tuple[int, ...]] | None:
    """`v` = View(Reduce MEAN(x, axes)) restoring the reduced axes as 1s: (x, axes)."""
    g = rw.old
    match g[v].op:
        case View(r):
            match g[r].op:
                case Reduce(x, axes, ReduceOp.MEAN):
                    kept = Shape(
                        tuple(Size(1) if i in axes else d for i, d in enumerate(g[x].shape))
                    )
                    if g[v].shape == kept:
                        hidden.extend((v, r))
                        return x, axes
    return None


def _inv_std(rw: Rewriter, v: Value, hidden: list[Value]) -> Value | None:
    """`v` as 1/sqrt(e) in one of the exporters' spellings: e, else None."""
    g = rw.old
    match g[v].op:
        case Unary(s, UnaryOp.RECIPROCAL):
            match g[s].op:
                case Unary(e, UnaryOp.SQRT):
                    hidden.extend((v, s))
                    return e
        case Binary(one, s, BinaryOp.DIV) if approx(scalar(rw.new, rw.get(one)), 1.0, 0.0):
            match g[s].op:
                case Unary(e, UnaryOp.SQRT):
                    hidden.extend((v, s))
                    return e
        case Binary(e, p, BinaryOp.POW) if approx(scalar(rw.new, rw.get(p)), -0.5, 0.0):
            hidden.append(v)
            return e
    return None


def _match(rw: Rewriter, v: Value) -> tuple[Value, tuple[int, ...], float] | None:
    """(x, axes, eps) when `v` is the top of a layernorm pattern, else None."""
    g = rw.old
    hidden: list[Value] = []  # values that must be hidden with exactly one use
    candidates: list[tuple[Value, Value]] = []  # (d, var + eps)
    match g[v].op:
        case Binary(d, sb, BinaryOp.DIV):
            s = strip_broadcast(g, sb)
            match g[s].op:
                case Unary(e, UnaryOp.SQRT):
                    hidden.extend({sb, s})
                    candidates.append((d, e))
        case Binary(a, b, BinaryOp.MUL):
            for d, rb in ((a, b), (b, a)):
                r = strip_broadcast(g, rb)
                extra: list[Value] = [rb] if rb != r else []
                e = _inv_std(rw, r, extra)
                if e is not None:
                    hidden.extend(extra)
                    candidates.append((d, e))
                    break
    if not candidates:
        return None
    d, e = candidates[0]
    # e = var + eps
    match g[e].op:
        case Binary(p, q, BinaryOp.ADD):
            eps, var = scalar(rw.new, rw.get(q)), p
            if eps is None:
                eps, var = scalar(rw.new, rw.get(p)), q
        case _:
            return None
    if eps is None:
        return None
    hidden.append(e)
    got = _keepdims_mean(rw, var, hidden)
    if got is None:
        return None
    sq, axes = got
    d_uses = 2
    match g[sq].op:
        case Binary(d2, two, BinaryOp.POW) if d2 == d and approx(
            scalar(rw.new, rw.get(two)), 2.0, 0.0
        ):
            pass
        case Binary(d1, d2, BinaryOp.MUL) if d1 == d2 == d:
            d_uses = 3
        case _:
            return None
    hidden.append(sq)
    match g[d].op:
        case Binary(x, mb, BinaryOp.SUB):
            pass
        case _:
            return None
    m = strip_broadcast(g, mb)
    if m == mb:
        return None
    hidden.append(mb)
    got = _keepdims_mean(rw, m, hidden)
    if got is None or got != (x, axes):
        return None
    if not g.is_hidden_with_uses(d, d_uses):
        return None
    if not all(g.is_hidden_with_uses(h, 1) for h in hidden):
        return None
    if not g[v].dtype.is_float or g[v].shape != g[x].shape:
        return None
    return x, axes, eps


@rewrite("detect_layernorm")
def detect_layernorm(rw: Rewriter, v: Value) -> Value | None:
    """Replace a matched layernorm by one Layernorm op; several normalised axes must be
    consecutive and are merged into one by a view around it."""
    got = _match(rw, v)
    if got is None:
        return None
    x_old, axes, eps = got
    first, last = axes[0], axes[-1]
    if axes != tuple(range(first, last + 1)):
        return None
    g = rw.new
    x = rw.get(x_old)
    if first == last:
        return g.layernorm(x, first, eps)
    shape = g[x].shape
    merged = (
        Shape(shape.dims[:first])
        + Shape.of(Shape(shape.dims[first : last + 1]).size())
        + Shape(shape.dims[last + 1 :])
    )
    return g.view(g.layernorm(g.view(x, merged), first, eps), shape)
