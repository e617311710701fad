"""Resize and Upsample: separable per-axis interpolation whose gather indices and weights are
computed in NumPy at load time (`resize_taps`), applied as gathers and a weighted sum.

Nearest-neighbour resizing is one Gather per axis (exact, any dtype); linear/cubic are a few
gathers scaled by constant weights. A symbolic axis is supported when the resize is an integer
repetition (the usual 2x nearest upsampling of a dynamic export).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.resize_taps import (
    COORD_MODES,
    LENGTH_SENSITIVE,
    NEAREST_MODES,
    Interp,
    Taps,
    axis_taps,
)
from kn_graph.ops import Value
from kn_graph.shape import Size

__all__ = ["resize", "upsample"]


@dataclasses.dataclass(frozen=True, slots=True)
class AxisPlan:
    """Resize one axis from its size to `out` with scale factor `scale` (and optional roi)."""

    axis: int
    out: Size
    scale: float
    roi: tuple[float, float] | None


def _read_interp(ctx: NodeContext) -> Interp:
    mode = ctx.attr_str("mode", "nearest")
    if ctx.op_type == "Upsample" and mode == "bilinear":
        mode = "linear"
    if mode not in ("nearest", "linear", "cubic") or (
        mode == "cubic" and ctx.op_type == "Upsample"
    ):
        ctx.unsupported(f"mode '{mode}'")
    if ctx.op_type == "Upsample" or ctx.opset < 11:
        # Upsample and Resize-10: asymmetric coordinates, ORT's "simple" nearest rounding
        return Interp(mode, "asymmetric", "simple")
    coord = ctx.attr_str("coordinate_transformation_mode", "half_pixel")
    nearest = ctx.attr_str("nearest_mode", "round_prefer_floor")
    if coord not in COORD_MODES or (coord == "half_pixel_symmetric" and ctx.opset < 19):
        ctx.unsupported(f"coordinate_transformation_mode '{coord}'")
    if nearest not in NEAREST_MODES:
        ctx.unsupported(f"nearest_mode '{nearest}'")
    antialias = ctx.attr_bool("antialias", False) if ctx.opset >= 18 else False
    if antialias and mode == "nearest":
        ctx.unsupported("antialias with mode 'nearest'")
    return Interp(
        mode,
        coord,
        nearest,
        ctx.attr_float("cubic_coeff_a", -0.75),
        ctx.attr_bool("exclude_outside", False),
        antialias,
    )


def _static_floats(ctx: NodeContext, i: int, what: str) -> list[float] | None:
    """An optional float input that may also be present but empty (meaning absent)."""
    if not ctx.has_input(i):
        return None
    arr = np.asarray(ctx.input_static(i, what), dtype=np.float64).reshape(-1)
    return arr.tolist() if arr.size else None


def _plan(ctx: NodeContext, x: Value, interp: Interp) -> list[AxisPlan]:
    """Which axes change, to what size and with which scale, from scales or sizes (+ axes)."""
    shape = ctx.graph.shape(x)
    rank = shape.rank
    axes = list(range(rank))
    if ctx.op_type == "Resize" and ctx.opset >= 18 and (given := ctx.attr_ints("axes")) is not None:
        axes = [ctx.axis(a, rank) for a in given]
        if len(set(axes)) != len(axes):
            ctx.unsupported(f"repeated axes {given}")
    if ctx.op_type == "Upsample" and ctx.opset < 9:
        scales = ctx.attr_floats("scales")
        sizes = None
    else:
        scale_index = 2 if ctx.op_type == "Resize" and ctx.opset >= 11 else 1
        scales = _static_floats(ctx, scale_index, "scales")
        sizes = (
            ctx.input_sizes(3, "sizes") if ctx.op_type == "Resize" and ctx.has_input(3) else None
        )
    roi = None
    if ctx.op_type == "Resize" and ctx.opset >= 11 and ctx.has_input(1):
        if interp.coord == "tf_crop_and_resize":
            roi = _static_floats(ctx, 1, "roi")
        else:
            ctx.raw_input(1)  # only tf_crop_and_resize reads the roi
    if (scales is None) == (sizes is None):
        ctx.unsupported("exactly one of 'scales' and 'sizes' must be given")
    n = len(axes)
    if len(scales or sizes or []) != n:
        ctx.unsupported(f"{len(scales or sizes or [])} scales/sizes for {n} axes")
    if roi is not None and len(roi) != 2 * n:
        ctx.unsupported(f"roi has {len(roi)} entries, expected {2 * n}")
    rois = [(roi[i], roi[n + i]) if roi is not None else None for i in range(n)]
    if scales is not None:
        if not all(math.isfinite(s) and s > 0 for s in scales):
            ctx.unsupported(f"scales {scales} must be positive")
        if ctx.opset >= 18:
            ctx.attr_str("keep_aspect_ratio_policy", "stretch")  # applies to sizes only
        outs = [_scaled(ctx, shape[a], s) for a, s in zip(axes, scales, strict=True)]
        factors = list(scales)
    else:
        assert sizes is not None
        outs, factors = _from_sizes(ctx, [shape[a] for a in axes], sizes)
    return [AxisPlan(a, o, f, r) for a, o, f, r in zip(axes, outs, factors, rois, strict=True)]


def _scaled(ctx: NodeContext, size: Size, scale: float) -> Size:
    """floor(size · scale), symbolically for integer scales."""
    n = size.fixed_value()
    if n is not None:
        return Size(int(np.floor(scale * n)))
    if float(scale).is_integer():
        return size * int(scale)
    frac = Fraction(scale).limit_denominator(64)
    if float(frac) == float(scale) and frac > 0:  # 0.5, 1.5, 0.25: exactly floor(size·p/q)
        return (size * frac.numerator) // frac.denominator
    ctx.needs_fixed_sizes(f"scale {scale} of symbolic size {size}")


def _from_sizes(
    ctx: NodeContext, ins: Sequence[Size], sizes: Sequence[Size]
) -> tuple[list[Size], list[float]]:
    """Output sizes and scale factors from `sizes`, honouring keep_aspect_ratio_policy."""
    policy = ctx.attr_str("keep_aspect_ratio_policy", "stretch") if ctx.opset >= 18 else "stretch"
    if policy not in ("stretch", "not_larger", "not_smaller"):
        ctx.unsupported(f"keep_aspect_ratio_policy '{policy}'")
    factors: list[float] = []
    for i, o in zip(ins, sizes, strict=True):
        if i.is_fixed and o.is_fixed:
            if i.as_int() == 0:
                ctx.unsupported("resizing an empty axis")
            factors.append(o.as_int() / i.as_int())
        else:
            ratio = o // i if i.divides(o) else None
            if ratio is None or not ratio.is_fixed:
                ctx.needs_fixed_sizes(
                    f"output size {o} is not an integer multiple of the symbolic size {i}"
                )
            factors.append(float(ratio.as_int()))
    if policy == "stretch":
        return list(sizes), factors
    scale = min(factors) if policy == "not_larger" else max(factors)
    if not all(i.is_fixed for i in ins):
        ctx.needs_fixed_sizes(f"keep_aspect_ratio_policy '{policy}' with symbolic sizes")
    return [Size(int(scale * i.as_int() + 0.5)) for i in ins], [scale] * len(ins)


# -- applying the plan ---------------------------------------------------------------------------
def _weights_along(ctx: NodeContext, w: np.ndarray, rank: int, axis: int, x: Value) -> Value:
    shape = (len(w),) + (1,) * (rank - axis - 1)
    return ctx.graph.constant(w.reshape(shape).astype(ctx.graph.dtype(x).np))


MAX_SIZE = 1 << 24
"""The largest output size of a resized axis (its index tables are built at load time)."""

MAX_GATHER_TAPS = 8
"""Wider kernels (antialiased downsampling) apply one dense [in, out] matrix instead of gathers."""


def _dense(ctx: NodeContext, x: Value, axis: int, taps: Taps) -> Value:
    """The taps as a dense interpolation matrix, applied by a matmul over the moved axis."""
    g = ctx.graph
    rank = g[x].rank
    size = g.shape(x)[axis].as_int()
    m = np.zeros((size, len(taps.index)))
    rows = np.broadcast_to(np.arange(len(taps.index))[:, None], taps.index.shape)
    np.add.at(m, (taps.index, rows), taps.weight)
    perm = [a for a in range(rank) if a != axis] + [axis]
    y = g.matmul_nd(g.permute(x, perm), g.constant(m.astype(g.dtype(x).np)))
    back = [0] * rank
    for i, p in enumerate(perm):
        back[p] = i
    return g.permute(y, back)


def _apply_taps(ctx: NodeContext, x: Value, axis: int, taps: Taps, extrapolation: float) -> Value:
    g = ctx.graph
    rank = g[x].rank
    if taps.one_hot:
        y = g.gather(x, axis, g.constant(taps.selected()))
    else:
        if not g.dtype(x).is_float:
            ctx.unsupported(f"linear/cubic interpolation of {g.dtype(x)} data")
        used = [t for t in range(taps.weight.shape[1]) if taps.weight[:, t].any()]
        if len(used) > MAX_GATHER_TAPS:
            y = _dense(ctx, x, axis, taps)
        else:
            terms = [
                g.mul(
                    g.gather(x, axis, g.constant(taps.index[:, t])),
                    _weights_along(ctx, taps.weight[:, t], rank, axis, x),
                )
                for t in used
            ]
            y = terms[0]
            for term in terms[1:]:
                y = g.add(y, term)
    if taps.outside is not None:
        mask = g.constant(taps.outside.reshape((len(taps.outside),) + (1,) * (rank - axis - 1)))
        y = g.select(mask, g.scalar(extrapolation, g.dtype(x)), y)
    return y


def _resolve_nearest(interp: Interp, scale: float) -> Interp:
    """ORT's "simple" rounding (Upsample, Resize-10): floor when enlarging, ceil when shrinking."""
    if interp.nearest_mode != "simple":
        return interp
    return dataclasses.replace(interp, nearest_mode="floor" if scale >= 1 else "ceil")


def _symbolic_axis(ctx: NodeContext, x: Value, p: AxisPlan, interp: Interp) -> Value:
    """An axis of symbolic size: only integer nearest repetition is expressible; it is checked
    against the tables of a few concrete sizes (edges included) before being used."""
    size = ctx.graph.shape(x)[p.axis]
    k = p.out // size if size.divides(p.out) else None
    if (
        k is None
        or not k.is_fixed
        or k.as_int() < 1
        or interp.mode != "nearest"
        or p.roi is not None
    ):
        ctx.needs_fixed_sizes(
            f"resizing the symbolic axis {p.axis} ({size} -> {p.out}) is not an integer nearest repetition"
        )
    reps = k.as_int()
    for n in (1, 2, 3, 5, 8):
        taps = axis_taps(_resolve_nearest(interp, p.scale), n, n * reps, p.scale)
        if not np.array_equal(taps.selected(), np.repeat(np.arange(n), reps)):
            ctx.unsupported(
                f"nearest resize of the symbolic axis {p.axis} by {reps} is not a repetition"
            )
    return ctx.graph.repeat_interleave(x, p.axis, reps)


def _resize(ctx: NodeContext, interp: Interp) -> Value:
    g = ctx.graph
    x = ctx.input(0)
    plans = _plan(ctx, x, interp)
    extrapolation = (
        ctx.attr_float("extrapolation_value", 0.0)
        if ctx.op_type == "Resize" and ctx.opset >= 11
        else 0.0
    )
    for p in plans:
        size = g.shape(x)[p.axis]
        trivial_roi = p.roi is None or (np.isclose(p.roi[0], 0.0) and np.isclose(p.roi[1], 1.0))
        if np.isclose(p.scale, 1.0) and p.out == size and trivial_roi:
            continue
        if not (size.is_fixed and p.out.is_fixed):
            x = _symbolic_axis(ctx, x, p, interp)
            continue
        if p.out == Size(0):  # an empty result, as the reference and onnxruntime give
            x = g.slice_raw(x, p.axis, 0, 1, 0)
            continue
        if not (1 <= p.out.as_int() <= MAX_SIZE and size.as_int() >= 1):
            ctx.unsupported(f"resizing axis {p.axis} from {size} to {p.out}")
        axis_interp = _resolve_nearest(interp, p.scale)
        taps = axis_taps(axis_interp, size.as_int(), p.out.as_int(), p.scale, p.roi)
        if interp.coord in LENGTH_SENSITIVE:
            spec = axis_taps(
                axis_interp, size.as_int(), p.out.as_int(), p.scale, p.roi, by_length=True
            )
            if not taps.same_as(spec):
                ctx.unsupported(
                    f"{interp.coord} on axis {p.axis} with a fractional output width "
                    f"{size} x {p.scale:g}: the ONNX reference divides by that width, the "
                    f"spec and onnxruntime by the output length {p.out}; they disagree"
                )
        x = _apply_taps(ctx, x, p.axis, taps, extrapolation)
    return x


@onnx_op("Resize")
def resize(ctx: NodeContext) -> Result:
    return _resize(ctx, _read_interp(ctx))


@onnx_op("Upsample")
def upsample(ctx: NodeContext) -> Result:
    return _resize(ctx, _read_interp(ctx))
