"""Training losses at inference: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

The per-element pick `input[n, target[n, d…], d…]` is a one-hot mask (an Iota over the class axis
compared with the target) and a sum over classes: no data-dependent indexing, so ignored or
out-of-range targets simply pick nothing, and symbolic sizes are fine.
"""

from __future__ import annotations

from dataclasses import dataclass

from kn_graph.graph import Graph
from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.ops import BinaryOp, ReduceOp, UnaryOp, Value
from kn_graph.shape import Shape


@dataclass(frozen=True, slots=True)
class _LossSpec:
    reduction: str
    ignore_index: int | None


def _spec(ctx: NodeContext) -> _LossSpec:
    reduction = ctx.attr_str("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        ctx.unsupported(f"reduction '{reduction}'")
    ignore = ctx.attr_int("ignore_index") if ctx.has_attr("ignore_index") else None
    return _LossSpec(reduction, ignore)


def _check(ctx: NodeContext, scores: Value, target: Value) -> None:
    g = ctx.graph
    s, t = g.shape(scores), g.shape(target)
    if not g.dtype(scores).is_float or not g.dtype(target).is_int:
        ctx.unsupported(
            f"expected float scores and integer targets, found {g.dtype(scores)} and {g.dtype(target)}"
        )
    if s.rank < 2 or t != Shape(s.dims[:1] + s.dims[2:]):
        ctx.unsupported(f"scores {s} [N, C, d...] and target {t} [N, d...] do not match")


def _nll(g: Graph, logp: Value, target: Value, weight: Value | None, spec: _LossSpec) -> Value:
    """-logp[n, t, d…]·w[t], zero where t is ignored, then reduced (mean: by the total weight)."""
    shape = g.shape(logp)
    hit = g.binary(BinaryOp.EQ, g.iota(shape, 1, g.dtype(target)), g.unsqueeze(target, [1]))
    loss = g.neg(g.reduce(g.select(hit, logp, 0.0), [1], ReduceOp.SUM))
    w: Value | None = None
    if weight is not None:
        per_class = g.view(weight, Shape.of(1, shape[1], *([1] * (shape.rank - 2))))
        w = g.reduce(g.select(hit, g.broadcast(per_class, shape), 0.0), [1], ReduceOp.SUM)
    if spec.ignore_index is not None:
        keep = g.unary(UnaryOp.NOT, g.binary(BinaryOp.EQ, target, spec.ignore_index))
        w = g.select(keep, w, 0.0) if w is not None else g.cast(keep, g.dtype(logp))
    if w is not None:
        loss = g.mul(loss, w)
    every = list(range(g[loss].rank))
    match spec.reduction:
        case "none":
            return loss
        case "sum":
            return g.reduce(loss, every, ReduceOp.SUM)
        case _:
            if w is None:
                return g.reduce(loss, every, ReduceOp.MEAN)
            return g.div(g.reduce(loss, every, ReduceOp.SUM), g.reduce(w, every, ReduceOp.SUM))


def _weight(ctx: NodeContext, scores: Value) -> Value | None:
    g = ctx.graph
    w = ctx.optional_input(2)
    if w is not None and (
        g.shape(w) != Shape.of(g.shape(scores)[1]) or g.dtype(w) != g.dtype(scores)
    ):
        ctx.unsupported(
            f"weight {g.dtype(w)}{g.shape(w)} for scores {g.dtype(scores)}{g.shape(scores)}"
        )
    return w


@onnx_op("NegativeLogLikelihoodLoss")
def negative_log_likelihood_loss(ctx: NodeContext) -> Result:
    logp, target = ctx.input(0), ctx.input(1)
    _check(ctx, logp, target)
    return _nll(ctx.graph, logp, target, _weight(ctx, logp), _spec(ctx))


@onnx_op("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_loss(ctx: NodeContext) -> Result:
    """NLL of log_softmax(scores) over the class axis; the log-probabilities are output 1."""
    g = ctx.graph
    scores, target = ctx.input(0), ctx.input(1)
    _check(ctx, scores, target)
    shifted = g.sub(scores, g.reduce(scores, [1], ReduceOp.MAX, keepdims=True))
    logp = g.sub(shifted, g.log(g.reduce(g.exp(shifted), [1], ReduceOp.SUM, keepdims=True)))
    return [_nll(g, logp, target, _weight(ctx, scores), _spec(ctx)), logp]
