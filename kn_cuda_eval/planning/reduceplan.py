"""Reductions over copies: a `Reduce` whose input repeats one value along some axes (an
`Expand`, or a unary chain over one, such as `Exp`) is planned over one copy, as the reference
executor's `_reduce` does, instead of a kernel over every copy (2^40 of them for
`ReduceMax(Expand(x, [2^20, 2^20]))`).

A reduced axis of n copies scales the one-copy result the way the reference does: sum → r·n in
the accumulator type (f32 for f16), prod → r^n, mean/min/max → r, argmin/argmax → 0. A kept
axis of copies is reduced once and broadcast back (a free view).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.context import PlannerContext
from kn_cuda_eval.planning.lazy import Lazy, combine
from kn_cuda_eval.planning.program import Bin, Un
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType
from kn_graph.ops import BinaryOp, ReduceOp, UnaryOp

__all__ = ["copy_axes", "plan_reduce_of_copies"]


def copy_axes(e: Lazy) -> tuple[int, ...]:
    """The axes (of size > 1) along which the lazy value is one value repeated: it is a view, an
    index or a chain of unary ops over one (the elementwise op then applies before the
    broadcast), and its leaf has stride 0 there. Empty for an empty tensor."""
    node = e.root
    while node.args:
        if not isinstance(node.instr, Un):
            return ()
        node = node.args[0]
    if 0 in e.shape:
        return ()
    leaves = [v for _, v in (*e.loads, *e.indices)]
    return tuple(
        a for a, d in enumerate(e.shape) if d > 1 and all(v.strides[a] == 0 for v in leaves)
    )


def _one_copy(v: StridedView, axes: Sequence[int]) -> StridedView:
    for a in axes:
        v = v.slice(a, 0, 1, 1)
    return v


def _wrap(n: int, dt: DType) -> int:
    """n in the range of the integer type `dt`, modulo 2^bits (what n·x wraps to)."""
    bits = 8 * dt.size
    n %= 1 << bits
    return n - (1 << bits) if dt.np.kind == "i" and n >= 1 << (bits - 1) else n


def _int_exponent(n: int, dt: DType) -> int:
    """An exponent e in the range of `dt` with x^e = x^n modulo 2^bits for every x: n itself
    when it fits, else 2^(bits-2) + n mod 2^(bits-2) (odd x: the units modulo 2^bits have
    exponent 2^(bits-2); even x: both powers are past `bits` factors of 2, so 0)."""
    bits = 8 * dt.size
    top = (1 << (bits - 1)) - 1 if dt.np.kind == "i" else (1 << bits) - 1
    if n <= top:
        return n
    q = 1 << (bits - 2)
    return q + n % q


def _scaled(r: Lazy, op: ReduceOp, n: int, dt: DType) -> Lazy:
    """The reduction over n copies from the reduction `r` of one, with the reference's float
    semantics: `(r.astype(acc) * acc(n)).astype(dt)` for sum, `power(r.astype(acc), n)` for
    prod (acc = f32 for f16, else dt)."""
    if n == 1 or op not in (ReduceOp.SUM, ReduceOp.PROD):
        return r
    acc = DType.F32 if dt is DType.F16 else dt
    shape = r.shape
    x = combine([r], shape, Un(UnaryOp.CAST, 0, acc)) if acc is not dt else r
    if acc.is_float:
        k: float | int = float(acc.np.type(n))
    else:
        k = _wrap(n, acc) if op is ReduceOp.SUM else _int_exponent(n, acc)
    bop = BinaryOp.MUL if op is ReduceOp.SUM else BinaryOp.POW
    y = combine([x, Lazy.const(shape, k, acc)], shape, Bin(bop, 0, 0, acc))
    return combine([y], shape, Un(UnaryOp.CAST, 0, dt)) if acc is not dt else y


def plan_reduce_of_copies(
    p: PlannerContext, i: int, x: int, axes: Sequence[int], op: ReduceOp
) -> bool:
    """Plan value i = reduce(x, axes, op) over one copy of each repeated axis of x; False (and
    nothing planned) when x repeats along no axis."""
    e = p.expr(x)
    rep = copy_axes(e)
    if not rep:
        return False
    info = p.g[p.val(i)]
    dt = info.dtype
    out_shape = p.shape(i)
    if op.is_arg and axes[0] in rep:  # every copy is the first extreme
        p.settle(i, Lazy.const(out_shape, 0, dt))
        return True
    kept = [a for a in range(len(e.shape)) if a not in axes]
    one = tuple(1 if a in rep else d for a, d in enumerate(e.shape))
    small = tuple(one[a] for a in kept)
    sliced = e.map(one, lambda v: _one_copy(v, rep))
    assert sliced is not None, "slicing an axis never fails"
    if all(a in rep for a in axes):  # one element per row: the reduction is the value itself
        r = sliced.map(small, lambda v: v.reshape(small))
        assert r is not None, "dropping axes of size 1 never needs a copy"
    else:
        ex = sliced.to_expr()
        if ex.program.cost > p.s.max_recompute or len(ex.inputs) > p.s.max_kernel_inputs:
            m = p.materialize(ex, p.name(x) + " (one copy)")
            ex = st.Expr.of_view(m)
        out = p.temp(small, dt, p.name(i))
        p.row_step(ex, out, list(axes), lambda ex_, o: st.Reduce(ex_, o, op), keep_out=False)
        r = Lazy.of_view(out)
    n = math.prod(e.shape[a] for a in axes if a in rep)
    r = _scaled(r, op, n, dt)
    if small != out_shape:  # kept axes of copies: reduce once, broadcast the result for free
        if r.cost:
            r = Lazy.of_view(p.materialize(r.to_expr(), p.name(i)))
        grown = r.map(out_shape, lambda v: v.broadcast(out_shape))
        assert grown is not None
        r = grown
    p.settle(i, r)
    return True
