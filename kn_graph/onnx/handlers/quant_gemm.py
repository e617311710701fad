"""Integer GEMM and convolution: MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv and
onnxruntime's QGemm, MatMulIntegerToFloat and DynamicQuantizeMatMul, lowered to the IR's
IntMatMul / IntConv (int32 accumulation, explicit zero points) and elementwise scaling.

Requantization follows onnxruntime's CPU kernels (MLAS `MlasRequantizeOutput`): the multiplier
a_scale·b_scale/y_scale is computed in float32, the int32 accumulator (plus an int32 bias) is
converted to float32 and multiplied by it, rounded half to even, shifted by the output zero point
and saturated. The ONNX reference computes the same in float64 when it dequantizes first; the two
can differ by one unit where a product lands on a rounding boundary (tests allow that unit and
say why).
"""

from __future__ import annotations

from kn_graph.dtype import DType
from kn_graph.graph import Graph
from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.quant import _saturate, dynamic_quantize
from kn_graph.onnx.handlers.spatial import read_window
from kn_graph.ops import UnaryOp, Value
from kn_graph.shape import Shape, Size

__all__ = [
    "conv_integer",
    "dynamic_quantize_matmul",
    "matmul_integer",
    "matmul_integer_to_float",
    "qgemm",
    "qlinear_conv",
    "qlinear_matmul",
]

_INT8 = (DType.U8, DType.I8)


def _int8_input(ctx: NodeContext, i: int, what: str) -> Value:
    x = ctx.input(i)
    if ctx.graph.dtype(x) not in _INT8:
        ctx.unsupported(f"{what} (input {i}) must be uint8 or int8, found {ctx.graph.dtype(x)}")
    return x


def _zero_point(ctx: NodeContext, i: int, like: Value, what: str) -> Value:
    """Zero point input i (absent: 0) with the dtype of the operand it belongs to."""
    g = ctx.graph
    dt = g.dtype(like)
    if not ctx.has_input(i):
        return g.scalar(0, dt)
    z = ctx.input(i)
    if g.dtype(z) != dt:
        ctx.unsupported(f"{what} (input {i}) must be {dt} like its operand, found {g.dtype(z)}")
    return z


def _vector(ctx: NodeContext, v: Value, n: Size, what: str) -> Value:
    """A per-tensor or per-channel parameter as a scalar [] or a vector [n] (any shape holding
    one value, or n values along one axis, e.g. [D, M, 1] per row)."""
    g = ctx.graph
    shape = g.shape(v)
    size = shape.size()
    if size == Size(1):
        return g.view(v, Shape.of())
    if size == n and sum(d != Size(1) for d in shape.dims) == 1:
        return g.view(v, Shape.of(n))
    ctx.unsupported(f"{what} must be a scalar or hold {n} values along one axis, found {shape}")


def _matmul_zero(ctx: NodeContext, i: int, x: Value, axis: int, what: str) -> Value:
    z = _zero_point(ctx, i, x, what)
    shape = ctx.graph.shape(x)
    n = shape[axis] if shape.rank >= 2 else Size(1)
    return _vector(ctx, z, n, what)


def _f32(g: Graph, v: Value) -> Value:
    return g.cast(v, DType.F32)


def requantize(
    g: Graph, acc: Value, multiplier: Value, zero: Value, channel_axis: int | None
) -> Value:
    """saturate(round(f32(acc) · multiplier) + zero) in the zero point's dtype; a vector
    multiplier applies along `channel_axis` of acc."""
    m = _along(g, multiplier, g[acc].rank, channel_axis)
    q = g.unary(UnaryOp.ROUND, g.mul(_f32(g, acc), m))
    return _saturate(g, g.add(q, _f32(g, zero)), g.dtype(zero))


def _along(g: Graph, v: Value, rank: int, axis: int | None) -> Value:
    """A scalar, or a vector placed on `axis` of a rank-`rank` tensor (for broadcasting)."""
    if g[v].rank != 1 or axis is None:
        return v  # a scalar, or already placed
    axis %= rank
    return g.view(v, Shape.of(*[g.shape(v)[0] if a == axis else 1 for a in range(rank)]))


def _scale(ctx: NodeContext, i: int, n: Size, what: str) -> Value:
    s = ctx.input(i)
    if not ctx.graph.dtype(s).is_float:
        ctx.unsupported(f"{what} (input {i}) must be a float, found {ctx.graph.dtype(s)}")
    return _vector(ctx, _f32(ctx.graph, s), n, what)  # onnxruntime scales in float32


# -- matrix products ---------------------------------------------------------------------------
@onnx_op("MatMulInteger")
def matmul_integer(ctx: NodeContext) -> Result:
    """int32 (A - a_zero) @ (B - b_zero), NumPy's rank rules; zero points per tensor, per row of
    A or per column of B."""
    g = ctx.graph
    a, b = _int8_input(ctx, 0, "A"), _int8_input(ctx, 1, "B")
    za = _matmul_zero(ctx, 2, a, -2, "a_zero_point")
    zb = _matmul_zero(ctx, 3, b, -1, "b_zero_point")
    return g.int_matmul_nd(a, b, za, zb)


def _columns(ctx: NodeContext, b: Value) -> Size:
    shape = ctx.graph.shape(b)
    return shape[-1] if shape.rank >= 2 else Size(1)


def _rows(ctx: NodeContext, a: Value) -> Size:
    shape = ctx.graph.shape(a)
    return shape[-2] if shape.rank >= 2 else Size(1)


@onnx_op("QLinearMatMul")
def qlinear_matmul(ctx: NodeContext) -> Result:
    """Requantized (a - a_zero) @ (b - b_zero): scales and zero points per tensor, per row of a
    or per column of b."""
    g = ctx.graph
    a, b = _int8_input(ctx, 0, "a"), _int8_input(ctx, 3, "b")
    m, n = _rows(ctx, a), _columns(ctx, b)
    za = _vector(ctx, _zero_point(ctx, 2, a, "a_zero_point"), m, "a_zero_point")
    zb = _vector(ctx, _zero_point(ctx, 5, b, "b_zero_point"), n, "b_zero_point")
    acc = g.int_matmul_nd(a, b, za, zb)
    sa, sb = _scale(ctx, 1, m, "a_scale"), _scale(ctx, 4, n, "b_scale")
    sy = _scale(ctx, 6, Size(1), "y_scale")
    zy = _zero_point(ctx, 7, ctx.input(7), "y_zero_point")
    if g.dtype(zy) not in _INT8:
        ctx.unsupported(f"y_zero_point must be uint8 or int8, found {g.dtype(zy)}")
    zy = _vector(ctx, zy, Size(1), "y_zero_point")
    rank = g[acc].rank
    rows = _along(g, sa, rank, -2 if rank >= 2 else None)
    return requantize(g, acc, g.div(g.mul(rows, _along(g, sb, rank, -1)), sy), zy, None)


@onnx_op("MatMulIntegerToFloat", domain="com.microsoft")
def matmul_integer_to_float(ctx: NodeContext) -> Result:
    """f32(A - a_zero) @ (B - b_zero) · a_scale · b_scale + bias (scales per tensor or per
    column)."""
    g = ctx.graph
    a, b = _int8_input(ctx, 0, "A"), _int8_input(ctx, 1, "B")
    n = _columns(ctx, b)
    za = _matmul_zero(ctx, 4, a, -2, "a_zero_point")
    if g[za].rank:
        ctx.unsupported("a per-column a_zero_point (onnxruntime takes a scalar only)")
    zb = _matmul_zero(ctx, 5, b, -1, "b_zero_point")
    acc = g.int_matmul_nd(a, b, za, zb)
    return _scaled(ctx, acc, [_scale(ctx, 2, n, "a_scale"), _scale(ctx, 3, n, "b_scale")], 6)


def _scaled(ctx: NodeContext, acc: Value, scales: list[Value], bias: int) -> Value:
    """f32(acc) times each scale (scalar or per column) plus the optional float bias [N]."""
    g = ctx.graph
    y = _f32(g, acc)
    rank = g[y].rank
    mult = scales[0]
    for s in scales[1:]:
        mult = g.mul(_along(g, mult, rank, -1), _along(g, s, rank, -1))
    y = g.mul(y, _along(g, mult, rank, -1))
    if ctx.has_input(bias):
        y = g.add(y, ctx.input(bias))
    return y


@onnx_op("DynamicQuantizeMatMul", domain="com.microsoft")
def dynamic_quantize_matmul(ctx: NodeContext) -> Result:
    """A quantized to uint8 over its range (as DynamicQuantizeLinear), then the integer product
    with B and the scales: onnxruntime's kernel, step by step."""
    g = ctx.graph
    a = ctx.input(0)
    if g.dtype(a) != DType.F32:
        ctx.unsupported(f"A must be float32, found {g.dtype(a)}")
    b = _int8_input(ctx, 1, "B")
    n = _columns(ctx, b)
    qa, sa, za = dynamic_quantize(g, a)
    zb = _matmul_zero(ctx, 3, b, -1, "b_zero_point")
    acc = g.int_matmul_nd(qa, b, za, zb)
    return _scaled(ctx, acc, [sa, _scale(ctx, 2, n, "b_scale")], 4)


@onnx_op("QGemm", domain="com.microsoft")
def qgemm(ctx: NodeContext) -> Result:
    """alpha·a_scale·b_scale·(op(A) - a_zero)(op(B) - b_zero) + C·(a_scale·b_scale) in float
    (no y_scale) or requantized to y's zero point's type; C is an int32 bias quantized with
    scale alpha·a_scale·b_scale (onnxruntime adds it to the accumulator)."""
    g = ctx.graph
    a, b = _int8_input(ctx, 0, "A"), _int8_input(ctx, 3, "B")
    for v, what in ((a, "A"), (b, "B")):
        if g[v].rank != 2:
            ctx.unsupported(f"{what} must be 2-d, found {g.shape(v)}")
    if ctx.attr_int("transA", 0):
        a = g.permute(a, (1, 0))
    if ctx.attr_int("transB", 0):
        b = g.permute(b, (1, 0))
    alpha = ctx.attr_float("alpha", 1.0)
    n = g.shape(b)[1]
    za = _vector(ctx, _zero_point(ctx, 2, a, "a_zero_point"), Size(1), "a_zero_point")
    zb = _vector(ctx, _zero_point(ctx, 5, b, "b_zero_point"), n, "b_zero_point")
    acc = g.int_matmul_nd(a, b, za, zb)
    if ctx.has_input(6):
        c = ctx.input(6)
        if g.dtype(c) != DType.I32:
            ctx.unsupported(f"C must be int32, found {g.dtype(c)}")
        acc = g.add(acc, c)
    sa, sb = _scale(ctx, 1, Size(1), "a_scale"), _scale(ctx, 4, n, "b_scale")
    mult = g.mul(g.mul(sa, alpha), sb)
    if not ctx.has_input(7):
        if ctx.has_input(8):
            ctx.unsupported("y_zero_point without y_scale")
        return g.mul(_f32(g, acc), _along(g, mult, 2, -1))
    sy = _scale(ctx, 7, Size(1), "y_scale")
    zy = _vector(ctx, ctx.input(8), Size(1), "y_zero_point") if ctx.has_input(8) else None
    if zy is None:
        zy = g.scalar(0, DType.U8)
    return requantize(g, acc, g.div(mult, sy), zy, -1)


# -- convolutions ------------------------------------------------------------------------------
def _int_conv(ctx: NodeContext, x: Value, w: Value, zx: Value, zw: Value) -> Value:
    """IntConv with ONNX's window attributes; asymmetric padding pads x with its zero point."""
    g = ctx.graph
    xs, ws = g.shape(x), g.shape(w)
    if xs.rank < 3 or ws.rank != xs.rank:
        ctx.unsupported(f"expected x [N,C,*spatial] and w of the same rank, found {xs} and {ws}")
    if not all(d.is_fixed for d in ws.dims[2:]):
        ctx.unsupported(f"the filter's spatial sizes must be fixed, found {ws}")
    kernel = ws.fixed_dims()[2:]
    declared = ctx.attr_ints("kernel_shape")
    if declared is not None and tuple(declared) != tuple(kernel):
        ctx.unsupported(f"kernel_shape {declared} differs from the filter's {list(kernel)}")
    win = read_window(ctx, xs.dims[2:], kernel)
    sym = tuple(min(b, a) for b, a in win.pads)
    extra = [(b - s, a - s) for (b, a), s in zip(win.pads, sym, strict=True)]
    if any(b or a for b, a in extra):
        pad_value = g.const_value(zx)
        if pad_value is None:
            ctx.unsupported("asymmetric padding with a zero point computed at run time")
        x = g.pad(x, [(0, 0), (0, 0), *extra], value=int(pad_value.reshape(-1)[0]))
    zx = _vector(ctx, zx, Size(1), "x_zero_point")
    zw = _vector(ctx, zw, ws[0], "w_zero_point")
    group = ctx.attr_int("group", 1)
    return g.int_conv(x, w, zx, zw, win.strides, sym, win.dilations, group)


@onnx_op("ConvInteger")
def conv_integer(ctx: NodeContext) -> Result:
    """int32 convolution of (x - x_zero) with (w - w_zero); w_zero per tensor or per filter."""
    x, w = _int8_input(ctx, 0, "x"), _int8_input(ctx, 1, "w")
    zx = _zero_point(ctx, 2, x, "x_zero_point")
    zw = _zero_point(ctx, 3, w, "w_zero_point")
    return _int_conv(ctx, x, w, zx, zw)


@onnx_op("QLinearConv")
def qlinear_conv(ctx: NodeContext) -> Result:
    """Requantized integer convolution plus an int32 bias [K] (scale x_scale·w_scale, zero 0);
    w's scale and zero point per tensor or per filter."""
    g = ctx.graph
    if ctx.attr_int("channels_last", 0):
        ctx.unsupported("channels_last=1 (onnxruntime's NHWC layout)")
    x, w = _int8_input(ctx, 0, "x"), _int8_input(ctx, 3, "w")
    zx = _zero_point(ctx, 2, x, "x_zero_point")
    zw = _zero_point(ctx, 5, w, "w_zero_point")
    acc = _int_conv(ctx, x, w, zx, zw)
    k = g.shape(w)[0]
    if ctx.has_input(8):
        bias = ctx.input(8)
        if g.dtype(bias) != DType.I32 or g.shape(bias).size() != k:
            ctx.unsupported(f"B must be int32 [{k}], found {g.dtype(bias)} {g.shape(bias)}")
        acc = g.add(acc, _along(g, g.view(bias, Shape.of(k)), g[acc].rank, 1))
    sx, sw = _scale(ctx, 1, Size(1), "x_scale"), _scale(ctx, 4, k, "w_scale")
    sy = _scale(ctx, 6, Size(1), "y_scale")
    zy = ctx.input(7)
    if g.dtype(zy) not in _INT8:
        ctx.unsupported(f"y_zero_point must be uint8 or int8, found {g.dtype(zy)}")
    zy = _vector(ctx, zy, Size(1), "y_zero_point")
    return requantize(g, acc, g.div(g.mul(sx, sw), sy), zy, 1)


onnx_op("QLinearConv", domain="com.microsoft")(qlinear_conv)
