"""Sampling at computed positions: AffineGrid (a constant base grid times theta) and GridSample.

GridSample's taps depend on the grid, a runtime tensor: per spatial axis the tap indices and
weights are elementwise functions of the grid, and every combination of taps is one Gather from
the input laid out as [N·spatial, C] with flat indices, weighted and summed. Padding modes
(zeros, border, reflection) and the coordinate rules follow the ONNX reference.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from kn_graph.dtype import DType
from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.shape import static_ints
from kn_graph.ops import BinaryOp, UnaryOp, Value
from kn_graph.shape import Shape, Size

__all__ = ["affine_grid", "grid_sample"]

MAX_GRID = 1 << 24
"""The most points an AffineGrid builds (its base coordinates are a load-time constant)."""

_MODES = {
    "bilinear": "linear",
    "bicubic": "cubic",
    "linear": "linear",
    "cubic": "cubic",
    "nearest": "nearest",
}
_CUBIC_A = -0.75


# -- AffineGrid -----------------------------------------------------------------------------------------
def _base_coords(n: int, align_corners: bool) -> np.ndarray:
    """Normalised pixel centres (or corners) of one axis, as the reference's arange builds them."""
    if align_corners:
        if n == 1:
            return np.array([-1.0])
        return -1.0 + np.arange(n) * (2.0 / (n - 1))
    step = 2.0 / n
    return -1.0 + step / 2 + np.arange(n) * step


@onnx_op("AffineGrid")
def affine_grid(ctx: NodeContext) -> Result:
    """grid[n, *pos] = theta[n] @ (x, y[, z], 1): x runs along the last spatial axis."""
    g = ctx.graph
    theta = ctx.input(0)
    size = static_ints(ctx, 1, "size")
    align = ctx.attr_bool("align_corners", False)
    nd = len(size) - 2
    ts = g.shape(theta)
    if (
        nd not in (2, 3)
        or ts.rank != 3
        or ts[1] != Size(nd)
        or ts[2] != Size(nd + 1)
        or min(size[2:]) < 1
    ):
        ctx.unsupported(
            f"theta {ts} and size {size}: expected [N, {nd}, {nd + 1}] and 2-D or 3-D sizes"
        )
    if not g.dtype(theta).is_float:
        ctx.unsupported(f"expected a float theta, found {g.dtype(theta)}")
    spatial = size[2:]
    if math.prod(spatial) > MAX_GRID:
        ctx.unsupported(f"a grid of {spatial} points is too large to build (at most {MAX_GRID})")
    axes = [_base_coords(n, align) for n in spatial]
    mesh = np.meshgrid(*axes, indexing="ij")
    homo = np.stack([*reversed(mesh), np.ones(spatial)], axis=-1).reshape(
        -1, nd + 1
    )  # (x, y, [z], 1)
    base = g.constant(homo.astype(g.dtype(theta).np))
    grid = g.matmul_nd(base, g.transpose(theta))  # [N, P, nd]
    return g.view(grid, Shape.of(ts[0], *spatial, nd))


# -- GridSample -----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Axis:
    """One spatial axis of the input: its size and the reflection borders of the coordinates."""

    size: int
    lo: float
    hi: float


@dataclass(frozen=True, slots=True)
class Tap:
    index: Value  # i64, a position along the axis (already mapped into range)
    weight: Value | None  # float, None for weight 1
    valid: Value | None  # bool (zeros padding), None when always valid


class Sampler:
    """Elementwise coordinate arithmetic for one GridSample node."""

    def __init__(
        self, ctx: NodeContext, mode: str, padding: str, align: bool, dtype: DType
    ) -> None:
        self.ctx, self.g = ctx, ctx.graph
        self.mode, self.padding, self.align, self.dtype = mode, padding, align, dtype

    def axis(self, size: int) -> Axis:
        return Axis(size, 0.0, size - 1.0) if self.align else Axis(size, -0.5, size - 0.5)

    def denormalize(self, u: Value, ax: Axis) -> Value:
        g = self.g
        if self.align:
            return g.mul(g.add(u, 1.0), (ax.size - 1) / 2.0)
        return g.div(g.sub(g.mul(g.add(u, 1.0), float(ax.size)), 1.0), 2.0)

    def reflect(self, x: Value, lo: float, hi: float) -> Value:
        """Fold x into [lo, hi] by reflections at the borders (the reference's _gs_reflect)."""
        g = self.g
        span = hi - lo
        below, above = g.binary(BinaryOp.LT, x, lo), g.binary(BinaryOp.GT, x, hi)
        dist = g.select(below, g.sub(lo, x), g.sub(x, hi))  # >= 0 where outside
        turns = g.unary(UnaryOp.FLOOR, g.div(dist, span))
        rest = g.sub(dist, g.mul(turns, span))
        even = g.binary(
            BinaryOp.EQ, g.sub(turns, g.mul(g.unary(UnaryOp.FLOOR, g.div(turns, 2.0)), 2.0)), 0.0
        )
        from_lo, from_hi = g.add(rest, lo), g.sub(hi, rest)
        low_side = g.select(even, from_lo, from_hi)
        high_side = g.select(even, from_hi, from_lo)
        return g.select(below, low_side, g.select(above, high_side, x))

    def adjust(self, x: Value, ax: Axis) -> Value:
        """Coordinates outside the borders: clamped (border) or reflected (reflection)."""
        g = self.g
        match self.padding:
            case "border":
                outside = g.binary(
                    BinaryOp.OR, g.binary(BinaryOp.LT, x, ax.lo), g.binary(BinaryOp.GT, x, ax.hi)
                )
                return g.select(outside, g.clamp(x, 0.0, ax.size - 1.0), x)
            case "reflection":
                return self.reflect(x, ax.lo, ax.hi)
            case _:
                return x

    def pixel(self, i: Value, ax: Axis) -> tuple[Value, Value | None]:
        """An integer position mapped into [0, size) per the padding mode, and its validity."""
        g = self.g
        last = ax.size - 1
        match self.padding:
            case "zeros":
                valid = g.binary(
                    BinaryOp.AND, g.binary(BinaryOp.GE, i, 0), g.binary(BinaryOp.LE, i, last)
                )
                return g.clamp(i, 0, last), valid
            case "border":
                return g.clamp(i, 0, last), None
            case _:
                folded = self.reflect(g.cast(i, self.dtype), ax.lo, ax.hi)
                return g.clamp(g.cast(folded, DType.I64), 0, last), None

    def taps(self, u: Value, ax: Axis) -> list[Tap]:
        g = self.g
        x = self.denormalize(u, ax)
        if self.mode == "nearest":
            x = self.adjust(g.unary(UnaryOp.ROUND, x), ax)
            index, valid = self.pixel(g.cast(x, DType.I64), ax)
            return [Tap(index, None, valid)]
        x = self.adjust(x, ax)
        x0 = g.unary(UnaryOp.FLOOR, x)
        r = g.sub(x, x0)
        base = g.cast(x0, DType.I64)
        if self.mode == "linear":
            weights = [g.sub(1.0, r), r]
            offsets = [0, 1]
        else:
            weights = _cubic_weights(self.ctx, r)
            offsets = [-1, 0, 1, 2]
        out = []
        for off, w in zip(offsets, weights, strict=True):
            index, valid = self.pixel(g.add(base, off) if off else base, ax)
            out.append(Tap(index, w, valid))
        return out


def _cubic_weights(ctx: NodeContext, r: Value) -> list[Value]:
    """Keys' cubic convolution weights (a = -0.75) of the taps at -1, 0, 1, 2 for fraction r."""
    g = ctx.graph
    a = _CUBIC_A

    def far(t: Value) -> Value:  # 1 < t < 2
        return g.sub(g.mul(g.add(g.mul(g.sub(g.mul(t, a), 5 * a), t), 8 * a), t), 4 * a)

    def near(t: Value) -> Value:  # t <= 1
        return g.add(g.mul(g.mul(g.sub(g.mul(t, a + 2), a + 3), t), t), 1.0)

    s = g.sub(1.0, r)
    return [far(g.add(r, 1.0)), near(r), near(s), far(g.add(s, 1.0))]


@onnx_op("GridSample")
def grid_sample(ctx: NodeContext) -> Result:
    g = ctx.graph
    x, grid = ctx.input(0), ctx.input(1)
    xs, gs = g.shape(x), g.shape(grid)
    nd = xs.rank - 2
    if nd < 1 or gs.rank != xs.rank or gs[0] != xs[0] or gs[-1] != Size(nd):
        ctx.unsupported(
            f"expected X [N, C, *spatial] and grid [N, *out, {nd}], found {xs} and {gs}"
        )
    mode = _MODES.get(ctx.attr_str("mode", "linear" if ctx.opset >= 20 else "bilinear"))
    padding = ctx.attr_str("padding_mode", "zeros")
    align = ctx.attr_bool("align_corners", False)
    if mode is None or padding not in ("zeros", "border", "reflection"):
        ctx.unsupported(f"mode '{ctx.attr_str('mode', '')}' / padding_mode '{padding}'")
    if mode == "cubic" and padding == "border":
        # onnxruntime clamps every tap (PyTorch's rule), the ONNX reference only the position
        ctx.unsupported(
            "cubic interpolation with border padding: onnxruntime and the reference disagree"
        )
    if mode != "nearest" and not g.dtype(x).is_float:
        ctx.unsupported(f"{mode} interpolation of {g.dtype(x)} data")
    if not g.dtype(grid).is_float:
        ctx.unsupported(f"expected a float grid, found {g.dtype(grid)}")
    spatial = [d.as_int("GridSample input spatial size") for d in xs.dims[2:]]
    if padding == "reflection" and align and min(spatial) == 1:
        ctx.unsupported(
            "reflection padding of a size-1 axis with align_corners (no room to reflect)"
        )
    coord_dtype = DType.F64 if g.dtype(grid) == DType.F64 else DType.F32
    sampler = Sampler(ctx, mode, padding, align, coord_dtype)
    gridc = g.cast(grid, coord_dtype)
    out_shape = Shape(gs.dims[:-1])  # [N, *out]
    per_axis = []
    for i, n in enumerate(spatial):  # grid components run x, y, z: the last spatial axis first
        u = g.squeeze(g.slice_raw(gridc, -1, nd - 1 - i, 1, 1), [-1])
        per_axis.append(sampler.taps(u, sampler.axis(n)))
    return _gather_taps(ctx, x, per_axis, out_shape, spatial)


def _gather_taps(
    ctx: NodeContext, x: Value, per_axis: list[list[Tap]], out_shape: Shape, spatial: list[int]
) -> Value:
    """Sum over every combination of per-axis taps of weight · X[n, :, idx…] (one Gather each)."""
    g = ctx.graph
    xs = g.shape(x)
    nd = len(spatial)
    total = math.prod(spatial)
    c = xs[1]
    rows = g.view(g.permute(x, [0, *range(2, 2 + nd), 1]), Shape.of(xs[0] * total, c))  # [N·S, C]
    count = out_shape.size()
    batch = g.mul(g.iota(out_shape, 0, DType.I64), total)
    strides = [math.prod(spatial[i + 1 :]) for i in range(nd)]
    acc: Value | None = None
    for combo in itertools.product(*per_axis):
        flat = batch
        weight: Value | None = None
        valid: Value | None = None
        for tap, stride in zip(combo, strides, strict=True):
            flat = g.add(flat, g.mul(tap.index, stride) if stride != 1 else tap.index)
            if tap.weight is not None:
                weight = tap.weight if weight is None else g.mul(weight, tap.weight)
            if tap.valid is not None:
                valid = tap.valid if valid is None else g.binary(BinaryOp.AND, valid, tap.valid)
        picked = g.gather(rows, 0, g.view(flat, Shape.of(count)))  # [N·P, C]
        if weight is not None:
            w = g.cast(weight, g.dtype(x))
            if valid is not None:
                w = g.select(valid, w, 0.0)
            term = g.mul(picked, g.view(w, Shape.of(count, 1)))
        elif valid is not None:
            term = g.select(g.view(valid, Shape.of(count, 1)), picked, g.scalar(0, g.dtype(x)))
        else:
            term = picked
        acc = term if acc is None else g.add(acc, term)
    assert acc is not None
    y = g.view(acc, out_shape + Shape.of(c))
    return g.permute(y, [0, out_shape.rank, *range(1, out_shape.rank)])
