"""Attention detection: softmax(Q·Kᵀ·s [+ mask])·V becomes one `Attention` op, so a device can run
the whole block as a fused kernel; `decompose_attention_ops` undoes it for devices that cannot.

The exporters spell the block in many ways and the loader keeps their shape: the scale is a Mul or
Div by a scalar on the scores, on Q, on Kᵀ or on both (√s each); Kᵀ is a Permute; batch and head
dims are Views around the rank-3 MatMuls (`matmul_nd`); masks are added before the Softmax, either
as a constant or a Select(cond, 0, -big) built from the inputs and Iota comparisons. Every
intermediate of the block must be hidden with one use, so nothing another user reads is lost.

>>> from kn_graph import DType, Graph, Shape
>>> from kn_graph.optimizer import optimize
>>> g = Graph()
>>> q, k, v = (g.input(Shape.of(2, 3, 4), DType.F32, n) for n in "qkv")
>>> s = g.mul(g.matmul(q, g.permute(k, (0, 2, 1))), 0.5)
>>> g.add_output(g.matmul(g.softmax(s, 2), v), "y")
>>> print(optimize(g))
%0: f32[2,3,4] = input #0 "q"
%1: f32[2,3,4] = input #1 "k"
%2: f32[2,3,4] = input #2 "v"
%3: f32[2,3,4] = attention(%0, %1, %2) scale=0.5
outputs: %3 "y"
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kn_graph.attention import decompose_attention
from kn_graph.graph import Graph
from kn_graph.ops import (
    Attention,
    Binary,
    BinaryOp,
    Broadcast,
    Constant,
    Input,
    Iota,
    MatMul,
    Permute,
    Select,
    Softmax,
    Value,
    View,
)
from kn_graph.optimizer.core import OptimizerSettings, Rewriter, copy_op, rewrite
from kn_graph.shape import Shape, Size

__all__ = ["decompose_attention_ops", "detect_attention"]


# -- the match, on the old graph ------------------------------------------------------------------
@dataclass(slots=True)
class _Operand:
    """A Q or Kᵀ operand of the scores MatMul with a scalar scale peeled off: `base` is the operand
    of the Mul/Div, `chain` the View/Permute/Broadcast values above it (nearest the MatMul first)."""

    base: Value
    chain: list[Value] = field(default_factory=list)
    factor: float = 1.0


@dataclass(slots=True)
class _Mask:
    """One masking step on the scores, with the scale applied after it: an additive mask
    (`scores + value`), or a masked fill (`Select(value, scores, fill)`, or `Select(value, fill,
    scores)` when `fill_on_true`) whose fill is -inf or a huge negative number."""

    value: Value
    factor: float
    fill: float | None = None
    fill_on_true: bool = False
    lowest: float = 0.0  # half the scores dtype's lowest value: what still masks like -inf


@dataclass(slots=True)
class _Block:
    q: _Operand
    kt: _Operand
    v: Value
    masks: list[_Mask]
    scale: float


def _scalar(g: Graph, x: Value) -> float | None:
    """A finite, non-zero float scalar constant (looking through views and broadcasts)."""
    s = g.scalar_value(x)
    if s is None or isinstance(s, bool) or not g[x].dtype.is_float:
        return None
    s = float(s)
    return s if math.isfinite(s) and s != 0.0 else None


def _huge_negative(g: Graph, x: Value) -> float | None:
    """A scalar constant that masks like -inf: -inf itself or below half the dtype's lowest."""
    s = g.scalar_value(x)
    if s is None or isinstance(s, bool) or not g[x].dtype.is_float:
        return None
    return float(s) if float(s) <= float(np.finfo(g[x].dtype.np).min) / 2 else None


def _fill_select(g: Graph, x: Value) -> tuple[Value, _Mask] | None:
    """x = Select(cond, scores, fill) or Select(cond, fill, scores): (scores, mask)."""
    op = g[x].op
    if not isinstance(op, Select):
        return None
    fa, fb = _huge_negative(g, op.a), _huge_negative(g, op.b)
    lowest = float(np.finfo(g[x].dtype.np).min) / 2
    if fb is not None and fa is None:
        return op.a, _Mask(op.cond, 1.0, fb, False, lowest)
    if fa is not None and fb is None:
        return op.b, _Mask(op.cond, 1.0, fa, True, lowest)
    return None


def _scaled(g: Graph, x: Value) -> tuple[Value, float] | None:
    """x = y·s, s·y or y/s with a scalar constant s: (y, factor)."""
    match g[x].op:
        case Binary(a, b, BinaryOp.MUL):
            if (s := _scalar(g, b)) is not None:
                return a, s
            if (s := _scalar(g, a)) is not None:
                return b, s
        case Binary(a, b, BinaryOp.DIV):
            if (s := _scalar(g, b)) is not None:
                return a, 1.0 / s
    return None


def _peel_scale(g: Graph, x: Value) -> _Operand:
    """Find a scalar scale below a chain of View/Permute/Broadcast (all hidden with one use, so
    the unscaled rebuild replaces them); without one the operand is used as it is."""
    chain: list[Value] = []
    cur = x
    while g.is_hidden_with_uses(cur, 1):
        op = g[cur].op
        match op:
            case View(y) | Broadcast(y) | Permute(y, _):
                chain.append(cur)
                cur = y
            case _:
                hit = _scaled(g, cur)
                if hit is None:
                    break
                return _Operand(hit[0], chain, hit[1])
    return _Operand(x)


def _landing(g: Graph, x: Value) -> int:
    """How much `x` looks like the scores side of an Add: 2 when views, scalings and masked
    fills lead to a rank-3 MatMul, 1 when they lead to another Add (more masks below), else 0."""
    for _ in range(64):  # bounded walk down a linear chain
        op = g[x].op
        match op:
            case View(y):
                x = y
            case MatMul():
                return 2
            case Binary(_, _, BinaryOp.ADD):
                return 1
            case _:
                hit = _scaled(g, x)
                fill = _fill_select(g, x) if hit is None else None
                if hit is None and fill is None:
                    return 0
                x = hit[0] if hit is not None else fill[0]  # type: ignore[index]
    return 0


def _match(g: Graph, v: Value) -> _Block | None:
    op = g[v].op
    if not isinstance(op, MatMul):
        return None
    p, vv = op.a, op.b
    mn = g[p].shape.dims[1:]
    # the probabilities: views of a Softmax over the last axis, keeping the [m, n] tail
    while isinstance(g[p].op, View):
        if not g.is_hidden_with_uses(p, 1):
            return None
        p = g[p].op.x  # type: ignore[attr-defined]
    sm = g[p].op
    if not (isinstance(sm, Softmax) and g.is_hidden_with_uses(p, 1)):
        return None
    if sm.axis != g[p].rank - 1 or g[p].shape.dims[-2:] != mn:
        return None
    # the scores: views, scalings and mask additions down to the Q·Kᵀ MatMul
    x, factor = sm.x, 1.0
    masks: list[_Mask] = []
    while True:
        info = g[x]
        if info.rank < 2 or info.shape.dims[-2:] != mn or not g.is_hidden_with_uses(x, 1):
            return None
        match info.op:
            case View(y):
                x = y
            case MatMul(qa, kb):
                break
            case Binary(a, b, BinaryOp.ADD):
                la, lb = _landing(g, a), _landing(g, b)
                if max(la, lb) == 0:
                    return None
                scores, mask = (a, b) if la >= lb else (b, a)
                masks.append(_Mask(mask, factor))
                x = scores
            case Select():
                fill = _fill_select(g, x)
                if fill is None:
                    return None
                x, mk = fill
                mk.factor = factor
                masks.append(mk)
            case _:
                hit = _scaled(g, x)
                if hit is None:
                    return None
                x, s = hit
                factor *= s
    q, kt = _peel_scale(g, qa), _peel_scale(g, kb)
    return _Block(q, kt, vv, masks, factor * q.factor * kt.factor)


# -- causal masks -------------------------------------------------------------------------------
def _strip_tail(g: Graph, x: Value) -> Value | None:
    """The value below Views/Broadcasts that all keep x's [m, n] tail (so its last two axes are
    x's rows and columns), or None when one of them reshapes the tail."""
    tail = g[x].shape.dims[-2:]
    while isinstance(op := g[x].op, View | Broadcast):
        if g[op.x].rank < 2 or g[op.x].shape.dims[-2:] != tail:
            return None
        x = op.x
    return x


def _unsqueeze_axis(src: Shape, dst: Shape, axis: int) -> int | None:
    """Where `axis` of `dst` comes from in `src` when a View only adds or removes 1-sized dims."""
    s_real = [i for i, d in enumerate(src) if d != Size(1)]
    d_real = [i for i, d in enumerate(dst) if d != Size(1)]
    if [src[i] for i in s_real] != [dst[i] for i in d_real] or axis not in d_real:
        return None
    return s_real[d_real.index(axis)]


def _is_causal(g: Graph, mask: _Mask) -> bool:
    """True when the mask is exactly the causal mask for its [.., m, n] tail: 0 (kept) where
    j <= i + (n - m), -inf or a huge negative value elsewhere."""
    info = g[mask.value]
    m, n = info.shape[-2], info.shape[-1]
    if m.is_fixed and n.is_fixed:
        offset = n.as_int() - m.as_int()
    elif m == n:
        offset = 0
    else:
        return False
    if mask.fill is not None:  # masked fill: the condition says where
        fill_ok = mask.fill * mask.factor <= mask.lowest
        return fill_ok and _cond_is_causal(g, mask.value, not mask.fill_on_true, offset)
    lowest = float(np.finfo(info.dtype.np).min) / 2
    base = _strip_tail(g, mask.value)
    if base is None:
        return False
    bop = g[base].op
    if isinstance(bop, Constant):
        a = _tail_matrices(bop.tensor.array).astype(np.float64) * mask.factor
        allowed = _allowed(a.shape[1], a.shape[2], offset)
        return bool(np.all(a[:, allowed] == 0) and np.all(a[:, ~allowed] <= lowest))
    if not isinstance(bop, Select):
        return False
    t, f = g.scalar_value(bop.a), g.scalar_value(bop.b)
    if t is None or f is None:
        return False
    if t == 0 and f * mask.factor <= lowest:
        return _cond_is_causal(g, bop.cond, True, offset)
    if f == 0 and t * mask.factor <= lowest:
        return _cond_is_causal(g, bop.cond, False, offset)
    return False


def _cond_is_causal(g: Graph, cond: Value, allowed: bool, offset: int) -> bool:
    """Whether the bool `cond` is the causal pattern (`allowed`) or its negation."""
    base = _strip_tail(g, cond)
    if base is not None and isinstance(cop := g[base].op, Constant):  # a folded comparison
        c = _tail_matrices(cop.tensor.array)
        return bool(np.all(c == _allowed(c.shape[1], c.shape[2], offset) ^ (not allowed)))
    rel = _col_minus_row(g, cond)
    if rel is None:
        return False
    le, k = rel  # cond ⇔ (col - row) <= k when le, else (col - row) > k
    return le == allowed and k == offset


def _tail_matrices(a: np.ndarray) -> np.ndarray:
    """A constant as a stack of its [m, n] tail matrices."""
    return a.reshape(-1, *a.shape[-2:])


def _allowed(m: int, n: int, offset: int) -> np.ndarray:
    """bool [m, n]: j <= i + offset."""
    return np.arange(n)[None, :] <= np.arange(m)[:, None] + offset


def _col_minus_row(g: Graph, cond: Value) -> tuple[bool, int] | None:
    """cond as a relation of the column and row indices: (True, k) for (col - row) <= k,
    (False, k) for (col - row) > k."""
    cur = _strip_tail(g, cond)
    if cur is None:
        return None
    op = g[cur].op
    if not (
        isinstance(op, Binary) and op.op in (BinaryOp.LE, BinaryOp.LT, BinaryOp.GE, BinaryOp.GT)
    ):
        return None
    r = g[cur].rank
    sides = []
    for x in (op.a, op.b):
        for which, axis in ((1, r - 1), (0, r - 2)):
            hit = _affine_index(g, x, axis)
            if hit is not None:
                sides.append((which, hit))
                break
        else:
            return None
    (wa, ca), (wb, cb) = sides
    if wa == wb:
        return None
    rel: BinaryOp = op.op
    if wa == 0:  # row on the left: swap to put the column first
        flip = {
            BinaryOp.LE: BinaryOp.GE,
            BinaryOp.LT: BinaryOp.GT,
            BinaryOp.GE: BinaryOp.LE,
            BinaryOp.GT: BinaryOp.LT,
        }
        rel, ca, cb = flip[rel], cb, ca
    # (col + ca) REL (row + cb)  ⇔  (col - row) REL (cb - ca)
    k = cb - ca
    match rel:
        case BinaryOp.LE:
            return True, k
        case BinaryOp.LT:
            return True, k - 1
        case BinaryOp.GT:
            return False, k
        case _:  # GE
            return False, k - 1


def _affine_index(g: Graph, x: Value, axis: int) -> int | None:
    """x = iota_along(axis) + c for an integer constant c (c returned), else None."""
    c = 0
    match g[x].op:
        case Binary(a, b, BinaryOp.ADD | BinaryOp.SUB as bop):
            k = g.scalar_value(b)
            if k is None or isinstance(k, bool) or float(k) != int(k):
                return None
            c = int(k) if bop is BinaryOp.ADD else -int(k)
            x = a
    cur = x
    while True:
        op = g[cur].op
        match op:
            case Broadcast(y):
                if g[y].shape[axis] != g[cur].shape[axis]:
                    return None  # the index axis itself is broadcast: not varying along it
                cur = y
            case View(y):
                a2 = _unsqueeze_axis(g[y].shape, g[cur].shape, axis)
                if a2 is None:
                    return None
                axis, cur = a2, y
            case Iota(iaxis):
                return c if iaxis == axis else None
            case _:
                return None


# -- the rewrite, building into the new graph -------------------------------------------------------
def _rebuild(rw: Rewriter, operand: _Operand) -> Value:
    """The operand without its scale: the chain above the Mul/Div re-applied to its input."""
    cur = rw.get(operand.base)
    for old in reversed(operand.chain):  # each link has one operand: the value below it
        info = rw.old[old]
        below = cur
        cur = copy_op(rw.new, info, info.op.map_inputs(lambda _: below))  # noqa: B023
    return cur


def _transpose_back(g: Graph, kt: Value) -> Value:
    """K [b, n, d] from Kᵀ [b, d, n]; when Kᵀ is a View whose source keeps the [d, n] tail, the
    swap goes below the View so it merges with the exporter's own Permute."""
    info = g[kt]
    b, d, n = info.shape
    op = info.op
    if isinstance(op, View):
        src = g[op.x]
        if src.rank >= 2 and src.shape.dims[-2:] == (d, n):
            perm = [*range(src.rank - 2), src.rank - 1, src.rank - 2]
            return g.view(g.permute(op.x, perm), Shape.of(b, n, d))
    return g.permute(kt, (0, 2, 1))


@rewrite("detect_attention")
def detect_attention(rw: Rewriter, v: Value) -> Value | None:
    """softmax(Q·Kᵀ·s + masks)·V (the final MatMul `v`) → attention(Q, K, V, mask, s, causal)."""
    g = rw.old
    block = _match(g, v)
    if block is None or not math.isfinite(block.scale):
        return None
    masks = [mk for mk in block.masks if mk.fill is not None or g.scalar_value(mk.value) != 0]
    causal = len(masks) == 1 and _is_causal(g, masks[0])
    new = rw.new
    q = _rebuild(rw, block.q)
    k = _transpose_back(new, _rebuild(rw, block.kt))
    vv = rw.get(block.v)
    b, m, _ = new[q].shape
    n = new[k].shape[1]
    mask: Value | None = None
    if not causal:
        for mk in masks:
            term = new.view(rw.get(mk.value), Shape.of(b, m, n))
            if mk.fill is not None:  # masked fill → additive: 0 where kept, the fill elsewhere
                dt = new[q].dtype
                zero, fill = new.scalar(0.0, dt), new.scalar(mk.fill, dt)
                term = (
                    new.select(term, fill, zero)
                    if mk.fill_on_true
                    else new.select(term, zero, fill)
                )
            if mk.factor != 1.0:
                term = new.mul(term, mk.factor)
            mask = term if mask is None else new.add(mask, term)
    return new.attention(q, k, vv, mask, block.scale, causal)


# -- the inverse pass ---------------------------------------------------------------------------------
def decompose_attention_ops(graph: Graph) -> Graph:
    """A copy of `graph` with every Attention op lowered to matmul/softmax (for devices without
    an attention kernel); everything else is rebuilt as it is."""
    rw = Rewriter(graph, OptimizerSettings())
    for v in graph.values():
        info = graph[v]
        if isinstance(info.op, Input):
            new_v = rw.new.input(info.shape, info.dtype, info.debug_name)
        elif isinstance(op := info.op.map_inputs(rw.get), Attention):
            new_v = decompose_attention(rw.new, op.q, op.k, op.v, op.mask, op.scale, op.causal)
        else:
            new_v = copy_op(rw.new, info, op)
        if info.debug_name:
            rw.new.set_debug_name(new_v, info.debug_name)
        rw.set(v, new_v)
    for v, name in zip(graph.outputs, graph.output_names, strict=True):
        rw.new.add_output(rw.get(v), name)
    return rw.new
