"""Pooling: MaxPool, AveragePool, LpPool and their global forms.

Max and average pooling use the graph's `pool` builder (strided slices of the padded input);
LpPool is a depthwise convolution of |x|^p with a filter of ones, whose zero padding is exactly
what the ONNX reference counts.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from kn_graph.dtype import DType
from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.spatial import Window, kernel_attr, read_window
from kn_graph.ops import ReduceOp, UnaryOp, Value
from kn_graph.shape import Shape, Size

__all__ = ["average_pool", "global_lp_pool", "global_pool", "lp_pool", "max_pool"]


MAX_WINDOW = 1 << 16
"""Positions of the largest pooling window: the builder unrolls one slice per position."""


def _window(ctx: NodeContext, x: Value) -> Window:
    shape = ctx.graph.shape(x)
    if shape.rank < 3:
        ctx.unsupported(f"expected an input [N,C,*spatial], found {shape}")
    kernel = kernel_attr(ctx, shape.rank - 2, required=True)
    assert kernel is not None
    if math.prod(kernel) > MAX_WINDOW:
        ctx.unsupported(f"kernel {list(kernel)} has more than {MAX_WINDOW} positions")
    return read_window(
        ctx, shape.dims[2:], kernel, allow_dilations=ctx.op_type != "AveragePool" or ctx.opset >= 19
    )


def _pool(ctx: NodeContext, kind: Literal["max", "avg"], count_include_pad: bool) -> Value:
    x = ctx.input(0)
    win = _window(ctx, x)
    ceil_mode = ctx.attr_bool("ceil_mode", False)
    return ctx.graph.pool(
        x, kind, win.kernel, win.strides, win.pads, win.dilations, ceil_mode, count_include_pad
    )


@onnx_op("MaxPool")
def max_pool(ctx: NodeContext) -> list[Result | None]:
    """The values, and when used the Indices output (flat positions in the input, row-major or
    with storage_order=1 column-major), built from the same window taps."""
    column_major = ctx.attr_bool("storage_order", False)
    values = _pool(ctx, "max", False)
    if len(ctx.node.output) < 2 or not ctx.node.output[1]:
        return [values, None]
    x = ctx.input(0)
    win = _window(ctx, x)
    idx = ctx.graph.max_pool_indices(
        x,
        win.kernel,
        win.strides,
        win.pads,
        win.dilations,
        ctx.attr_bool("ceil_mode", False),
        column_major,
    )
    return [values, idx]


@onnx_op("AveragePool")
def average_pool(ctx: NodeContext) -> Result:
    if not ctx.input_dtype(0).is_float:
        ctx.unsupported(f"expected a float input, found {ctx.input_dtype(0)}")
    return _pool(ctx, "avg", ctx.attr_bool("count_include_pad", False))


@onnx_op("GlobalAveragePool", "GlobalMaxPool")
def global_pool(ctx: NodeContext) -> Result:
    x = ctx.input(0)
    if ctx.graph[x].rank < 3:
        ctx.unsupported(f"expected an input [N,C,*spatial], found {ctx.graph.shape(x)}")
    return ctx.graph.global_pool(x, "max" if ctx.op_type == "GlobalMaxPool" else "avg")


def _abs_pow(ctx: NodeContext, x: Value, p: int) -> Value:
    g = ctx.graph
    if p < 1:
        ctx.unsupported(f"p = {p}; expected p >= 1")
    if p == 2:
        return g.mul(x, x)
    a = g.unary(UnaryOp.ABS, x)
    return a if p == 1 else g.pow(a, float(p))


def _root(ctx: NodeContext, s: Value, p: int) -> Value:
    g = ctx.graph
    match p:
        case 1:
            return s
        case 2:
            return g.sqrt(s)
        case _:
            return g.pow(s, 1.0 / p)


@onnx_op("LpPool")
def lp_pool(ctx: NodeContext) -> Result:
    """(sum over the window of |x|^p)^(1/p), padded positions contributing zero."""
    g = ctx.graph
    x = ctx.input(0)
    if not g.dtype(x).is_float:
        ctx.unsupported(f"expected a float input, found {g.dtype(x)}")
    p = ctx.attr_int("p", 2)
    win = _window(ctx, x)
    ceil_mode = ctx.attr_bool("ceil_mode", False)
    shape = g.shape(x)
    c = shape[1].as_int("LpPool channels")
    if c * math.prod(win.kernel) > 1 << 24:  # the filter of ones is a constant
        ctx.unsupported(f"a filter of {c} channels x kernel {list(win.kernel)} is too large")
    pads = list(win.pads)
    if ceil_mode:
        pads = _ceil_pads(ctx, shape, win)
    powered = _abs_pow(ctx, x, p)
    sym = tuple(min(b, a) for b, a in pads)
    extra = [(b - s, a - s) for (b, a), s in zip(pads, sym, strict=True)]
    if any(b or a for b, a in extra):
        powered = g.pad(powered, [(0, 0), (0, 0), *extra])
    ones = g.constant(np.ones((c, 1, *win.kernel), g.dtype(x).np))
    summed = g.conv(powered, ones, win.strides, sym, win.dilations, groups=c)
    return _root(ctx, summed, p)


def _ceil_pads(ctx: NodeContext, shape: Shape, win: Window) -> list[tuple[int, int]]:
    """Extra end padding so that a floor-mode convolution yields the ceil-mode output size
    (the last window must still start inside the input or its leading padding)."""
    out: list[tuple[int, int]] = []
    for i in range(win.rank):
        n = shape[2 + i].as_int("LpPool ceil_mode spatial size")
        (pb, pa), k, s, d = win.pads[i], win.kernel[i], win.strides[i], win.dilations[i]
        span = n + pb + pa - d * (k - 1) - 1
        if span < 0:
            ctx.unsupported(f"kernel {list(win.kernel)} larger than the padded input {shape}")
        o = -(-span // s) + 1
        if (o - 1) * s >= n + pb:
            o -= 1
        out.append((pb, pa + max(0, (o - 1) * s + d * (k - 1) + 1 - (n + pb + pa))))
    return out


@onnx_op("GlobalLpPool")
def global_lp_pool(ctx: NodeContext) -> Result:
    g = ctx.graph
    x = ctx.input(0)
    if not g.dtype(x).is_float or g[x].rank < 3:
        ctx.unsupported(f"expected a float input [N,C,*spatial], found {g.dtype(x)}{g.shape(x)}")
    p = ctx.attr_int("p", 2)
    s = g.reduce(_abs_pow(ctx, x, p), range(2, g[x].rank), ReduceOp.SUM, keepdims=True)
    return _root(ctx, s, p)


@onnx_op("MaxUnpool")
def max_unpool(ctx: NodeContext) -> Result:
    """The values of X written at the flat positions I (MaxPool's indices: flat over the whole
    N,C,spatial output) of a zero tensor; the output size from `output_shape` or from the window
    ((in - 1)·stride - pads + kernel). A scatter with indices from data: a Dynamic op."""
    g = ctx.graph
    x, idx = ctx.input(0), ctx.input(1)
    shape = g[x].shape
    kernel = kernel_attr(ctx, shape.rank - 2, True)
    assert kernel is not None
    strides = ctx.attr_ints("strides", [1] * len(kernel)) or []
    pads = ctx.attr_ints("pads", [0] * 2 * len(kernel)) or []
    n = len(kernel)
    out_dims = [shape[0], shape[1]] + [
        (shape[2 + i] - 1) * strides[i] - pads[i] - pads[n + i] + kernel[i] for i in range(n)
    ]
    out = Shape.of(*out_dims)
    if g[idx].shape != shape:
        ctx.unsupported(f"indices {g[idx].shape} must have the shape of X {shape}")
    zeros = g.full(0, Shape.of(out.size()), g[x].dtype)
    flat_i = g.view(g.cast(idx, DType.I64), Shape.of(shape.size(), 1))
    (y,) = g.dynamic(
        "scatter_nd",
        [zeros, flat_i, g.view(x, Shape.of(shape.size()))],
        ("none",),
        [Shape.of(out.size())],
        [g[x].dtype],
    )
    y = g.view(y, out)
    if ctx.has_input(2):  # indices address the default size; a larger output is zero-padded
        want = ctx.input_sizes(2, "output_shape")
        if len(want) != out.rank:
            ctx.unsupported(f"output_shape {want} for a rank-{out.rank} output")
        for axis, (have, size) in enumerate(zip(out.dims, want, strict=True)):
            extra = size - have
            if extra.fixed_value() is not None and extra.as_int() < 0:
                ctx.unsupported(f"output_shape {want} is smaller than the unpooled size {out}")
            if extra != Size(0):
                zpad = g.full(0, out.replace(axis, extra), g[x].dtype)
                y = g.concat([y, zpad], axis)
                out = out.replace(axis, size)
    return y
