"""Dense neural-network ONNX ops: MatMul, Gemm, and the softmax family (Softmax, LogSoftmax,
Hardmax), whose opset < 13 forms flatten the input to 2-D around `axis`."""

from __future__ import annotations

from collections.abc import Callable

from kn_graph.dtype import DType
from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.ops import BinaryOp, ReduceOp, Value
from kn_graph.shape import Shape, Size

__all__ = ["along_axis", "gemm", "hardmax", "log_softmax", "matmul", "softmax"]


@onnx_op("MatMul")
def matmul(ctx: NodeContext) -> Result:
    return ctx.graph.matmul_nd(ctx.input(0), ctx.input(1))


@onnx_op("Gemm")
def gemm(ctx: NodeContext) -> Result:
    """Y = alpha · A' · B' + beta · C, A' and B' optionally transposed, C broadcast to Y."""
    g = ctx.graph
    a, b = ctx.input(0), ctx.input(1)
    if g[a].rank != 2 or g[b].rank != 2:
        ctx.unsupported(f"A and B must be matrices, found {g.shape(a)} and {g.shape(b)}")
    if ctx.attr_bool("transA", False):
        a = g.transpose(a)
    if ctx.attr_bool("transB", False):
        b = g.transpose(b)
    if ctx.opset < 7:
        ctx.ignore_attrs("broadcast")  # opset 6 broadcasting is a subset of NumPy's
    alpha = ctx.attr_float("alpha", 1.0)
    beta = ctx.attr_float("beta", 1.0)
    y = g.matmul_nd(a, b)
    if alpha != 1.0:
        y = g.mul(y, alpha)
    c = ctx.optional_input(2)
    if c is None or beta == 0.0:
        return y
    if beta != 1.0:
        c = g.mul(c, beta)
    out = g.add(y, c)
    if g.shape(out) != g.shape(y):
        ctx.unsupported(f"C {g.shape(c)} does not broadcast to the product {g.shape(y)}")
    return out


# -- softmax family ------------------------------------------------------------------------------
def along_axis(
    ctx: NodeContext,
    x: Value,
    f: Callable[[Value, int], Value],
    opset: int | None = None,
    axis: int | None = None,
) -> Value:
    """Apply f to x along the node's axis: one axis from opset 13, the flattened trailing axes
    before (x is coerced to 2-D [prod(:axis), prod(axis:)] and the result viewed back). `opset`
    is the node's own and `axis` its attribute (default 1 before opset 13, else -1) unless
    given: QLinearSoftmax names the Softmax opset it follows and defaults axis to -1."""
    g = ctx.graph
    shape = g.shape(x)
    opset = ctx.opset if opset is None else opset
    if axis is None:
        axis = ctx.attr_int("axis", -1 if opset >= 13 else 1)
    if opset >= 13:
        return f(x, ctx.axis(axis, shape.rank))
    axis = ctx.axis(axis, shape.rank) if shape.rank else 0
    flat = Shape.of(Shape(shape.dims[:axis]).size(), Shape(shape.dims[axis:]).size())
    return g.view(f(g.view(x, flat), 1), shape)


def _float_input(ctx: NodeContext) -> None:
    if not ctx.input_dtype(0).is_float:
        ctx.unsupported(f"expected a float input, found {ctx.input_dtype(0)}")


@onnx_op("Softmax")
def softmax(ctx: NodeContext) -> Result:
    _float_input(ctx)
    return along_axis(ctx, ctx.input(0), ctx.graph.softmax)


@onnx_op("LogSoftmax")
def log_softmax(ctx: NodeContext) -> Result:
    """x - max - log sum exp(x - max): stays finite where log(softmax) would underflow to -inf."""
    _float_input(ctx)
    g = ctx.graph

    def f(x: Value, axis: int) -> Value:
        shifted = g.sub(x, g.reduce(x, [axis], ReduceOp.MAX, keepdims=True))
        total = g.reduce(g.exp(shifted), [axis], ReduceOp.SUM, keepdims=True)
        return g.sub(shifted, g.log(total))

    return along_axis(ctx, ctx.input(0), f)


@onnx_op("Hardmax")
def hardmax(ctx: NodeContext) -> Result:
    """1 at the first maximum along the axis, 0 elsewhere."""
    g = ctx.graph
    dtype = ctx.input_dtype(0)

    def f(x: Value, axis: int) -> Value:
        if g.shape(x)[axis] == Size(0):  # no maximum to mark: the empty result
            return g.full(0, g.shape(x), dtype)
        arg = g.reduce(x, [axis], ReduceOp.ARGMAX, keepdims=True)
        hit = g.binary(BinaryOp.EQ, g.iota(g.shape(x), axis, DType.I64), arg)
        return g.cast(hit, dtype)

    return along_axis(ctx, ctx.input(0), f)
