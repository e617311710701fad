"""Linear quantization: QuantizeLinear, DequantizeLinear and DynamicQuantizeLinear, per tensor, per
axis and blocked, for the integer types the IR has (8- and 16-bit; 32-bit for dequantizing).

They are elementwise compositions (divide, round half to even, add the zero point, clamp, cast),
so they fuse into the surrounding kernels; float8/int4/int2 types are refused by the loader's
type mapping.
"""

from __future__ import annotations

import numpy as np

from kn_graph.dtype import DType
from kn_graph.errors import UnsupportedOnnxError
from kn_graph.graph import Graph
from kn_graph.onnx.context import NodeContext, Result, onnx_dtype, onnx_op
from kn_graph.ops import BinaryOp, ReduceOp, UnaryOp, Value
from kn_graph.shape import Shape, Size

__all__ = [
    "dequantize_node",
    "dequantized",
    "quantize_node",
    "quantized",
]

_QUANTIZED = (DType.U8, DType.I8, DType.U16, DType.I16)
"""Targets of QuantizeLinear; DequantizeLinear also reads int32 (e.g. quantized biases)."""


def _range(dt: DType) -> tuple[int, int]:
    info = np.iinfo(dt.np)
    return int(info.min), int(info.max)


def _param(ctx: NodeContext, i: int, x_shape: Shape, axis: int, block: int) -> Value:
    """Scale or zero point made broadcastable to x: a scalar (or one element), a vector along
    `axis`, or with block_size > 0 one value per block of `block` elements along `axis`."""
    g = ctx.graph
    p = ctx.input(i)
    shape = g.shape(p)
    if shape.rank == 0:
        return p
    if shape.size() == Size(1):
        return g.view(p, Shape.of())
    if x_shape.rank == 0:
        ctx.unsupported(f"input {i} of shape {shape} for a scalar input")
    axis = ctx.axis(axis, x_shape.rank)
    if block <= 0:
        if shape.rank != 1 or shape[0] != x_shape[axis]:
            ctx.unsupported(
                f"input {i} of shape {shape} for per-axis quantization of {x_shape} at axis {axis}"
            )
        return g.view(p, Shape.of(*[shape[0] if a == axis else 1 for a in range(x_shape.rank)]))
    if shape.rank != x_shape.rank:
        ctx.unsupported(f"input {i} of shape {shape} for blocked quantization of {x_shape}")
    per_element = g.slice(g.repeat_interleave(p, axis, block), axis, 0, x_shape[axis])
    if g.shape(per_element) != x_shape:
        ctx.unsupported(
            f"input {i} of shape {shape} does not block {x_shape} by {block} on axis {axis}"
        )
    return per_element


def _attr_dtype(ctx: NodeContext, name: str) -> DType | None:
    """An optional element-type attribute (0 = not given)."""
    code = ctx.attr_int(name, 0)
    if code == 0:
        return None
    try:
        return onnx_dtype(code, ctx.name)
    except UnsupportedOnnxError as e:
        ctx.unsupported(f"{name}: {e.detail}")


def _saturate(g: Graph, q: Value, dt: DType) -> Value:
    """Clamp a float to dt's range, then convert (exact: q is already integral)."""
    lo, hi = _range(dt)
    return g.cast(g.minimum(g.maximum(q, float(lo)), float(hi)), dt)


def quantized(
    g: Graph, y: Value, scale: Value, zp: Value | None, out: DType, compute: DType
) -> Value:
    """saturate(round(y / scale) + zp) as `out`, the division in `compute` (a float type);
    scale and zp broadcast to y. Round half to even, as ONNX and onnxruntime's MLAS round."""
    q = g.unary(UnaryOp.ROUND, g.div(g.cast(y, compute), g.cast(scale, compute)))
    if zp is not None:
        q = g.add(q, g.cast(zp, compute))
    return _saturate(g, q, out)


def dequantized(g: Graph, x: Value, scale: Value, zp: Value | None) -> Value:
    """(x - zp) · scale in f32 (the subtraction is exact for every type we dequantize), as the
    ONNX reference and onnxruntime's kernels compute it; the caller casts to the output type."""
    y = g.cast(x, DType.F32)
    if zp is not None:
        y = g.sub(y, g.cast(zp, DType.F32))
    return g.mul(y, g.cast(scale, DType.F32))


def quantize_node(ctx: NodeContext, axis: int, block: int, out: DType | None) -> Value:
    """QuantizeLinear's inputs (x, scale, optional zero point) read and quantized: the zero
    point's type, when given, is the output type (and must agree with `out`)."""
    g = ctx.graph
    x = ctx.input(0)
    shape = g.shape(x)
    zp = _param(ctx, 2, shape, axis, block) if ctx.has_input(2) else None
    if zp is not None:
        if out is not None and out != g.dtype(zp):
            ctx.unsupported(f"output_dtype {out} differs from the zero point's type {g.dtype(zp)}")
        out = g.dtype(zp)
    out = out or DType.U8
    if out not in _QUANTIZED:
        ctx.unsupported(f"quantizing to {out}")
    scale = _param(ctx, 1, shape, axis, block)
    if not g.dtype(x).is_float and g.dtype(x) != DType.I32:
        ctx.unsupported(f"quantizing {g.dtype(x)} input")
    # NumPy's promotion, as the reference divides: f16/f16 stays f16, i32/f32 becomes f64
    compute = _attr_dtype(ctx, "precision") or DType.from_np(
        np.result_type(g.dtype(x).np, g.dtype(scale).np)
    )
    if not compute.is_float:
        ctx.unsupported(f"precision {compute}")
    return quantized(g, x, scale, zp, out, compute)


def dequantize_node(ctx: NodeContext, axis: int, block: int, out: DType | None) -> Value:
    """DequantizeLinear's inputs (x, scale, optional zero point of x's type) read and
    dequantized to `out` (default: the scale's type)."""
    g = ctx.graph
    x = ctx.input(0)
    shape, xt = g.shape(x), g.dtype(x)
    if xt not in (*_QUANTIZED, DType.I32):
        ctx.unsupported(f"dequantizing {xt} input")
    scale = _param(ctx, 1, shape, axis, block)
    out = out or g.dtype(scale)
    if not out.is_float or not g.dtype(scale).is_float:
        ctx.unsupported(f"scale of type {g.dtype(scale)} or output of type {out}")
    zp = None
    if ctx.has_input(2):
        zp = _param(ctx, 2, shape, axis, block)
        if g.dtype(zp) != xt:
            ctx.unsupported(f"zero point of type {g.dtype(zp)} for {xt} input")
    return g.cast(dequantized(g, x, scale, zp), out)


@onnx_op("QuantizeLinear")
def quantize_linear(ctx: NodeContext) -> Result:
    """y = saturate(round(x / scale) + zero_point); the zero point's type is the output type."""
    ctx.ignore_attrs("saturate")  # only float8 outputs saturate optionally
    axis, block = ctx.attr_int("axis", 1), ctx.attr_int("block_size", 0)
    return quantize_node(ctx, axis, block, _attr_dtype(ctx, "output_dtype"))


@onnx_op("DequantizeLinear")
def dequantize_linear(ctx: NodeContext) -> Result:
    """y = (x - zero_point) · scale, in f32 as the ONNX reference does, then the output type."""
    axis, block = ctx.attr_int("axis", 1), ctx.attr_int("block_size", 0)
    return dequantize_node(ctx, axis, block, _attr_dtype(ctx, "output_dtype"))


@onnx_op("DynamicQuantizeLinear")
def dynamic_quantize_linear(ctx: NodeContext) -> Result:
    """uint8 quantization over the range [min(0, min x), max(0, max x)]: scale, zero point, y."""
    g = ctx.graph
    x = ctx.input(0)
    dt = g.dtype(x)
    if dt != DType.F32:
        ctx.unsupported(f"expected an f32 input, found {dt}")
    return list(dynamic_quantize(g, x))


def dynamic_quantize(g: Graph, x: Value) -> tuple[Value, Value, Value]:
    """(y, scale, zero point) of f32 x quantized to uint8 over [min(0, min x), max(0, max x)],
    as DynamicQuantizeLinear and onnxruntime's dynamically quantized kernels compute them."""
    every = list(range(g[x].rank))
    hi = g.maximum(g.reduce(x, every, ReduceOp.MAX), 0.0)
    lo = g.minimum(g.reduce(x, every, ReduceOp.MIN), 0.0)
    span = g.sub(hi, lo)
    scale = g.div(g.select(g.binary(BinaryOp.EQ, hi, lo), 1.0, span), 255.0)
    zp = g.unary(UnaryOp.ROUND, g.minimum(g.maximum(g.sub(0.0, g.div(lo, scale)), 0.0), 255.0))
    return quantized(g, x, scale, zp, DType.U8, DType.F32), scale, g.cast(zp, DType.U8)
