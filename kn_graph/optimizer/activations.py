"""GELU and SiLU detection: the elementwise arithmetic exporters emit for these activations
becomes one Unary each (UnaryOp.GELU, GELU_TANH, SILU), one kernel on a device instead of 4 to 9.

Recognised, in any order of the product and of commutative operands:

    0.5 · x · (1 + erf(x / √2))                               (or x · 0.7071…)  -> gelu
    0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³)))        (x³ = pow(x, 3) or x·x·x) -> gelu_tanh
    x · sigmoid(x)                                                                  -> silu

    %0: f32[B,8] = input #0 "x"              %0: f32[B,8] = input #0 "x"
    %4: f32[B,8] = div(%0, %3)       ──▶     %1: f32[B,8] = gelu(%0)
    %5: f32[B,8] = erf(%4)
    %9: f32[B,8] = add(%5, %8)
    %10: f32[B,8] = mul(%0, %9)
    %14: f32[B,8] = mul(%10, %13)   (constants, views and broadcasts omitted)
"""

from __future__ import annotations

import math

import numpy as np

from kn_graph.ops import Binary, BinaryOp, Unary, UnaryOp, Value
from kn_graph.optimizer.core import Rewriter, rewrite
from kn_graph.optimizer.patterns import approx, scalar

__all__ = ["detect_gelu", "detect_silu"]

_MAX_FACTORS = 4


def _const(rw: Rewriter, v: Value) -> float | None:
    return scalar(rw.new, rw.get(v))


def _factors(rw: Rewriter, v: Value) -> list[Value] | None:
    """The factors of the product tree under `v` (a Mul), expanding inner Muls that are hidden
    with one use; None when there are more than a GELU has."""
    g = rw.old
    out: list[Value] = []
    stack = [v]
    while stack:
        u = stack.pop()
        match g[u].op:
            case Binary(a, b, BinaryOp.MUL) if u == v or g.is_hidden_with_uses(u, 1):
                stack.extend((b, a))
            case _:
                out.append(u)
        if len(out) + len(stack) > _MAX_FACTORS:
            return None
    return out


def _one_plus(rw: Rewriter, v: Value, op: UnaryOp) -> Value | None:
    """`v` = 1 + op(arg) (either order), both hidden with one use: arg."""
    g = rw.old
    if not g.is_hidden_with_uses(v, 1):
        return None
    match g[v].op:
        case Binary(a, b, BinaryOp.ADD):
            for one, f in ((a, b), (b, a)):
                match g[f].op:
                    case Unary(arg, u) if (
                        u is op and _const(rw, one) == 1.0 and g.is_hidden_with_uses(f, 1)
                    ):
                        return arg
    return None


def _times_const(rw: Rewriter, v: Value) -> tuple[Value, float] | None:
    """`v` = y · c or c · y (or y / c, as y · 1/c), hidden with one use: (y, c)."""
    g = rw.old
    if not g.is_hidden_with_uses(v, 1):
        return None
    match g[v].op:
        case Binary(a, b, BinaryOp.MUL):
            if (c := _const(rw, b)) is not None:
                return a, c
            if (c := _const(rw, a)) is not None:
                return b, c
        case Binary(a, b, BinaryOp.DIV):
            if (c := _const(rw, b)) is not None and c != 0:
                return a, 1.0 / c
    return None


def _is_cube(rw: Rewriter, v: Value, x: Value) -> bool:
    """`v` = pow(x, 3), x·(x·x) or (x·x)·x, with inner values hidden with one use."""
    g = rw.old
    match g[v].op:
        case Binary(a, p, BinaryOp.POW):
            return a == x and _const(rw, p) == 3.0
        case Binary(a, b, BinaryOp.MUL):
            sq = b if a == x else a if b == x else None
            if sq is None or not g.is_hidden_with_uses(sq, 1):
                return False
            match g[sq].op:
                case Binary(c, d, BinaryOp.MUL):
                    return c == d == x
    return False


def _tolerance(rw: Rewriter, v: Value) -> float:
    """How far a constant may be from its exact value: exporters write a handful of digits,
    and f16 rounds to about three."""
    return max(1e-4, float(np.finfo(rw.info(v).dtype.np).eps))


def _is_gelu_arg(rw: Rewriter, arg: Value, x: Value) -> bool:
    """arg = x / √2 (erf form)."""
    got = _times_const(rw, arg)
    return got is not None and got[0] == x and approx(got[1], math.sqrt(0.5), _tolerance(rw, x))


def _is_gelu_tanh_arg(rw: Rewriter, arg: Value, x: Value) -> bool:
    """arg = √(2/π) · (x + 0.044715 · x³) (tanh form)."""
    g = rw.old
    tol = _tolerance(rw, x)
    got = _times_const(rw, arg)
    if got is None or not approx(got[1], math.sqrt(2.0 / math.pi), tol):
        return False
    inner = got[0]
    if not g.is_hidden_with_uses(inner, 1):
        return False
    match g[inner].op:
        case Binary(a, b, BinaryOp.ADD):
            term = b if a == x else a if b == x else None
            if term is None:
                return False
            cubic = _times_const(rw, term)
            return (
                cubic is not None
                and approx(cubic[1], 0.044715, tol)
                and g.is_hidden_with_uses(cubic[0], 1)
                and _is_cube(rw, cubic[0], x)
            )
    return False


@rewrite("detect_gelu_silu")
def detect_gelu(rw: Rewriter, v: Value) -> Value | None:
    """A product 0.5 · x · (1 + erf(x/√2)) or 0.5 · x · (1 + tanh(…)) becomes gelu(x) or
    gelu_tanh(x); every value of the pattern except x must serve the pattern only."""
    info = rw.info(v)
    if not (isinstance(info.op, Binary) and info.op.op is BinaryOp.MUL and info.dtype.is_float):
        return None
    factors = _factors(rw, v)
    if factors is None:
        return None
    coef = 1.0
    rest: list[Value] = []
    for f in factors:
        c = _const(rw, f)
        if c is None:
            rest.append(f)
        else:
            coef *= c
    if len(rest) != 2 or not approx(coef, 0.5, 1e-6):  # 0.5 is exact in every float type
        return None
    for x, one_plus in (rest, rest[::-1]):
        if rw.info(x).shape != info.shape:
            continue
        if (arg := _one_plus(rw, one_plus, UnaryOp.ERF)) is not None and _is_gelu_arg(rw, arg, x):
            return rw.new.gelu(rw.get(x))
        if (arg := _one_plus(rw, one_plus, UnaryOp.TANH)) is not None and _is_gelu_tanh_arg(
            rw, arg, x
        ):
            return rw.new.gelu(rw.get(x), approximate="tanh")
    return None


@rewrite("detect_gelu_silu")
def detect_silu(rw: Rewriter, v: Value) -> Value | None:
    """x · sigmoid(x) (either order) becomes silu(x) when the sigmoid serves only this product."""
    info = rw.info(v)
    g = rw.old
    match info.op:
        case Binary(a, b, BinaryOp.MUL) if info.dtype.is_float:
            for x, s in ((a, b), (b, a)):
                match g[s].op:
                    case Unary(y, UnaryOp.SIGMOID) if y == x and g.is_hidden_with_uses(s, 1):
                        return rw.new.silu(rw.get(x))
    return None
