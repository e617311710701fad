"""onnxruntime's quantized element and data operators (com.microsoft domain, the "QOperator"
format of its quantization tools), each lowered to dequantize → the float op → quantize, with
quant.py's `dequantized`/`quantized`; the integer GEMM and convolution ops live elsewhere.

Every op here takes per-tensor parameters: an f32 scale and a zero point of the data's type
(uint8 or int8), each a scalar or a 1-element vector. The float path is what the operators'
specifications state. onnxruntime's CPU kernels (onnxruntime/contrib_ops/cpu/quantization and
MLAS) round some of them differently, by at most one unit of the quantized output:

- QLinearConcat, QLinearWhere, QLinearLeakyRelu and contrib QuantizeLinear/DequantizeLinear:
  a 256-entry table of dequantize (f32 scale · (x - zp)) → f(x) → MlasQuantizeLinear (round half
  to even of y / scale, then + zp, saturate): exactly our composition.
- QLinearSigmoid: the same table, but sigmoid is MlasComputeLogistic, a polynomial approximation
  a few float ulps from 1 / (1 + exp(-x)): a value near a rounding tie may land one unit over.
- QLinearAdd: MLAS adds in fixed point or with the scale ratios a/c, b/c folded into one
  multiply-add (qladd.h); QLinearMul multiplies the integer product (a - za)(b - zb) by
  a_scale · b_scale / c_scale. Both round the float result differently from
  round((deq a ∘ deq b) / c_scale): one unit at most.
- QLinearSoftmax: a lookup table of exp((x - 255 + shift) · x_scale), summed in float, and
  round(e · floor(1 / y_scale) / sum) + zp: floor(1 / y_scale) instead of 1 / y_scale moves the
  result by less than one unit. Its int8 kernel also wraps an output of 128 to -128 (a row
  with one dominant element); we saturate to 127, as the specification's quantize does.
- QLinearAveragePool rounds y / scale + zp (with ties to even after adding an odd zero point
  moving the result), QLinearGlobalAveragePool requantizes the integer sum in MLAS: one unit.
- QLinearReduceMean has no CPU kernel in onnxruntime; its specification is our composition.
"""

from __future__ import annotations

from collections.abc import Callable

from kn_graph.dtype import DType
from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.nn import along_axis
from kn_graph.onnx.handlers.quant import dequantize_node, dequantized, quantize_node, quantized
from kn_graph.onnx.handlers.spatial import kernel_attr, read_window
from kn_graph.ops import BinaryOp, ReduceOp, UnaryOp, Value
from kn_graph.shape import Shape, Size

__all__ = [
    "qlinear_activation",
    "qlinear_average_pool",
    "qlinear_binary",
    "qlinear_concat",
    "qlinear_global_average_pool",
    "qlinear_reduce_mean",
    "qlinear_softmax",
    "qlinear_where",
]

_EIGHT_BIT = (DType.U8, DType.I8)
"""The data types of onnxruntime's QLinear* kernels."""

_MS = "com.microsoft"


def _scalar(ctx: NodeContext, i: int, what: str) -> Value:
    """Input i, a per-tensor parameter: a scalar or a 1-element vector, as a scalar."""
    g = ctx.graph
    v = ctx.input(i)
    shape = g.shape(v)
    if shape.rank > 1 or shape.size() != Size(1):
        ctx.unsupported(
            f"{what} (input {i}) must be a scalar or a 1-element vector (per-tensor "
            f"quantization), found shape {shape}"
        )
    return g.view(v, Shape.of()) if shape.rank else v


def _scale(ctx: NodeContext, i: int) -> Value:
    s = _scalar(ctx, i, "scale")
    if ctx.graph.dtype(s) != DType.F32:
        ctx.unsupported(f"scale (input {i}) must be f32, found {ctx.graph.dtype(s)}")
    return s


def _zero_point(ctx: NodeContext, i: int, dt: DType) -> Value | None:
    """The zero point at input i (absent: 0), which must have the quantized data's type."""
    if not ctx.has_input(i):
        return None
    zp = _scalar(ctx, i, "zero point")
    if ctx.graph.dtype(zp) != dt:
        ctx.unsupported(
            f"zero point (input {i}) of type {ctx.graph.dtype(zp)} for {dt} data; "
            "they must have the same type"
        )
    return zp


def _data(ctx: NodeContext, i: int, dt: DType | None = None) -> Value:
    """Quantized data at input i: uint8 or int8, and of type `dt` when given."""
    x = ctx.input(i)
    found = ctx.graph.dtype(x)
    if found not in _EIGHT_BIT or (dt is not None and found != dt):
        want = dt or "uint8 or int8"
        ctx.unsupported(f"input {i} must be {want} quantized data, found {found}")
    return x


def _dequant(ctx: NodeContext, i: int, dt: DType | None = None) -> Value:
    """Input i (data), i + 1 (scale) and i + 2 (zero point) dequantized to f32."""
    x = _data(ctx, i, dt)
    xt = ctx.graph.dtype(x)
    return dequantized(ctx.graph, x, _scale(ctx, i + 1), _zero_point(ctx, i + 2, xt))


def _requant(ctx: NodeContext, y: Value, i: int, dt: DType) -> Value:
    """y quantized with the scale at input i and the zero point at input i + 1, as `dt`."""
    g = ctx.graph
    return quantized(g, y, _scale(ctx, i), _zero_point(ctx, i + 1, dt), dt, DType.F32)


_BINARY = {"QLinearAdd": BinaryOp.ADD, "QLinearMul": BinaryOp.MUL}


@onnx_op(*_BINARY, domain=_MS)
def qlinear_binary(ctx: NodeContext) -> Result:
    """C = quantize(deq(A) ∘ deq(B)), broadcast as NumPy does; A and B of one type.
    Inputs: A, A_scale, A_zp, B, B_scale, B_zp, C_scale, C_zp."""
    a = _dequant(ctx, 0)
    dt = ctx.input_dtype(0)
    b = _dequant(ctx, 3, dt)
    return _requant(ctx, ctx.graph.binary(_BINARY[ctx.op_type], a, b), 6, dt)


def _leaky(ctx: NodeContext) -> Callable[[Value], Value]:
    g, alpha = ctx.graph, ctx.attr_float("alpha", 0.01)
    return lambda x: g.select(g.binary(BinaryOp.GE, x, 0.0), x, g.mul(x, alpha))


def _sigmoid(ctx: NodeContext) -> Callable[[Value], Value]:
    return lambda x: ctx.graph.unary(UnaryOp.SIGMOID, x)


_ACTIVATIONS = {"QLinearLeakyRelu": _leaky, "QLinearSigmoid": _sigmoid}


@onnx_op(*_ACTIVATIONS, domain=_MS)
def qlinear_activation(ctx: NodeContext) -> Result:
    """Y = quantize(f(deq(X))): X, X_scale, X_zp, Y_scale, Y_zp; LeakyRelu reads alpha."""
    f = _ACTIVATIONS[ctx.op_type](ctx)
    return _requant(ctx, f(_dequant(ctx, 0)), 3, ctx.input_dtype(0))


@onnx_op("QLinearSoftmax", domain=_MS)
def qlinear_softmax(ctx: NodeContext) -> Result:
    """Y = quantize(softmax(deq(X))) along `axis`, with the axis rule of Softmax at the
    `opset` attribute (before 13: the trailing axes from `axis` flattened). The schema's
    default axis is -1 at every opset (onnxruntime reads it so), not Softmax-12's 1."""
    opset = ctx.attr_int("opset")
    x = _dequant(ctx, 0)
    if not ctx.has_input(4):
        ctx.unsupported("y_zero_point (input 4) is required")
    y = along_axis(ctx, x, ctx.graph.softmax, opset, ctx.attr_int("axis", -1))
    return _requant(ctx, y, 3, ctx.input_dtype(0))


@onnx_op("QLinearConcat", domain=_MS)
def qlinear_concat(ctx: NodeContext) -> Result:
    """Y = concat(deq(X_k) for each (X_k, scale_k, zp_k)) requantized with (Y_scale, Y_zp),
    the first two inputs; every X_k has the type of Y_zp."""
    if ctx.num_inputs < 5 or (ctx.num_inputs - 2) % 3:
        ctx.unsupported(
            f"expected Y_scale, Y_zero_point and (tensor, scale, zero point) triples, found "
            f"{ctx.num_inputs} inputs"
        )
    if not ctx.has_input(1):
        ctx.unsupported("Y_zero_point (input 1) is required")
    dt = ctx.input_dtype(1)
    if dt not in _EIGHT_BIT:
        ctx.unsupported(f"Y_zero_point must be uint8 or int8, found {dt}")
    parts = [_dequant(ctx, i, dt) for i in range(2, ctx.num_inputs, 3)]
    g = ctx.graph
    axis = ctx.axis(ctx.attr_int("axis"), g[parts[0]].rank)
    return _requant(ctx, g.concat(parts, axis), 0, dt)


def _channels_first(ctx: NodeContext, x: Value, channels_last: bool) -> Value:
    """x as [N, C, *spatial] (from [N, *spatial, C] when channels_last)."""
    rank = ctx.graph[x].rank
    if rank < 3:
        ctx.unsupported(f"expected an input of rank 3 or more, found {ctx.graph.shape(x)}")
    if not channels_last:
        return x
    return ctx.graph.permute(x, [0, rank - 1, *range(1, rank - 1)])


def _channels_back(ctx: NodeContext, y: Value, channels_last: bool) -> Value:
    rank = ctx.graph[y].rank
    return ctx.graph.permute(y, [0, *range(2, rank), 1]) if channels_last else y


@onnx_op("QLinearAveragePool", domain=_MS)
def qlinear_average_pool(ctx: NodeContext) -> Result:
    """AveragePool of deq(X) (no dilations; NHWC with channels_last), requantized.
    Inputs: X, x_scale, x_zp, y_scale, y_zp."""
    g = ctx.graph
    last = ctx.attr_bool("channels_last", False)
    x = _channels_first(ctx, _dequant(ctx, 0), last)
    spatial = g.shape(x).dims[2:]
    kernel = kernel_attr(ctx, len(spatial), required=True)
    assert kernel is not None
    win = read_window(ctx, spatial, kernel, allow_dilations=False)
    y = g.pool(
        x,
        "avg",
        win.kernel,
        win.strides,
        win.pads,
        win.dilations,
        ctx.attr_bool("ceil_mode", False),
        ctx.attr_bool("count_include_pad", False),
    )
    return _requant(ctx, _channels_back(ctx, y, last), 3, ctx.input_dtype(0))


@onnx_op("QLinearGlobalAveragePool", domain=_MS)
def qlinear_global_average_pool(ctx: NodeContext) -> Result:
    """The mean of deq(X) over the spatial axes (kept as 1s), requantized; NHWC with
    channels_last. Inputs: X, x_scale, x_zp, y_scale, y_zp."""
    last = ctx.attr_bool("channels_last", False)
    x = _channels_first(ctx, _dequant(ctx, 0), last)
    y = _channels_back(ctx, ctx.graph.global_pool(x, "avg"), last)
    return _requant(ctx, y, 3, ctx.input_dtype(0))


@onnx_op("QLinearReduceMean", domain=_MS)
def qlinear_reduce_mean(ctx: NodeContext) -> Result:
    """The mean of deq(data) over `axes` (both attributes required), requantized.
    Inputs: data, data_scale, data_zp, reduced_scale, reduced_zp."""
    g = ctx.graph
    x = _dequant(ctx, 0)
    axes = ctx.attr_ints("axes")
    if axes is None:
        ctx.unsupported("attribute 'axes' is required")
    keep = ctx.attr_bool("keepdims", True)
    y = g.reduce(x, [ctx.axis(a, g[x].rank) for a in axes], ReduceOp.MEAN, keepdims=keep)
    return _requant(ctx, y, 3, ctx.input_dtype(0))


@onnx_op("QLinearWhere", domain=_MS)
def qlinear_where(ctx: NodeContext) -> Result:
    """Z = where(condition, X, Y), X and Y requantized to (z_scale, z_zp); broadcast.
    Inputs: condition, X, x_scale, x_zp, Y, y_scale, y_zp, z_scale, z_zp."""
    g = ctx.graph
    cond = ctx.input(0)
    if g.dtype(cond) != DType.BOOL:
        ctx.unsupported(f"condition must be bool, found {g.dtype(cond)}")
    x = _dequant(ctx, 1)
    dt = ctx.input_dtype(1)
    y = _dequant(ctx, 4, dt)
    return _requant(ctx, g.select(cond, x, y), 7, dt)  # quantizing commutes with selecting


@onnx_op("QuantizeLinear", domain=_MS)
def contrib_quantize_linear(ctx: NodeContext) -> Result:
    """onnxruntime's QuantizeLinear: ONNX's (opset 13) per tensor or per `axis`, no blocks."""
    return quantize_node(ctx, ctx.attr_int("axis", 1), 0, None)


@onnx_op("DequantizeLinear", domain=_MS)
def contrib_dequantize_linear(ctx: NodeContext) -> Result:
    """onnxruntime's DequantizeLinear: ONNX's (opset 13) per tensor or per `axis`."""
    return dequantize_node(ctx, ctx.attr_int("axis", 1), 0, None)
