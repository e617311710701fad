"""QDQ fusion: a convolution or matrix product whose operands are both DequantizeLinear outputs
becomes the integer product of the quantized operands, scaled once:

    conv((xq - zx)·sx, (wq - zw)·sw)   ──▶   f32(IntConv(xq, wq, zx, zw)) · (sx·sw)
    ((aq - za)·sa) @ ((bq - zb)·sb)     ──▶   f32(IntMatMul(aq, bq, za, zb)) · (sa·sb)

This is what onnxruntime's QDQ transformers do (DQ → Conv → Q into QLinearConv) and what makes
a statically quantized model run at int8 speed: the float operands are never materialized, and
what follows (bias, QuantizeLinear's division and rounding) stays an elementwise chain that fuses
into one kernel. The integer sum is exact; the float product it replaces rounded each partial
sum, so the two differ by float rounding (a requantized output by a unit at a rounding tie, as
onnxruntime's own fused kernels do).

Conditions: activations quantized per tensor with a constant zero point; weights a constant
8-bit tensor dequantized per tensor or per output channel (per column for a product), whose
shifted values `w - zw` stay within ±2^(bits-1) for `OptimizerSettings.qdq_weight_bits` (a device whose
int8 kernels are exact only for 7-bit weights asks for 7). Off by default (`fuse_qdq`): the
devices with integer steps turn it on (`kn_runtime.Device`), for others the float path is faster.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kn_graph.dtype import DType
from kn_graph.graph import Graph
from kn_graph.ops import (
    Binary,
    BinaryOp,
    Conv,
    MatMul,
    Permute,
    Unary,
    UnaryOp,
    Value,
    View,
)
from kn_graph.optimizer.core import Rewriter, rewrite
from kn_graph.optimizer.patterns import _reshape_compact, compact, emit_compact, squeeze_equal
from kn_graph.shape import Shape

__all__ = ["fuse_qdq_conv", "fuse_qdq_matmul"]

_INT8 = (DType.U8, DType.I8)


@dataclass(frozen=True, slots=True)
class _Dequantized:
    """v = (f32(q) - zero) · scale: q an 8-bit value, zero and scale compact constants of v's
    rank (zero in q's integers)."""

    q: Value
    zero: np.ndarray
    scale: np.ndarray


def _constant(g: Graph, v: Value) -> np.ndarray | None:
    """The compact value of a constant seen through View, Broadcast and Cast."""
    return compact(g, v, casts=True)


def _dequantized(g: Graph, v: Value) -> _Dequantized | None:
    if g[v].dtype != DType.F32:
        return None
    match g[v].op:
        case Binary(a, b, BinaryOp.MUL):
            pass
        case _:
            return None
    for shifted, s in ((a, b), (b, a)):
        scale = _constant(g, s)
        if scale is None:
            continue
        zero: np.ndarray | None = np.zeros((1,) * g[v].rank)
        cast = shifted
        match g[shifted].op:
            case Binary(c, z, BinaryOp.SUB):
                zero, cast = _constant(g, z), c
        match g[cast].op:
            case Unary(q, UnaryOp.CAST) if zero is not None and g[q].dtype in _INT8:
                if not np.array_equal(zero, np.round(zero)):
                    return None
                return _Dequantized(q, zero, scale)
    return None


def _per_tensor(d: _Dequantized) -> bool:
    return d.zero.size == 1 and d.scale.size == 1


def _fits(w: np.ndarray, bits: int) -> bool:
    """|w| <= 2^(bits-1): for 7 bits the ±64 of onnxruntime's reduce_range quantizers (and of
    oneDNN's exact non-VNNI int8 products); any int8 for 8."""
    return bool(w.size == 0 or int(np.abs(w).max()) <= 2 ** (bits - 1))


def _through_views(g: Graph, v: Value) -> tuple[Value, Shape | None]:
    """The value below a chain of Views, and the outermost view's shape (None: no view)."""
    shape = None
    while isinstance(op := g[v].op, View):
        shape = shape or g[v].shape
        v = op.x
    return v, shape


@rewrite("fuse_qdq")
def fuse_qdq_conv(rw: Rewriter, v: Value) -> Value | None:
    """Conv of a dequantized activation with dequantized constant weights."""
    g = rw.old
    match g[v].op:
        case Conv(x, w, d):
            pass
        case _:
            return None
    dx, dw = _dequantized(g, x), _dequantized(g, w)
    if dx is None or dw is None or not _per_tensor(dx):
        return None
    wq = _constant(g, dw.q)
    k = g[w].shape[0].as_int()
    if wq is None or dw.zero.size not in (1, k) or dw.scale.size not in (1, k):
        return None
    zw = np.broadcast_to(dw.zero.reshape(-1), (k,))
    if not _fits(
        wq.astype(np.int64) - zw.reshape((k,) + (1,) * (wq.ndim - 1)), rw.settings.qdq_weight_bits
    ):
        return None
    new = rw.new
    xq = rw.get(dx.q)
    acc = new.int_conv(
        xq,
        new.constant(wq),
        new.scalar(int(dx.zero.reshape(-1)[0]), new.dtype(xq)),
        new.constant(zw.astype(wq.dtype)),
        d.stride,
        d.padding,
        d.dilation,
        d.groups,
    )
    scale = np.broadcast_to(dw.scale.reshape(-1), (k,)).astype(np.float32) * np.float32(
        dx.scale.reshape(-1)[0]
    )
    shape = new.shape(acc)
    per_k = squeeze_equal(scale.reshape((1, k) + (1,) * (shape.rank - 2)))
    return new.mul(new.cast(acc, DType.F32), emit_compact(new, per_k, shape))


def _weights_through(g: Graph, b: Value) -> tuple[_Dequantized, np.ndarray] | None:
    """The dequantized constant below a chain of Views and Permutes (a Gemm's transposed
    weights, matmul_nd's rank-3 view), with the chain applied: its zero point and scale in
    compact form, and the quantized weights as an array, all in `b`'s layout."""
    chain: list[Value] = []
    u = b
    while isinstance(g[u].op, View | Permute):
        chain.append(u)
        u = g[u].op.x  # type: ignore[union-attr]
    d = _dequantized(g, u)
    if d is None:
        return None
    q = _constant(g, d.q)
    if q is None or q.shape != tuple(g[d.q].shape.fixed_dims()):
        return None
    zero, scale = d.zero, d.scale
    for w in reversed(chain):
        op = g[w].op
        if isinstance(op, View):
            src, dst = g[op.x].shape, g[w].shape
            dims = dst.fixed_dims()
            z, s = _reshape_compact(zero, src, dst), _reshape_compact(scale, src, dst)
            if z is None or s is None:
                return None
            q, zero, scale = q.reshape(dims), z, s
        else:
            assert isinstance(op, Permute)
            perm = op.perm
            q, zero, scale = q.transpose(perm), zero.transpose(perm), scale.transpose(perm)
    return _Dequantized(d.q, zero, scale), q


@rewrite("fuse_qdq")
def fuse_qdq_matmul(rw: Rewriter, v: Value) -> Value | None:
    """MatMul [b, m, k] @ [b, k, n] of a dequantized activation (per tensor, possibly viewed)
    and dequantized constant weights (per tensor or per column, possibly viewed or transposed,
    as Gemm and matmul_nd leave them)."""
    g = rw.old
    match g[v].op:
        case MatMul(a, b):
            pass
        case _:
            return None
    a0, a_view = _through_views(g, a)
    da = _dequantized(g, a0)
    if da is None or not _per_tensor(da) or not g[b].shape.is_fixed:
        return None
    found = _weights_through(g, b)
    if found is None:
        return None
    db, bq = found
    n = bq.shape[2]
    for p in (db.zero, db.scale):  # per tensor or per column: constant along batch and k
        if p.shape[0] != 1 or p.shape[1] != 1:
            return None
    zb = np.broadcast_to(db.zero.reshape(-1), (n,))
    if not _fits(bq.astype(np.int64) - zb, rw.settings.qdq_weight_bits):
        return None
    new = rw.new
    aq = rw.get(da.q)
    if a_view is not None:
        aq = new.view(aq, a_view)
    bsz, m = g[a].shape[0], g[a].shape[1]
    za = new.view(new.scalar(int(da.zero.reshape(-1)[0]), new.dtype(aq)), Shape.of(1, 1, 1))
    zbv = new.view(new.constant(zb.astype(bq.dtype)), Shape.of(1, 1, n))
    acc = new.int_matmul(
        aq,
        new.constant(np.ascontiguousarray(bq)),
        new.broadcast(za, Shape.of(bsz, m, 1)),
        new.broadcast(zbv, Shape.of(bsz, 1, n)),
    )
    scale = np.broadcast_to(db.scale.reshape(-1), (n,)).astype(np.float32) * np.float32(
        da.scale.reshape(-1)[0]
    )
    per_n = squeeze_equal(scale.reshape(1, 1, n))
    return new.mul(new.cast(acc, DType.F32), emit_compact(new, per_n, new.shape(acc)))
