"""Integer convolutions and products whose shifted weights do not fit int8 split into two that do.

A convolution's int8 kernels (oneDNN's on the CPU) multiply an 8-bit source by *signed* 8-bit
weights; IntConv computes Σ (x - x_zero)·(w - w_zero), and with u8 weights over their whole
range and a zero point inside it (what onnxruntime's early `quantize_dynamic` wrote: ConvInteger
with uint8 weights, zero point 94-178, e.g. ddddocr's OCR model) w - w_zero spans [-255, 255].
Such a step ran in the emulator's float64 im2col, 4x onnxruntime. Exactly, in int32:

    (w - w_zero) = (w - m) + (m - w_zero)        m = 128 for u8 weights, 0 for i8
    out[k] = Σ (x - x_zero)·(w[k] - m)  +  (m - w_zero[k]) · Σ_window (x - x_zero)

The first is an IntConv with int8 weights and no weight zero point, the second the same
convolution of x with ones (one filter per group: the window sum, padded with x_zero like the
first) times a constant per filter. Sums wrap in int32 as the single IntConv's do. An IntMatMul
[b, m, k] @ [b, k, n] (MatMulInteger: the same models' dense layers) splits alike, the second
term a product with a column of ones (the row sums of a - a_zero) times a constant per column.

Fires only where w and w_zero are constants, w - w_zero does not fit `qdq_weight_bits` and
w - m does (8 bits: every u8 or i8 weight; a 7-bit device keeps the single step).
"""

from __future__ import annotations

import numpy as np

from kn_graph import DType
from kn_graph.ops import IntConv, IntMatMul, Value
from kn_graph.optimizer.core import Rewriter, rewrite
from kn_graph.optimizer.patterns import compact, emit_compact
from kn_graph.shape import Shape

__all__ = ["split_int_matmul_weights", "split_int_weights"]


def _fits(w: np.ndarray, bits: int) -> bool:
    return bool(w.size == 0 or (w.min() >= -(2 ** (bits - 1)) and w.max() < 2 ** (bits - 1)))


def _shift(w: np.ndarray, zero: np.ndarray, u8: bool, bits: int) -> int | None:
    """m for the split of `w` (int64) with its zero point broadcast against it; None when the
    single step's weights fit already or the split's do not either."""
    if _fits(w - zero, bits):
        return None
    m = 128 if u8 else 0
    return m if _fits(w - m, bits) else None


@rewrite("split_int_weights")
def split_int_weights(rw: Rewriter, v: Value) -> Value | None:
    g = rw.old
    match g[v].op:
        case IntConv(x, w, x_zero, w_zero, d):
            pass
        case _:
            return None
    wq, zw = compact(g, w), compact(g, w_zero)
    if wq is None or zw is None:
        return None
    k = g[w].shape[0].as_int()
    zk = np.broadcast_to(zw.reshape(-1), (k,)).astype(np.int64).reshape((k,) + (1,) * (wq.ndim - 1))
    w64 = wq.astype(np.int64)
    m = _shift(w64, zk, g[w].dtype is DType.U8, rw.settings.qdq_weight_bits)
    if m is None:
        return None
    new = rw.new
    xn = rw.get(x)
    zx = rw.get(x_zero)
    groups = d.groups
    geometry = (d.stride, d.padding, d.dilation, groups)
    main = new.int_conv(
        xn,
        new.constant((w64 - m).astype(np.int8)),
        zx,
        new.constant(np.zeros(k, np.int8)),
        *geometry,
    )
    ones = np.ones((groups, *wq.shape[1:]), np.int8)
    sums = new.int_conv(
        xn, new.constant(ones), zx, new.constant(np.zeros(groups, np.int8)), *geometry
    )
    coef = (m - zk.reshape(-1)).astype(np.int32)  # [K]
    shape = new.shape(main)
    spatial = list(shape)[2:]
    n = shape[0]
    per = k // groups
    split = Shape.of(n, groups, per, *spatial)
    c = new.constant(coef.reshape((1, groups, per) + (1,) * len(spatial)))
    s = new.broadcast(new.view(sums, Shape.of(n, groups, 1, *spatial)), split)
    out = new.add(new.view(main, split), new.mul(s, new.broadcast(c, split)))
    return new.view(out, shape)


@rewrite("split_int_weights")
def split_int_matmul_weights(rw: Rewriter, v: Value) -> Value | None:
    g = rw.old
    match g[v].op:
        case IntMatMul(a, b, a_zero, b_zero):
            pass
        case _:
            return None
    bq, zb = compact(g, b), compact(g, b_zero)
    if bq is None or zb is None or zb.shape[0] != 1 or not g[b].shape[2].is_fixed:
        return None  # weights computed at run time, or a zero point per batch
    b64 = bq.astype(np.int64)
    m = _shift(b64, zb.astype(np.int64), g[b].dtype is DType.U8, rw.settings.qdq_weight_bits)
    if m is None:
        return None
    new = rw.new
    an, zan = rw.get(a), rw.get(a_zero)
    bsz, _, k = g[a].shape
    n = g[b].shape[2]
    # zero points as constants (a scalar would be filled in the arena: oneDNN needs them constant)
    zero = new.broadcast(new.constant(np.zeros((1, 1, n.as_int()), np.int8)), Shape.of(bsz, 1, n))
    main = new.int_matmul(
        an, new.broadcast(new.constant((b64 - m).astype(np.int8)), g[b].shape), zan, zero
    )
    ones = new.broadcast(new.constant(np.ones((1, k.as_int(), 1), np.int8)), Shape.of(bsz, k, 1))
    zero1 = new.broadcast(new.constant(np.zeros((1, 1, 1), np.int8)), Shape.of(bsz, 1, 1))
    rows = new.int_matmul(an, ones, zan, zero1)  # [b, m, 1]: Σ_k (a - a_zero)
    coef = (m - zb.astype(np.int64)).astype(np.int32)  # compact: [1, 1, 1] or [1, 1, n]
    shape = new.shape(main)
    return new.add(main, new.mul(new.broadcast(rows, shape), emit_compact(new, coef, shape)))
