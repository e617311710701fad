"""onnxruntime's fused activations and bias additions (com.microsoft): FastGelu, BiasGelu, Gelu,
QuickGelu, BiasAdd, BiasSplitGelu and BiasDropout at inference. Each is a few IR element ops,
which the backends fuse again."""

from __future__ import annotations

from kn_graph.dtype import DType
from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.norm import float_input, wants_output
from kn_graph.ops import UnaryOp, Value

__all__ = [
    "bias_add",
    "bias_dropout",
    "bias_gelu",
    "bias_split_gelu",
    "fast_gelu",
    "gelu",
    "quick_gelu",
]

QUICK_GELU_ALPHA = 1.702
"""onnxruntime's default alpha of QuickGelu (x · sigmoid(1.702 x) approximates GELU)."""


def _plus_bias(ctx: NodeContext, x: Value, i: int) -> Value:
    """x + input i, a bias over the last axis (or of x's own shape); it must not widen x."""
    g = ctx.graph
    bias = ctx.input(i)
    if g.dtype(bias) != g.dtype(x):
        ctx.unsupported(f"bias (input {i}) of type {g.dtype(bias)} for an input of {g.dtype(x)}")
    y = g.add(x, bias)
    if g.shape(y) != g.shape(x):
        ctx.unsupported(f"bias {g.shape(bias)} does not broadcast to the input {g.shape(x)}")
    return y


@onnx_op("FastGelu", domain="com.microsoft")
def fast_gelu(ctx: NodeContext) -> Result:
    """The tanh approximation of GELU of x (+ bias)."""
    x = float_input(ctx)
    if ctx.has_input(1):
        x = _plus_bias(ctx, x, 1)
    return ctx.graph.gelu(x, "tanh")


@onnx_op("BiasGelu", domain="com.microsoft")
def bias_gelu(ctx: NodeContext) -> Result:
    """The exact (erf) GELU of x + bias."""
    return ctx.graph.gelu(_plus_bias(ctx, float_input(ctx), 1))


@onnx_op("Gelu", domain="com.microsoft")
def gelu(ctx: NodeContext) -> Result:
    """The exact (erf) GELU, onnxruntime's op from before ONNX had one."""
    return ctx.graph.gelu(float_input(ctx))


@onnx_op("QuickGelu", domain="com.microsoft")
def quick_gelu(ctx: NodeContext) -> Result:
    """x · sigmoid(alpha · x)."""
    g = ctx.graph
    x = float_input(ctx)
    alpha = ctx.attr_float("alpha", QUICK_GELU_ALPHA)
    return g.mul(x, g.unary(UnaryOp.SIGMOID, g.mul(x, alpha)))


@onnx_op("BiasAdd", domain="com.microsoft")
def bias_add(ctx: NodeContext) -> Result:
    """x + bias + skip (x and skip [N, S, C], bias [C])."""
    g = ctx.graph
    x = _plus_bias(ctx, float_input(ctx), 1)
    skip = ctx.input(2)
    if g.shape(skip) != g.shape(x) or g.dtype(skip) != g.dtype(x):
        ctx.unsupported(f"skip {g.dtype(skip)}{g.shape(skip)} must match the input {g.shape(x)}")
    return g.add(x, skip)


@onnx_op("BiasSplitGelu", domain="com.microsoft")
def bias_split_gelu(ctx: NodeContext) -> Result:
    """(x + bias) split in halves along the last axis: left · GELU(right)."""
    g = ctx.graph
    x = _plus_bias(ctx, float_input(ctx), 1)
    last = g[x].rank - 1
    d = g.shape(x)[last]
    if not d.is_fixed or d.as_int() % 2:
        ctx.unsupported(f"the last axis {d} must have an even, fixed size")
    half = d.as_int() // 2
    return g.mul(g.slice(x, last, 0, half), g.gelu(g.slice(x, last, half, 2 * half)))


@onnx_op("BiasDropout", domain="com.microsoft")
def bias_dropout(ctx: NodeContext) -> list[Result | None]:
    """Inference only: data + bias (+ residual), nothing dropped and a mask of ones. The ratio is
    then ignored, as in Dropout; training_mode must be absent or a load-time false."""
    g = ctx.graph
    ctx.ignore_attrs("seed")
    if ctx.has_input(4):
        mode = ctx.input_static(4, "training_mode")
        if mode.size != 1 or bool(mode.reshape(-1)[0]):
            ctx.unsupported(f"training_mode {mode.tolist()} (only inference is supported)")
    if ctx.has_input(3):
        ctx.input(3)  # the ratio: unused at inference
    y = _plus_bias(ctx, float_input(ctx), 1)
    if ctx.has_input(2):
        residual = ctx.input(2)
        if g.shape(residual) != g.shape(y) or g.dtype(residual) != g.dtype(y):
            ctx.unsupported(f"residual {g.shape(residual)} must match the input {g.shape(y)}")
        y = g.add(y, residual)
    mask = None
    if wants_output(ctx, 1):
        mask = g.full(True, g.shape(y), DType.BOOL)
    return [y, mask]
