"""Affine fusion: chains of Add/Sub/Mul/Div by constants (batchnorm, bias, scale) collapse into one
scale and one bias, folded into an adjacent convolution's filter when that is exact; and
division by a constant becomes multiplication by its reciprocal.

The IR's Conv has no bias: the "bias" of a convolution is the per-channel Add that follows it.
After a convolution, y = conv(x, w)·s + b with s per output channel is conv(x, w·s) + b, always.
Before it, conv(x·s + b, w) = conv(x, w·s) + Σ w·b only when there is no padding (the zeros the
convolution pads with would otherwise become b); a pure scale (b = 0) folds whatever the padding.

((x + 1)·2 - 3)/4 (constants, views and broadcasts of the input side omitted):

    %4: f32[B,4] = add(%0, %3)                %1: f32[1,1] = const [0.5]
    %8: f32[B,4] = mul(%4, %7)        ──▶     %2: f32[B,4] = broadcast(%1)
    %12: f32[B,4] = sub(%8, %11)              %3: f32[B,4] = mul(%0, %2)
    %16: f32[B,4] = div(%12, %15)             %4: f32[1,1] = const [-0.25]
                                              %5: f32[B,4] = broadcast(%4)
                                              %6: f32[B,4] = add(%3, %5)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kn_graph.ops import Binary, BinaryOp, Conv, ConvDetails, Value
from kn_graph.optimizer.core import Rewriter, rewrite
from kn_graph.optimizer.patterns import (
    compact,
    emit_compact,
    feeds_const_binary,
    feeds_round,
    squeeze_equal,
)

__all__ = ["div_to_mul", "fold_affine_into_conv", "fuse_affine"]

_AFFINE = frozenset({BinaryOp.ADD, BinaryOp.SUB, BinaryOp.MUL, BinaryOp.DIV})


@dataclass(frozen=True, slots=True)
class _Link:
    """One affine step `value = x op c` (or `c op x` when `const_first`), c a compact constant."""

    value: Value
    x: Value
    op: BinaryOp
    const: np.ndarray
    const_first: bool


@dataclass(frozen=True, slots=True)
class _Affine:
    """base·scale + bias (float64 compact arrays of the chain's rank) and the links it replaces."""

    base: Value
    scale: np.ndarray
    bias: np.ndarray
    links: tuple[_Link, ...]  # top first

    @property
    def has_scale(self) -> bool:
        return not bool(np.all(self.scale == 1.0))

    @property
    def has_bias(self) -> bool:
        return not bool(np.all(self.bias == 0.0))


def _link(rw: Rewriter, v: Value) -> _Link | None:
    """`v` as one affine step on a float value, or None."""
    info = rw.info(v)
    match info.op:
        case Binary(a, b, op) if op in _AFFINE and info.dtype.is_float:
            ca, cb = compact(rw.new, rw.get(a)), compact(rw.new, rw.get(b))
            if cb is not None and ca is None:
                return _Link(v, a, op, cb, False)
            if ca is not None and cb is None and op is not BinaryOp.DIV:
                return _Link(v, b, op, ca, True)
    return None


def _chain(rw: Rewriter, top: _Link) -> _Affine | None:
    """Follow links down from `top` while each lower value is hidden with one use, and compose
    them; None when the composed constants would be larger than the ones they replace or a
    divisor is zero."""
    links = [top]
    while rw.old.is_hidden_with_uses(links[-1].x, 1):
        nxt = _link(rw, links[-1].x)
        if nxt is None:
            break
        links.append(nxt)
    rank = rw.info(top.value).rank
    scale = np.ones((1,) * rank)
    bias = np.zeros((1,) * rank)
    with np.errstate(all="ignore"):
        for lk in reversed(links):
            c = lk.const.astype(np.float64)
            match lk.op, lk.const_first:
                case BinaryOp.ADD, _:
                    bias = bias + c
                case BinaryOp.SUB, False:
                    bias = bias - c
                case BinaryOp.SUB, True:
                    scale, bias = -scale, c - bias
                case BinaryOp.MUL, _:
                    scale, bias = scale * c, bias * c
                case _:  # x / c
                    if bool(np.any(c == 0)):
                        return None
                    scale, bias = scale / c, bias / c
    if max(scale.size, bias.size) > max(lk.const.size for lk in links):
        return None
    return _Affine(links[-1].x, squeeze_equal(scale), squeeze_equal(bias), tuple(links))


def _is_canonical(links: tuple[_Link, ...]) -> bool:
    """One link, or one scale below one shift: rebuilding would not save anything."""
    if len(links) == 1:
        return True
    top, bottom = links[0], links[-1]
    return (
        len(links) == 2
        and bottom.op in (BinaryOp.MUL, BinaryOp.DIV)
        and (top.op is BinaryOp.ADD or (top.op is BinaryOp.SUB and not top.const_first))
    )


def _per_channel(arr: np.ndarray) -> bool:
    """Varies along axis 1 at most (the channel axis of [N, C, *spatial])."""
    return arr.ndim >= 2 and all(d == 1 for i, d in enumerate(arr.shape) if i != 1)


def _apply(rw: Rewriter, x: Value, scale: np.ndarray, bias: np.ndarray) -> Value:
    """x·scale + bias in the new graph (the builders drop a unit scale and a zero bias)."""
    g = rw.new
    shape = g[x].shape
    dt = g[x].dtype.np
    y = g.mul(x, emit_compact(g, squeeze_equal(scale.astype(dt)), shape))
    return g.add(y, emit_compact(g, squeeze_equal(bias.astype(dt)), shape))


def _scale_filter(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """w [K, ...] with row k multiplied by s[k], computed in f64 and rounded once."""
    return (w.astype(np.float64) * s.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype)


def _conv_with_pre_bias(
    rw: Rewriter, old_conv: Value
) -> tuple[Value, Value, ConvDetails, np.ndarray] | None:
    """The new graph's form of an old convolution: (x, filter, details, bias) when it is a Conv
    with a constant filter, possibly followed by a constant Add (what `fold_affine_into_conv`
    builds); None otherwise."""
    g = rw.new
    y = rw.get(old_conv)
    pre = np.zeros((1,) * g[y].rank)
    match g[y].op:
        case Binary(c, b, BinaryOp.ADD) if (
            isinstance(g[c].op, Conv) and (cb := compact(g, b)) is not None
        ):
            pre, y = cb.astype(np.float64), c
    match g[y].op:
        case Conv(x, w, d) if g.const_value(w) is not None:
            return x, w, d, pre
    return None


@rewrite("fuse_affine")
def fold_affine_into_conv(rw: Rewriter, v: Value) -> Value | None:
    """conv(x·s + b, w) with s, b per input channel becomes conv(x, w·s) + Σ w·b — when the
    convolution has no padding, or b is zero (padding x·s with zeros is scaling padded x)."""
    info = rw.info(v)
    match info.op:
        case Conv(x, w, d):
            pass
        case _:
            return None
    wa = rw.new.const_value(rw.get(w))
    if wa is None or not rw.old.is_hidden_with_uses(x, 1) or (top := _link(rw, x)) is None:
        return None
    aff = _chain(rw, top)
    if aff is None or not (_per_channel(aff.scale) and _per_channel(aff.bias)):
        return None
    if aff.has_bias and any(d.padding):
        return None
    k, cg = wa.shape[0], wa.shape[1]
    groups = d.groups
    c = cg * groups
    spatial = (1,) * (wa.ndim - 2)
    # input channel of filter entry [k, j] is (k // (K/G))·Cg + j
    s = np.repeat(
        np.broadcast_to(aff.scale.reshape(-1), (c,)).reshape(groups, cg), k // groups, axis=0
    )
    b = np.repeat(
        np.broadcast_to(aff.bias.reshape(-1), (c,)).reshape(groups, cg), k // groups, axis=0
    )
    w64 = wa.astype(np.float64)
    new_w = (w64 * s.reshape(s.shape + spatial)).astype(wa.dtype)
    new_b = (w64 * b.reshape(b.shape + spatial)).sum(axis=tuple(range(1, wa.ndim)))
    g = rw.new
    y = g.conv(rw.get(aff.base), g.constant(new_w), d.stride, d.padding, d.dilation, groups)
    bias = new_b.reshape((1, k, *spatial))
    return g.add(y, emit_compact(g, squeeze_equal(bias.astype(wa.dtype)), info.shape))


@rewrite("fuse_affine")
def fuse_affine(rw: Rewriter, v: Value) -> Value | None:
    """A chain of Add/Sub/Mul/Div by constants, seen from its top, becomes one Mul and one Add;
    when the chain sits on a convolution used only by it and its scale is per output channel,
    the scale goes into the filter and only the Add remains."""
    top = _link(rw, v)
    if top is None or feeds_const_binary(rw, v, _AFFINE, lambda g, c: compact(g, c) is not None):
        return None  # not a chain, or an inner link: the chain is rewritten at its top
    if feeds_round(rw, v):
        return None  # a quantization's arithmetic stays as written (patterns.feeds_round)
    aff = _chain(rw, top)
    if aff is None:
        return None
    base = aff.base
    if isinstance(rw.info(base).op, Conv) and rw.old.is_hidden_with_uses(base, 1):
        conv = _conv_with_pre_bias(rw, base)
        pre_bias = conv is not None and bool(np.any(conv[3] != 0))
        if conv is not None and _per_channel(aff.scale) and (aff.has_scale or pre_bias):
            x, w, d, pre = conv
            bias = pre * aff.scale + aff.bias
            if bias.size <= max(pre.size, aff.bias.size):  # a per-channel and a spatial bias: no
                g = rw.new
                wa = g.const_value(w)
                assert wa is not None
                s = np.broadcast_to(aff.scale.reshape(-1), (wa.shape[0],))
                w_new = g.constant(_scale_filter(wa, s))
                y = g.conv(x, w_new, d.stride, d.padding, d.dilation, d.groups)
                return _apply(rw, y, np.ones_like(aff.scale), bias)
    if _is_canonical(aff.links):
        return None
    return _apply(rw, rw.get(base), aff.scale, aff.bias)


@rewrite("div_to_mul")
def div_to_mul(rw: Rewriter, v: Value) -> Value | None:
    """x / c becomes x · (1/c) for a float constant c: the reciprocal is taken of the compact
    constant and broadcast again, so a broadcast scalar stays one element."""
    info = rw.info(v)
    match info.op:
        case Binary(a, b, BinaryOp.DIV) if info.dtype.is_float and not feeds_round(rw, v):
            c = compact(rw.new, rw.get(b))
            if c is None or compact(rw.new, rw.get(a)) is not None:
                return None
            with np.errstate(divide="ignore"):
                r = (1.0 / c.astype(np.float64)).astype(c.dtype)
            return rw.new.mul(rw.get(a), emit_compact(rw.new, r, info.shape))
    return None
