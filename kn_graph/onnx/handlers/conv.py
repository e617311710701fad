"""Convolutions: Conv, ConvTranspose, CausalConvWithState and Col2Im, lowered to the IR's
symmetric-padding Conv.

Asymmetric padding becomes a Pad in front; ConvTranspose becomes zero insertion (for strides),
padding by the dilated kernel span, and a stride-1 Conv with flipped, transposed filters; Col2Im
is a transposed convolution with one-hot filters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.shape import static_ints
from kn_graph.onnx.handlers.spatial import Window, kernel_attr, read_window, split_pads
from kn_graph.ops import Value
from kn_graph.shape import Shape, Size

__all__ = ["causal_conv_with_state", "col2im", "conv", "conv_transpose"]


def _operands(ctx: NodeContext) -> tuple[Value, Value, int]:
    """X and W with their spatial rank; W's spatial sizes must be fixed numbers."""
    x, w = ctx.input(0), ctx.input(1)
    xs, ws = ctx.graph.shape(x), ctx.graph.shape(w)
    nd = xs.rank - 2
    if nd < 1 or ws.rank != xs.rank:
        ctx.unsupported(f"expected X [N,C,*spatial] and W of the same rank, found {xs} and {ws}")
    if not all(d.is_fixed for d in ws.dims[2:]):
        ctx.unsupported(f"the filter's spatial sizes must be fixed, found {ws}")
    kernel = tuple(d.as_int() for d in ws.dims[2:])
    declared = kernel_attr(ctx, nd, required=False)
    if declared is not None and declared != kernel:
        ctx.unsupported(f"kernel_shape {list(declared)} differs from the filter's {list(kernel)}")
    return x, w, nd


def _add_bias(ctx: NodeContext, y: Value, index: int) -> Value:
    """Bias [M] added per output channel (axis 1)."""
    if not ctx.has_input(index):
        return y
    g = ctx.graph
    b = ctx.input(index)
    rank = g[y].rank
    if g[b].rank != 1:
        ctx.unsupported(f"bias must be rank 1, found {g.shape(b)}")
    return g.add(y, g.view(b, Shape.of(g.shape(b)[0], *([1] * (rank - 2)))))


def conv_window(ctx: NodeContext, x: Value, win: Window) -> tuple[Value, tuple[int, ...]]:
    """Pad `x` by the asymmetric part of the window's padding; returns the symmetric rest."""
    sym = tuple(min(b, a) for b, a in win.pads)
    extra = [(b - s, a - s) for (b, a), s in zip(win.pads, sym, strict=True)]
    if any(b or a for b, a in extra):
        x = ctx.graph.pad(x, [(0, 0)] * (ctx.graph[x].rank - win.rank) + extra)
    return x, sym


@onnx_op("Conv")
def conv(ctx: NodeContext) -> Result:
    x, w, _ = _operands(ctx)
    g = ctx.graph
    kernel = g.shape(w).fixed_dims()[2:]
    win = read_window(ctx, g.shape(x).dims[2:], kernel)
    groups = ctx.attr_int("group", 1)
    x, sym = conv_window(ctx, x, win)
    y = g.conv(x, w, win.strides, sym, win.dilations, groups)
    return _add_bias(ctx, y, 2)


# -- ConvTranspose ---------------------------------------------------------------------------------
def _zero_insert(ctx: NodeContext, x: Value, axis: int, stride: int) -> Value:
    """Put stride-1 zeros between the elements along `axis`: [a, b] -> [a, 0, b] for stride 2."""
    g = ctx.graph
    if stride == 1:
        return x
    shape = g.shape(x)
    n = shape[axis]
    y = g.view(x, shape.insert(axis + 1, 1))
    zeros = g.full(0, shape.insert(axis + 1, stride - 1), g.dtype(x))
    y = g.concat([y, zeros], axis + 1)
    y = g.view(y, shape.replace(axis, n * stride))
    return g.slice_raw(y, axis, 0, 1, n * stride - (stride - 1))


def _transposed_filter(ctx: NodeContext, w: Value, groups: int) -> Value:
    """W [C, M/g, *k] of the transposed convolution as the filter [M, C/g, *k] of the direct
    convolution that computes it: channels swapped within each group, kernel flipped."""
    g = ctx.graph
    shape = g.shape(w)
    c, mg = shape[0], shape[1]
    if not Size(groups).divides(c):
        ctx.unsupported(f"{c} input channels not divisible into {groups} groups")
    k = shape.dims[2:]
    grouped = g.view(w, Shape.of(groups, c // groups, mg, *k))
    swapped = g.permute(grouped, [0, 2, 1, *range(3, 3 + len(k))])
    out = g.view(swapped, Shape.of(mg * groups, c // groups, *k))
    for axis in range(2, 2 + len(k)):
        out = g.flip(out, axis)
    return out


def _transpose_pads(
    ctx: NodeContext,
    sizes: Sequence[Size],
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    out_pad: Sequence[int],
) -> list[tuple[int, int]]:
    """Resolve pads from `pads`, `output_shape` or `auto_pad` as the ONNX spec describes; a
    negative 'after' pad extends the output with zeros."""
    nd = len(kernel)
    auto_pad = ctx.attr_str("auto_pad", "NOTSET")
    pads = ctx.attr_ints("pads")
    output_shape = ctx.attr_ints("output_shape")
    if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        ctx.unsupported(f"auto_pad '{auto_pad}'")
    if output_shape is None and auto_pad == "NOTSET":
        return list(split_pads(ctx, pads, nd)) if pads is not None else [(0, 0)] * nd
    if output_shape is None and auto_pad == "VALID":
        return [(0, 0)] * nd
    if not all(s.is_fixed for s in sizes):
        ctx.needs_fixed_sizes("output_shape / auto_pad SAME with symbolic spatial sizes")
    ns = [s.as_int() for s in sizes]
    if output_shape is None:
        target = [n * s for n, s in zip(ns, strides, strict=True)]
    else:
        target = list(output_shape[-nd:])
        if len(target) != nd:
            ctx.unsupported(f"output_shape {output_shape} does not fit {nd} spatial axes")
    out: list[tuple[int, int]] = []
    for i in range(nd):
        full = strides[i] * (ns[i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1
        total = full - target[i]
        if total < 0:  # a larger output_shape adds zeros (then the bias) at the end, as ORT does
            out.append((0, total))
            continue
        small, large = total // 2, total - total // 2
        out.append((small, large) if auto_pad == "SAME_UPPER" else (large, small))
    if pads is not None and output_shape is not None and list(split_pads(ctx, pads, nd)) != out:
        ctx.unsupported(f"explicit pads {pads} contradict output_shape {output_shape}")
    return out


@onnx_op("ConvTranspose")
def conv_transpose(ctx: NodeContext) -> Result:
    x, w, nd = _operands(ctx)
    g = ctx.graph
    kernel = g.shape(w).fixed_dims()[2:]
    groups = ctx.attr_int("group", 1)
    strides = tuple(ctx.attr_ints("strides", [1] * nd) or ())
    dilations = tuple(ctx.attr_ints("dilations", [1] * nd) or ())
    out_pad = list(ctx.attr_ints("output_padding", [0] * nd) or ())
    if len(strides) != nd or len(dilations) != nd or min(strides + dilations) < 1:
        ctx.unsupported(f"invalid strides {list(strides)} or dilations {list(dilations)}")
    if len(out_pad) != nd or any(
        p < 0 or p >= max(s, d) for p, s, d in zip(out_pad, strides, dilations, strict=True)
    ):
        ctx.unsupported(f"invalid output_padding {out_pad}")
    sizes = g.shape(x).dims[2:]
    pads = _transpose_pads(ctx, sizes, kernel, strides, dilations, out_pad)
    for i in range(nd):
        x = _zero_insert(ctx, x, 2 + i, strides[i])
    full = [
        (d * (k - 1) - b, d * (k - 1) - a + op)
        for (b, a), k, d, op in zip(pads, kernel, dilations, out_pad, strict=True)
    ]
    x = g.pad(x, [(0, 0), (0, 0), *full])
    y = g.conv(x, _transposed_filter(ctx, w, groups), None, None, dilations, groups)
    return _add_bias(ctx, y, 2)


@onnx_op("CausalConvWithState")
def causal_conv_with_state(ctx: NodeContext) -> list[Result | None]:
    """A depthwise causal 1-d convolution continuing a stream: the past state (or zeros) is
    prepended, the last k-1 positions become the present state; optional SiLU."""
    g = ctx.graph
    x, w = ctx.input(0), ctx.input(1)
    xs, ws = g.shape(x), g.shape(w)
    if xs.rank != 3 or ws.rank != 3 or ws[0] != xs[1] or ws[1] != Size(1):
        ctx.unsupported(
            f"expected input [B, C, L] and a depthwise weight [C, 1, k], found {xs} and {ws}"
        )
    channels = xs[1].as_int("CausalConvWithState channels")
    k = ws[2].as_int("CausalConvWithState kernel size")
    activation = ctx.attr_str("activation", "none")
    if activation not in ("none", "silu", "swish"):
        ctx.unsupported(f"activation '{activation}'")
    if ctx.has_input(3):
        past = ctx.input(3)
        if g.shape(past) != Shape.of(xs[0], xs[1], k - 1):
            ctx.unsupported(f"past_state {g.shape(past)} must be [{xs[0]}, {xs[1]}, {k - 1}]")
        padded = g.concat([past, x], 2)
    else:
        padded = g.pad(x, [(0, 0), (0, 0), (k - 1, 0)])
    y = _add_bias(ctx, g.conv(padded, w, groups=channels), 2)
    if activation != "none":
        y = g.silu(y)
    length = g.shape(padded)[2]
    present = g.slice_raw(padded, 2, length - (k - 1), 1, k - 1)
    return [y, present]


@onnx_op("Col2Im")
def col2im(ctx: NodeContext) -> Result:
    """Sum sliding blocks back into an image: a grouped transposed convolution whose filter
    puts each of the K = prod(block_shape) input channels of a group at its kernel position."""
    g = ctx.graph
    x = ctx.input(0)
    image = static_ints(ctx, 1, "image_shape")
    block = static_ints(ctx, 2, "block_shape")
    nd = len(image)
    xs = g.shape(x)
    k = math.prod(block) if block else 0
    if (
        nd < 1
        or len(block) != nd
        or min(block + image) < 1
        or xs.rank != 3
        or not Size(k).divides(xs[1])
    ):
        ctx.unsupported(f"input {xs}, image_shape {image}, block_shape {block}")
    columns = xs[1].fixed_value()
    if columns is not None and columns * k > 1 << 24:  # the one-hot filter is [columns, 1, *block]
        ctx.unsupported(f"a Col2Im filter of {columns} x {k} entries is too large")
    strides = tuple(ctx.attr_ints("strides", [1] * nd) or ())
    dilations = tuple(ctx.attr_ints("dilations", [1] * nd) or ())
    pads = split_pads(ctx, ctx.attr_ints("pads", [0] * (2 * nd)) or [], nd)
    if (
        len(strides) != nd
        or len(dilations) != nd
        or min(strides + dilations) < 1
        or min(min(p) for p in pads) < 0
    ):
        ctx.unsupported(f"strides {list(strides)}, dilations {list(dilations)}, pads {list(pads)}")
    blocks = [
        (n + b + a - d * (kk - 1) - 1) // s + 1
        for n, (b, a), d, kk, s in zip(image, pads, dilations, block, strides, strict=True)
    ]
    if min(blocks) < 1 or xs[2] != Size(math.prod(blocks)):
        ctx.unsupported(f"{xs[2]} blocks, expected {blocks} for image {image}")
    channels = xs[1] // k
    y = g.view(x, Shape.of(xs[0], xs[1], *blocks))
    for i in range(nd):
        y = _zero_insert(ctx, y, 2 + i, strides[i])
    full = []
    for n, (b, a), d, kk, s, nb in zip(image, pads, dilations, block, strides, blocks, strict=True):
        natural = s * (nb - 1) + d * (kk - 1) + 1 - b - a
        full.append((d * (kk - 1) - b, d * (kk - 1) - a + (n - natural)))
    y = g.pad(y, [(0, 0), (0, 0), *full])
    c = channels.as_int("Col2Im channels")
    onehot = np.zeros((c * k, 1, *block), g.dtype(x).np)
    for j in range(k):
        index: tuple[slice | int, ...] = (
            slice(j, None, k),
            0,
            *(int(i) for i in np.unravel_index(j, block)),
        )
        onehot[index] = 1
    w = _transposed_filter(ctx, g.constant(onehot), c)
    return g.conv(y, w, None, None, dilations, c)
