"""RoiAlign with a fixed sampling_ratio: each output bin averages (or maxes) a G x G grid of
bilinear samples of its region of interest. The regions are runtime tensors, so the sample
positions, tap indices and weights are elementwise functions of them; the bilinear rule is
separable per axis, and each of the four corner combinations is one Gather.

An adaptive sampling_ratio (0) makes the number of samples depend on the data: refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from kn_graph.dtype import DType
from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.ops import BinaryOp, ReduceOp, Value
from kn_graph.shape import Shape, Size

__all__ = ["roi_align"]


@dataclass(frozen=True, slots=True)
class AxisTaps:
    """Per region and sample: the low and high neighbour rows/columns and their weights."""

    low: Value  # i64 [R, S]
    high: Value
    w_low: Value  # f64 [R, S], zero for samples outside the image
    w_high: Value


def _samples(ctx: NodeContext, start: Value, length: Value, bins: int, grid: int) -> Value:
    """Sample coordinates [R, bins·grid]: start + bin·size + (i + 0.5)·size / grid."""
    g = ctx.graph
    r = g.shape(start)[0]
    size = g.div(length, float(bins))  # [R, 1]
    shape = Shape.of(r, bins, grid)
    b = g.cast(g.iota(shape, 1, DType.I64), DType.F64)
    i = g.cast(g.iota(shape, 2, DType.I64), DType.F64)
    size3 = g.view(size, Shape.of(r, 1, 1))
    pos = g.add(
        g.view(start, Shape.of(r, 1, 1)),
        g.add(g.mul(b, size3), g.div(g.mul(g.add(i, 0.5), size3), float(grid))),
    )
    return g.view(pos, Shape.of(r, bins * grid))


def _axis_taps(ctx: NodeContext, p: Value, extent: int) -> AxisTaps:
    """The reference's bilinear rule on one axis: outside [-1, extent] contributes nothing;
    below 0 reads row 0; at or past the last row reads the last row only."""
    g = ctx.graph
    valid = g.binary(
        BinaryOp.AND, g.binary(BinaryOp.GE, p, -1.0), g.binary(BinaryOp.LE, p, float(extent))
    )
    pc = g.maximum(p, 0.0)
    low = g.cast(pc, DType.I64)  # truncation = floor for pc >= 0
    last = g.binary(BinaryOp.GE, low, extent - 1)
    low = g.select(last, g.scalar(extent - 1, DType.I64), low)
    high = g.select(last, low, g.add(low, 1))
    frac = g.select(last, 0.0, g.sub(pc, g.cast(low, DType.F64)))
    zero = g.scalar(0.0, DType.F64)
    w_high = g.select(valid, frac, zero)
    w_low = g.select(valid, g.sub(1.0, frac), zero)
    return AxisTaps(low, high, w_low, w_high)


def _region(
    ctx: NodeContext, rois: Value, half_pixel: bool, scale: float
) -> tuple[Value, Value, Value, Value]:
    """start_h, start_w, height, width of each region ([R, 1] f64)."""
    g = ctx.graph
    r = g.mul(g.cast(rois, DType.F64), scale)
    if half_pixel:
        r = g.sub(r, 0.5)

    def col(i: int) -> Value:
        return g.slice_raw(r, 1, i, 1, 1)

    w, h = g.sub(col(2), col(0)), g.sub(col(3), col(1))
    if not half_pixel:
        w, h = g.maximum(w, 1.0), g.maximum(h, 1.0)
    return col(1), col(0), h, w


@onnx_op("RoiAlign")
def roi_align(ctx: NodeContext) -> Result:
    g = ctx.graph
    x, rois, idx = ctx.input(0), ctx.input(1), ctx.input(2)
    xs = g.shape(x)
    if (
        xs.rank != 4
        or g[rois].rank != 2
        or g.shape(rois)[1] != Size(4)
        or g[idx].rank != 1
        or not g.dtype(x).is_float
    ):
        ctx.unsupported(
            f"expected float X [N,C,H,W], rois [R,4], batch_indices [R]; found {xs}, {g.shape(rois)}, {g.shape(idx)}"
        )
    mode = ctx.attr_str("mode", "avg")
    coord = (
        ctx.attr_str("coordinate_transformation_mode", "half_pixel")
        if ctx.opset >= 16
        else "output_half_pixel"
    )
    oh, ow = ctx.attr_int("output_height", 1), ctx.attr_int("output_width", 1)
    ratio = ctx.attr_int("sampling_ratio", 0)
    scale = ctx.attr_float("spatial_scale", 1.0)
    if (
        mode not in ("avg", "max")
        or coord not in ("half_pixel", "output_half_pixel")
        or min(oh, ow) < 1
    ):
        ctx.unsupported(
            f"mode '{mode}', coordinate_transformation_mode '{coord}', output {oh}x{ow}"
        )
    if ratio <= 0:
        ctx.unsupported(
            "sampling_ratio 0 (adaptive): the number of samples would depend on the regions"
        )
    h, w = xs[2].as_int("RoiAlign height"), xs[3].as_int("RoiAlign width")
    c = xs[1]
    start_h, start_w, height, width = _region(ctx, rois, coord == "half_pixel", scale)
    ty = _axis_taps(ctx, _samples(ctx, start_h, height, oh, ratio), h)  # [R, oh·G]
    tx = _axis_taps(ctx, _samples(ctx, start_w, width, ow, ratio), w)  # [R, ow·G]
    r = g.shape(rois)[0]
    sy, sx = oh * ratio, ow * ratio
    rows = g.view(g.permute(x, [0, 2, 3, 1]), Shape.of(xs[0] * h * w, c))
    base = g.view(g.mul(g.cast(idx, DType.I64), h * w), Shape.of(r, 1, 1))
    terms = []
    for yi, wy in ((ty.low, ty.w_low), (ty.high, ty.w_high)):
        for xi, wx in ((tx.low, tx.w_low), (tx.high, tx.w_high)):
            flat = g.add(
                base,
                g.add(g.mul(g.view(yi, Shape.of(r, sy, 1)), w), g.view(xi, Shape.of(r, 1, sx))),
            )
            weight = g.mul(
                g.view(wy, Shape.of(r, sy, 1)), g.view(wx, Shape.of(r, 1, sx))
            )  # [R, sy, sx]
            picked = g.gather(rows, 0, g.view(flat, Shape.of(r * sy * sx)))
            term = g.mul(picked, g.view(g.cast(weight, g.dtype(x)), Shape.of(r * sy * sx, 1)))
            terms.append(g.view(term, Shape.of(r, oh, ratio, ow, ratio, c)))
    if mode == "avg":
        total = terms[0]
        for t in terms[1:]:
            total = g.add(total, t)
        y = g.mul(g.reduce(total, [2, 4], ReduceOp.SUM), 1.0 / (ratio * ratio))
    else:
        best = terms[0]
        for t in terms[1:]:
            best = g.maximum(best, t)
        y = g.reduce(best, [2, 4], ReduceOp.MAX)
    return g.permute(y, [0, 3, 1, 2])
