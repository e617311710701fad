"""Geometry shared by the convolution and pooling handlers: kernel/stride/dilation attributes and
ONNX padding (explicit `pads` or `auto_pad`), resolved to one (before, after) pair per axis."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kn_graph.errors import GraphError
from kn_graph.onnx.context import NodeContext
from kn_graph.shape import Size

__all__ = ["Window", "read_window", "same_padding", "split_pads"]


@dataclass(frozen=True, slots=True)
class Window:
    """A sliding window over `len(kernel)` trailing axes, with padding resolved per axis."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]

    @property
    def rank(self) -> int:
        return len(self.kernel)

    @property
    def symmetric(self) -> bool:
        return all(b == a for b, a in self.pads)


def _ints(ctx: NodeContext, name: str, nd: int, default: int) -> tuple[int, ...]:
    values = ctx.attr_ints(name, [default] * nd)
    assert values is not None
    if len(values) != nd:
        ctx.unsupported(f"attribute '{name}' has {len(values)} entries, expected {nd}")
    if any(v < 1 for v in values):
        ctx.unsupported(f"attribute '{name}' must be positive, found {values}")
    return tuple(values)


def split_pads(ctx: NodeContext, pads: Sequence[int], nd: int) -> tuple[tuple[int, int], ...]:
    """ONNX lists all begins, then all ends: [x1_begin, x2_begin, …, x1_end, x2_end, …]."""
    if len(pads) != 2 * nd:
        ctx.unsupported(f"'pads' has {len(pads)} entries, expected {2 * nd}")
    return tuple((int(pads[i]), int(pads[nd + i])) for i in range(nd))


def same_padding(
    ctx: NodeContext, size: Size, kernel: int, stride: int, dilation: int, upper: bool
) -> tuple[int, int]:
    """SAME_UPPER / SAME_LOWER: the output size is ceil(size / stride); the odd pixel of padding
    goes at the end (upper) or at the beginning (lower)."""
    span = (kernel - 1) * dilation + 1
    n = size.fixed_value()
    if n is not None:
        out = -(-n // stride)
        total = max(0, (out - 1) * stride + span - n)
    else:
        try:
            divisible = size % stride == Size(0)
        except GraphError:
            divisible = False
        if not divisible:
            ctx.needs_fixed_sizes(f"auto_pad SAME on symbolic size {size} with stride {stride}")
        total = max(0, span - stride)
    small, large = total // 2, total - total // 2
    return (small, large) if upper else (large, small)


def read_window(
    ctx: NodeContext, sizes: Sequence[Size], kernel: Sequence[int], *, allow_dilations: bool = True
) -> Window:
    """Read strides, dilations, pads and auto_pad for a window of shape `kernel` over `sizes`."""
    nd = len(kernel)
    strides = _ints(ctx, "strides", nd, 1)
    dilations = _ints(ctx, "dilations", nd, 1) if allow_dilations else (1,) * nd
    auto_pad = ctx.attr_str("auto_pad", "NOTSET")
    pads = ctx.attr_ints("pads")
    match auto_pad:
        case "NOTSET":
            pairs = split_pads(ctx, pads, nd) if pads is not None else ((0, 0),) * nd
            if any(b < 0 or a < 0 for b, a in pairs):
                ctx.unsupported(f"negative pads {pads}")
        case "VALID":
            pairs = ((0, 0),) * nd
        case "SAME_UPPER" | "SAME_LOWER":
            if any(d != 1 for d in dilations):
                # onnxruntime and the ONNX reference disagree on the padding (or refuse)
                ctx.unsupported(f"auto_pad {auto_pad} with dilations {list(dilations)}")
            pairs = tuple(
                same_padding(
                    ctx, sizes[i], kernel[i], strides[i], dilations[i], auto_pad == "SAME_UPPER"
                )
                for i in range(nd)
            )
        case _:
            ctx.unsupported(f"auto_pad '{auto_pad}'")
    return Window(tuple(kernel), strides, dilations, pairs)


def kernel_attr(ctx: NodeContext, nd: int, required: bool) -> tuple[int, ...] | None:
    """The kernel_shape attribute, checked for length and positivity."""
    k = ctx.attr_ints("kernel_shape")
    if k is None:
        if required:
            ctx.unsupported("attribute 'kernel_shape' is required")
        return None
    if len(k) != nd or any(v < 1 for v in k):
        ctx.unsupported(f"kernel_shape {k} does not fit {nd} spatial axes")
    return tuple(k)
