"""Signal processing: HannWindow, HammingWindow, BlackmanWindow (constants), DFT and STFT as one
matmul with a constant DFT matrix (real and imaginary parts stacked) per transform."""

from __future__ import annotations

import numpy as np

from kn_graph.dtype import DType
from kn_graph.onnx.context import NodeContext, Result, onnx_dtype, onnx_op
from kn_graph.ops import Value
from kn_graph.shape import Shape

__all__ = ["dft", "stft", "window"]


MAX_MATRIX = 1 << 24
"""Elements of the largest constant built (a DFT matrix of 2n x 2n real entries, n <= 2048)."""


# -- windows --------------------------------------------------------------------------------------
def _scalar_int(ctx: NodeContext, i: int, what: str) -> int:
    arr = np.asarray(ctx.input_static(i, what)).reshape(-1)
    if arr.size != 1 or arr.dtype.kind not in "iu":
        ctx.unsupported(f"{what} must be one integer, found {arr.tolist()}")
    return int(arr[0])


@onnx_op("HannWindow", "HammingWindow", "BlackmanWindow")
def window(ctx: NodeContext) -> Result:
    size = _scalar_int(ctx, 0, "the window size")
    if not 0 <= size <= MAX_MATRIX:
        ctx.unsupported(f"window size {size}")
    dtype = onnx_dtype(ctx.attr_int("output_datatype", 1), f"node '{ctx.name}' output_datatype")
    periodic = ctx.attr_bool("periodic", True)
    n = np.arange(size, dtype=np.float64)
    span = size if periodic else size - 1
    with np.errstate(all="ignore"):
        match ctx.op_type:
            case "HannWindow":
                w = np.sin(np.pi * n / span) ** 2
            case "HammingWindow":
                alpha = 25.0 / 46.0
                w = alpha - (1 - alpha) * np.cos(2 * np.pi * n / span)
            case _:
                w = 0.42 - 0.5 * np.cos(2 * np.pi * n / span) + 0.08 * np.cos(4 * np.pi * n / span)
    return ctx.graph.constant(w.astype(dtype.np))


# -- DFT ------------------------------------------------------------------------------------------
def _dft_matrix(
    length: int, n: int, bins: int, inverse: bool, onesided_inverse: bool, real_in: bool
) -> np.ndarray:
    """[in_rows, 2·bins] mapping [re | im] of `length` input samples (zero-padded or truncated to
    n) to [re | im] of `bins` outputs; real input has no im rows."""
    k = np.arange(bins)[None, :]
    t = np.arange(n)[:, None]
    theta = 2 * np.pi * ((t * k) % n) / n
    cos, sin = np.cos(theta), np.sin(theta)
    if onesided_inverse:
        # irfft: input bins 0..n//2 (Hermitian half), output n real samples
        weight = np.full(bins, 2.0)
        weight[0] = 1.0
        if n % 2 == 0:
            weight[-1] = 1.0
        cos, sin = (cos * weight).T / n, (sin * weight).T / n  # [bins, n]
        return np.concatenate([cos, -sin], axis=0)[: (1 if real_in else 2) * bins]
    sign = 1.0 if inverse else -1.0
    scale = 1.0 / n if inverse else 1.0
    re_rows = np.concatenate([cos, sign * sin], axis=1) * scale  # x_re contributions
    im_rows = np.concatenate([-sign * sin, cos], axis=1) * scale  # x_im contributions
    rows = [re_rows] if real_in else [re_rows, im_rows]
    m = np.concatenate(rows, axis=0)  # [(1|2)·n, 2·bins] for n input samples
    if length < n:  # missing samples are zeros: their rows never contribute
        keep = np.concatenate([np.arange(length) + j * n for j in range(len(rows))])
        m = m[keep]
    return m


def _transform(
    ctx: NodeContext, x: Value, axis: int, n: int | None, inverse: bool, onesided: bool
) -> Value:
    """The DFT of x [..., 1|2] along `axis`, complex output [..., 2] (real [..., 1] for irfft)."""
    g = ctx.graph
    shape = g.shape(x)
    rank = shape.rank
    if rank < 2 or shape[-1].fixed_value() not in (1, 2) or not 0 <= axis < rank - 1:
        ctx.unsupported(
            f"expected a signal [..., 1|2] and a signal axis before the last, found {shape}, axis {axis}"
        )
    if not g.dtype(x).is_float:
        ctx.unsupported(f"expected a float signal, found {g.dtype(x)}")
    real_in = shape[-1].as_int() == 1
    length = shape[axis].as_int("the DFT axis size")
    if n is None:
        n = 2 * (length - 1) if inverse and onesided else length
    if n < 1:
        ctx.unsupported(f"dft_length {n}")
    if (2 * n) * (2 * n) > MAX_MATRIX:
        ctx.unsupported(f"dft_length {n} is too long for a dense DFT matrix")
    irfft = inverse and onesided
    bins = n // 2 + 1 if onesided else n
    used = min(length, bins if irfft else n)
    perm = [a for a in range(rank - 1) if a != axis] + [axis, rank - 1]
    moved = g.slice(g.permute(x, perm), rank - 2, 0, used)  # [..., used, c]
    batch = Shape(g.shape(moved).dims[:-2])
    c = 1 if real_in else 2
    flat = g.view(
        g.permute(moved, [*range(rank - 2), rank - 1, rank - 2]), batch + Shape.of(c * used)
    )
    # in f64: sums of many terms must cancel to the exact zeros the reference produces
    flat = g.cast(flat, DType.F64)
    if irfft:
        m = _dft_matrix(used, n, bins, True, True, real_in)
        m = m[np.concatenate([np.arange(used) + j * bins for j in range(c)])]
        out = g.view(g.matmul_nd(flat, g.constant(m)), batch + Shape.of(1, n))
    else:
        m = _dft_matrix(used, n, bins, inverse, False, real_in)
        out = g.view(g.matmul_nd(flat, g.constant(m)), batch + Shape.of(2, bins))
    out = g.cast(out, g.dtype(x))
    out = g.permute(out, [*range(rank - 2), rank - 1, rank - 2])  # [..., bins, 2]
    back = [0] * rank
    for i, p in enumerate(perm):
        back[p] = i
    return g.permute(out, back)


@onnx_op("DFT")
def dft(ctx: NodeContext) -> Result:
    rank = ctx.input_rank(0)
    if ctx.opset >= 20:
        axis = _scalar_int(ctx, 2, "the DFT axis") if ctx.has_input(2) else -2
    else:
        axis = ctx.attr_int("axis", 1)
    if not -rank <= axis < rank:
        ctx.unsupported(f"axis {axis} for rank {rank}")
    axis %= rank
    n = _scalar_int(ctx, 1, "dft_length") if ctx.has_input(1) else None
    inverse = ctx.attr_bool("inverse", False)
    onesided = ctx.attr_bool("onesided", False)
    return _transform(ctx, ctx.input(0), axis, n, inverse, onesided)


@onnx_op("STFT")
def stft(ctx: NodeContext) -> Result:
    """Frames (a constant gather), windowed, each transformed by the DFT matrix."""
    g = ctx.graph
    x = ctx.input(0)
    shape = g.shape(x)
    if shape.rank != 3:
        ctx.unsupported(f"expected a signal [batch, length, 1|2], found {shape}")
    step = _scalar_int(ctx, 1, "frame_step")
    win = ctx.optional_input(2)
    frame = _scalar_int(ctx, 3, "frame_length") if ctx.has_input(3) else None
    if win is not None:
        if g[win].rank != 1:
            ctx.unsupported(f"the window must be 1-D, found {g.shape(win)}")
        wlen = g.shape(win)[0].as_int("the window length")
        if frame is not None and frame != wlen:
            ctx.unsupported(f"frame_length {frame} differs from the window length {wlen}")
        frame = wlen
    length = shape[1].as_int("the signal length")
    frame = length if frame is None else frame
    if step < 1 or frame < 1 or frame > length:
        ctx.unsupported(f"frame_step {step} / frame_length {frame} for a signal of {length}")
    frames = 1 + (length - frame) // step
    idx = (np.arange(frames)[:, None] * step + np.arange(frame)[None, :]).reshape(-1)
    cut = g.gather(x, 1, g.constant(idx.astype(np.int64)))
    cut = g.view(cut, Shape.of(shape[0], frames, frame, shape[2]))
    if win is not None:
        cut = g.mul(cut, g.view(g.cast(win, g.dtype(x)), Shape.of(frame, 1)))
    onesided = ctx.attr_bool("onesided", True)
    return _transform(ctx, cut, 2, frame, False, onesided)
