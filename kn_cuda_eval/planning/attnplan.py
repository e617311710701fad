"""Attention planning: one fused kernel over [B1, B2, m, d] views (the heads split off the batch
without a copy), or, when fused attention is off or the head is too large for it, scores by a
GEMM, a softmax with the mask and the causal limit as its prologue, and a GEMM with v."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.context import PlannerContext
from kn_cuda_eval.planning.lazy import Lazy
from kn_cuda_eval.planning.program import (
    Bin,
    Const,
    Index,
    Load,
    Program,
    ProgramBuilder,
    Sel,
    prune,
)
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType
from kn_graph.ops import BinaryOp, Broadcast, View

__all__ = ["plan_attention"]


def _combine(
    exprs: Sequence[st.Expr], shape: tuple[int, ...], op: Callable[[ProgramBuilder, list[int]], int]
) -> st.Expr:
    """One program computing `op` over the operands' programs (loads and indices deduplicated)."""
    pb = ProgramBuilder()
    inputs: list[StridedView] = []
    indices: list[StridedView] = []
    in_ids: dict[StridedView, int] = {}
    ix_ids: dict[StridedView, int] = {}
    roots: list[int] = []

    def intern(v: StridedView, ids: dict[StridedView, int], out: list[StridedView]) -> int:
        k = ids.get(v)
        if k is None:
            k = ids[v] = len(out)
            out.append(v)
        return k

    for e in exprs:
        lm = [intern(v, in_ids, inputs) for v in e.inputs]
        im = [intern(v, ix_ids, indices) for v in e.indices]
        ids = pb.splice(e.program, lm, im)
        roots.append(ids[e.program.roots[0]])
    root = op(pb, roots)
    return st.Expr(shape, tuple(inputs), tuple(indices), prune(pb.build([root])))


def _compact(e: st.Expr) -> st.Expr:
    """Renumber loads/indices to those the program still uses (after pruning)."""
    used_l = sorted({i.arg for i in e.program.instrs if isinstance(i, Load)})
    used_i = sorted({i.arg for i in e.program.instrs if isinstance(i, Index)})
    if len(used_l) == len(e.inputs) and len(used_i) == len(e.indices):
        return e
    lm = {a: k for k, a in enumerate(used_l)}
    im = {a: k for k, a in enumerate(used_i)}
    instrs = tuple(
        Load(lm[i.arg], i.dtype)
        if isinstance(i, Load)
        else Index(im[i.arg], i.dtype)
        if isinstance(i, Index)
        else i
        for i in e.program.instrs
    )
    return st.Expr(
        e.shape,
        tuple(e.inputs[a] for a in used_l),
        tuple(e.indices[a] for a in used_i),
        Program(instrs, e.program.roots),
    )


def _head_view(p: PlannerContext, i: int) -> StridedView | None:
    """When value i is [b, m, d] = view of x [B1, B2, m, d] (heads split off the batch), x's
    own 4-d view: the fused kernel walks both batch axes, so neither the permute of the heads
    nor a broadcast over them (multi-query keys, a per-sequence mask) needs a copy. The
    planned reshape of i, now unused, is dropped with the other dead steps."""
    op = p.g[p.val(i)].op
    if not isinstance(op, View):
        return None
    x = op.x.index
    xs, s = p.shape(x), p.shape(i)
    if len(xs) != 4 or xs[0] * xs[1] != s[0] or xs[2:] != s[1:]:
        return None
    xop = p.g[p.val(x)].op
    st_x = p.state[x]
    if isinstance(st_x, Lazy) and isinstance(xop, Broadcast) and p.uses[x] == 1:
        y = xop.x.index  # materialise the small tensor, broadcast it for free
        if len(p.shape(y)) == 4:
            return p.mat(y).broadcast(xs)
    if isinstance(st_x, StridedView):
        return st_x
    return None


def _grouped_view(p: PlannerContext, i: int) -> StridedView | None:
    """When value i is [b, n, d] = view of x [B, Hkv, R, n, d] — grouped-query keys or values,
    y [B, Hkv, 1, n, d] broadcast for the R query heads that read each head — x's view as
    [B·Hkv, R, n, d] (stride 0 over R): the kernel reads each head R times and nothing is
    copied (the repeat cost a copy of R times the cache per layer and token). None otherwise,
    or when B and Hkv do not merge."""
    op = p.g[p.val(i)].op
    if not isinstance(op, View):
        return None
    x = op.x.index
    xs, s = p.shape(x), p.shape(i)
    if len(xs) != 5 or xs[0] * xs[1] * xs[2] != s[0] or xs[3:] != s[1:]:
        return None
    xop, st_x = p.g[p.val(x)].op, p.state[x]
    if isinstance(st_x, StridedView):  # the planner's broadcast: stride 0 over R
        v = st_x
    elif isinstance(st_x, Lazy) and isinstance(xop, Broadcast) and p.uses[x] == 1:
        y = xop.x.index
        if len(p.shape(y)) != 5:
            return None
        v = p.mat(y).broadcast(xs)
    else:
        return None
    return v.reshape((xs[0] * xs[1], xs[2], *xs[3:]))


def _grouped_views(
    p: PlannerContext, ops: list[int], mats: list[StridedView], out: StridedView
) -> list[StridedView] | None:
    """The operand views split as [B·Hkv, R, m, d] when keys or values are grouped-query
    repeats (`_grouped_view`): queries and the output split their heads into (Hkv, R), a
    broadcast mask too; None when a mask read in place otherwise would need a copy so split
    that costs more than the repeats (a prefill's [B, Hq, m, n] mask; a decode's is one row)."""
    grouped = [_grouped_view(p, i) for i in ops]
    split = next((h.shape[:2] for h in grouped if h is not None), None)
    if split is None:
        return None
    saved = sum(math.prod(p.shape(i)) for i, h in zip(ops, grouped, strict=True) if h is not None)
    views = list(grouped)
    for k, i in enumerate(ops):
        if views[k] is None:
            head = _head_view(p, i)
            views[k] = None if head is None else head.reshape((*split, *head.shape[2:]))
            # a mask read in place, which this split would copy: worth it against the repeats?
            copied = views[k] is None and head is not None and k >= len(mats)
            if copied and math.prod(p.shape(i)) >= saved:
                return None
    return _split_views(p, ops, views, split, mats, out)


def _split_views(
    p: PlannerContext,
    ops: list[int],
    heads: list[StridedView | None],
    split: tuple[int, ...],
    mats: list[StridedView],
    out: StridedView,
) -> list[StridedView]:
    """`heads` (and out) split as `split`; an operand without such a view is read from its
    materialised [b, m, d] (the given `mats`, or made now) split so."""
    views: list[StridedView] = []
    for k, (i, h) in enumerate(zip(ops, heads, strict=True)):
        if h is None or h.shape[:2] != split:
            v = mats[k] if k < len(mats) else p.mat(i)
            h = v.reshape((*split, *v.shape[1:]))
            assert h is not None, "splitting an axis never needs a copy"
        views.append(h)
    o = out.reshape((*split, *out.shape[1:]))
    assert o is not None
    return [*views, o]


def _attention_views(
    p: PlannerContext, ops: list[int], mats: list[StridedView], out: StridedView
) -> list[StridedView]:
    """Operand views [B1, B2, m, d] (and out) sharing one split of the batch axis."""
    grouped = _grouped_views(p, ops, mats, out)
    if grouped is not None:
        return grouped
    heads = [_head_view(p, i) for i in ops]
    split = next(((h.shape[0], h.shape[1]) for h in heads if h is not None), (out.shape[0], 1))
    return _split_views(p, ops, heads, split, mats, out)


def plan_attention(
    p: PlannerContext, i: int, q: int, k: int, v: int, mask: int | None, scale: float, causal: bool
) -> None:
    """Plan value i = attention(q, k, v, mask): one fused kernel (`st.Attention`) when the
    settings allow and the head fits it, else a GEMM for the scores, a softmax whose prologue
    adds the mask and the causal -inf, and a GEMM with v."""
    info = p.g[p.val(i)]
    out = p.temp(p.shape(i), info.dtype, p.name(i))
    p.state[i] = out
    qv, kv, vv = p.mat(q), p.mat(k), p.mat(v)

    if p.s.fused_attention and vv.shape[2] <= st.ATTENTION_MAX_DV:
        ops = [q, k, v] if mask is None else [q, k, v, mask]
        views = _attention_views(p, ops, [qv, kv, vv], out)
        if out.numel > 0:
            mv = views[3] if mask is not None else None
            p.steps.append(st.Attention(views[0], views[1], views[2], mv, views[-1], scale, causal))
        return
    b, m, _ = qv.shape
    n = kv.shape[1]
    scores = p.temp((b, m, n), info.dtype, p.name(i) + " scores")
    p.gemm(qv, kv.permute((0, 2, 1)), scores, scale)
    parts = [st.Expr.of_view(scores)]
    if mask is not None:
        parts.append(p.row_input(mask))
    if causal:
        parts.append(
            st.Expr(
                (b, m, n),
                (),
                (
                    StridedView(0, (b, m, n), (0, 1, 0), DType.I64),
                    StridedView(0, (b, m, n), (0, 0, 1), DType.I64),
                ),
                Program((Index(0, DType.I64), Index(1, DType.I64)), (0,)),
            )
        )
    dt = info.dtype

    def prologue(pb: ProgramBuilder, r: list[int]) -> int:
        x = r[0]
        if mask is not None:
            x = pb.add(Bin(BinaryOp.ADD, x, r[1], dt))
        if causal:
            qi = pb.add(Index(0, DType.I64))
            kj = pb.add(Index(1, DType.I64))
            lim = pb.add(Bin(BinaryOp.ADD, qi, pb.add(Const(n - m, DType.I64)), DType.I64))
            above = pb.add(Bin(BinaryOp.GT, kj, lim, DType.BOOL))
            x = pb.add(Sel(above, pb.add(Const(-math.inf, dt)), x, dt))
        return x

    probs = p.temp((b, m, n), dt, p.name(i) + " probs")
    p.row_step(
        _compact(_combine(parts, (b, m, n), prologue)),
        probs,
        [2],
        lambda e, o: st.Softmax(e, o),
    )
    p.gemm(probs, vv, out, 1.0)
