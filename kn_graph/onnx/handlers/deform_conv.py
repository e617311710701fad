"""DeformConv (2-D): every kernel tap reads the input at its regular position plus a learned,
runtime offset, bilinearly (zero outside the image), optionally scaled by a mask; the sampled
columns then meet the filter in one grouped matmul.

Sampling is four Gathers from the input laid out as [N·offset_groups·H·W, channels], with flat
indices and bilinear weights computed elementwise from the offsets.
"""

from __future__ import annotations

from kn_graph.dtype import DType
from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.spatial import split_pads
from kn_graph.ops import BinaryOp, UnaryOp, Value
from kn_graph.shape import Shape, Size

__all__ = ["deform_conv"]


def _positions(
    ctx: NodeContext, offset: Value, axis: int, stride: int, pad: int, dil: int
) -> Value:
    """Sampling coordinate along one spatial axis, [N, G, kh, kw, oH, oW]: the regular position
    (out·stride - pad + tap·dilation) plus the offset's component for that axis."""
    g = ctx.graph
    comp = g.squeeze(g.slice_raw(offset, 4, axis, 1, 1), [4])
    shape = g.shape(comp)
    out_pos = g.mul(g.iota(shape, 4 + axis, DType.I64), stride)
    tap = g.mul(g.iota(shape, 2 + axis, DType.I64), dil)
    base = g.cast(g.sub(g.add(out_pos, tap), pad), g.dtype(comp))
    return g.add(base, comp)


def _corners(ctx: NodeContext, p: Value, size: int) -> list[tuple[Value, Value, Value]]:
    """The two integer neighbours of p: (clamped index, weight, inside the image)."""
    g = ctx.graph
    p0 = g.unary(UnaryOp.FLOOR, p)
    r = g.sub(p, p0)
    i0 = g.cast(p0, DType.I64)
    out = []
    for off, w in ((0, g.sub(1.0, r)), (1, r)):
        i = g.add(i0, off) if off else i0
        inside = g.binary(BinaryOp.AND, g.binary(BinaryOp.GE, i, 0), g.binary(BinaryOp.LT, i, size))
        out.append((g.clamp(i, 0, size - 1), w, inside))
    return out


def _sample(
    ctx: NodeContext,
    x: Value,
    offset: Value,
    geometry: tuple[list[int], list[int], list[tuple[int, int]]],
    groups_off: int,
) -> Value:
    """Bilinear samples [N, G, kh, kw, oH, oW, C/G] of x at the deformed tap positions."""
    g = ctx.graph
    strides, dilations, pads = geometry
    n, c, h, w = g.shape(x)
    hi, wi = h.as_int("DeformConv height"), w.as_int("DeformConv width")
    cg = c // groups_off
    rows = g.permute(g.view(x, Shape.of(n, groups_off, cg, hi, wi)), [0, 1, 3, 4, 2])
    rows = g.view(rows, Shape.of(n * groups_off * hi * wi, cg))
    py = _positions(ctx, offset, 0, strides[0], pads[0][0], dilations[0])
    px = _positions(ctx, offset, 1, strides[1], pads[1][0], dilations[1])
    shape = g.shape(py)  # [N, G, kh, kw, oH, oW]
    plane = g.mul(
        g.add(g.mul(g.iota(shape, 0, DType.I64), groups_off), g.iota(shape, 1, DType.I64)), hi * wi
    )
    count = shape.size()
    acc: Value | None = None
    for iy, wy, vy in _corners(ctx, py, hi):
        for ix, wx, vx in _corners(ctx, px, wi):
            flat = g.add(plane, g.add(g.mul(iy, wi), ix))
            weight = g.select(g.binary(BinaryOp.AND, vy, vx), g.mul(wy, wx), 0.0)
            picked = g.gather(rows, 0, g.view(flat, Shape.of(count)))
            term = g.mul(picked, g.view(g.cast(weight, g.dtype(x)), Shape.of(count, 1)))
            acc = term if acc is None else g.add(acc, term)
    assert acc is not None
    return g.view(acc, shape + Shape.of(cg))


@onnx_op("DeformConv")
def deform_conv(ctx: NodeContext) -> Result:
    g = ctx.graph
    x, w, offset = ctx.input(0), ctx.input(1), ctx.input(2)
    xs, ws, os_ = g.shape(x), g.shape(w), g.shape(offset)
    if xs.rank != 4 or ws.rank != 4 or os_.rank != 4 or not g.dtype(x).is_float:
        ctx.unsupported(f"only 2-D float DeformConv: X {xs}, W {ws}, offset {os_}")
    kernel = [d.as_int("DeformConv kernel size") for d in ws.dims[2:]]
    declared = ctx.attr_ints("kernel_shape")
    if declared is not None and list(declared) != kernel:
        ctx.unsupported(f"kernel_shape {declared} differs from the filter's {kernel}")
    strides = list(ctx.attr_ints("strides", [1, 1]) or [])
    dilations = list(ctx.attr_ints("dilations", [1, 1]) or [])
    pads = list(split_pads(ctx, ctx.attr_ints("pads", [0, 0, 0, 0]) or [], 2))
    group, groups_off = ctx.attr_int("group", 1), ctx.attr_int("offset_group", 1)
    if (
        len(strides) != 2
        or len(dilations) != 2
        or min(strides + dilations + [group, groups_off]) < 1
    ):
        ctx.unsupported(
            f"strides {strides}, dilations {dilations}, group {group}, offset_group {groups_off}"
        )
    n, c = xs[0], xs[1]
    oc, k = ws[0], kernel[0] * kernel[1]
    if (
        ws[1] * group != c
        or not Size(group).divides(oc)
        or not Size(groups_off).divides(c)
        or os_[1] != Size(groups_off * k * 2)
        or min(d.as_int() for d in xs.dims[2:]) < 2
    ):
        ctx.unsupported(
            f"inconsistent shapes: X {xs}, W {ws}, offset {os_}, group {group}, offset_group {groups_off}"
        )
    oh, ow = os_[2], os_[3]
    expect = [
        (n_in.as_int() + b + a - d * (kk - 1) - 1) // s + 1
        for n_in, (b, a), d, kk, s in zip(
            xs.dims[2:], pads, dilations, kernel, strides, strict=True
        )
    ]
    if [oh, ow] != [Size(e) for e in expect]:
        ctx.unsupported(f"offset's output size {oh}x{ow} differs from the convolution's {expect}")
    off = g.view(offset, Shape.of(n, groups_off, kernel[0], kernel[1], 2, oh, ow))
    cols = _sample(
        ctx, x, off, (strides, dilations, pads), groups_off
    )  # [N, G, kh, kw, oH, oW, C/G]
    if ctx.has_input(4):
        mask = g.view(ctx.input(4), Shape.of(n, groups_off, kernel[0], kernel[1], oh, ow, 1))
        cols = g.mul(cols, g.cast(mask, g.dtype(x)))
    cols = g.permute(cols, [0, 1, 6, 2, 3, 4, 5])  # [N, G, C/G, kh, kw, oH, oW]: channel-major
    cpg = c // group
    cols = g.view(cols, Shape.of(n, group, cpg * k, oh * ow))
    filt = g.view(w, Shape.of(1, group, oc // group, cpg * k))
    y = g.view(g.matmul_nd(filt, cols), Shape.of(n, oc, oh, ow))
    if ctx.has_input(3):
        y = g.add(y, g.view(ctx.input(3), Shape.of(oc, 1, 1)))
    return y
