"""Block-quantized weights from onnxruntime's LLM exports: com.microsoft MatMulNBits (2-, 4- and
8-bit weights, one scale and zero point per block along K) and GatherBlockQuantized (a quantized
embedding table, often the tied LM head's).

MatMulNBits becomes `BlockQuantMatMul` over the packed weights as they are in the file (the CPU
backend reads them packed; other devices dequantize them once, `kn_graph.blockquant`).
GatherBlockQuantized of a table packed along its rows (onnxruntime-genai's 4-bit embedding,
[vocab, hidden]) gathers the packed rows and dequantizes only those ((q - zero) · scale in
float32, as onnxruntime's reference does): the table stays as it is in the file (Qwen2-0.5B's:
68 MB, where the float table was 545 MB, and making it took 2.2 GB more at load). Other
layouts are dequantized here, once, into a float constant of the scales' type, and the op
becomes a Gather.
"""

from __future__ import annotations

import numpy as np

from kn_graph.blockquant import unpack_bits
from kn_graph.dtype import DType
from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.ops import BinaryOp, Value
from kn_graph.shape import Shape, Size

__all__ = ["gather_block_quantized", "matmul_nbits"]


def _bits(ctx: NodeContext, default: int) -> int:
    bits = ctx.attr_int("bits", default)
    if bits not in (2, 4, 8):
        ctx.unsupported(f"bits={bits} (supported: 2, 4, 8)")
    return bits


@onnx_op("MatMulNBits", domain="com.microsoft")
def matmul_nbits(ctx: NodeContext) -> Result:
    """A [..., K] @ dequantized Bᵀ [K, N] (+ bias [N])."""
    g = ctx.graph
    a = ctx.input(0)
    dt = g.dtype(a)
    if dt not in (DType.F32, DType.F16):
        ctx.unsupported(f"A must be float or float16, found {dt}")
    k, n = ctx.attr_int("K"), ctx.attr_int("N")
    bits, block = _bits(ctx, 4), ctx.attr_int("block_size")
    ctx.ignore_attrs("accuracy_level")  # how onnxruntime may compute; the result is the same op
    if ctx.attr_int("weight_prepacked", 0):
        ctx.unsupported("weight_prepacked (a CUDA-specific packed layout)")
    if block < 16 or block & (block - 1):
        ctx.unsupported(f"block_size={block} (a power of two >= 16)")
    if ctx.has_input(4):
        ctx.unsupported("g_idx (deprecated act-order indices)")
    if g[a].rank == 0 or g.shape(a)[-1] != Size(k):
        ctx.unsupported(f"A's last axis must be K={k}, found {g.shape(a)}")
    blocks = -(-k // block)
    packed = ctx.input_static(1, "B")
    if packed.dtype != np.uint8 or packed.shape != (n, blocks, block * bits // 8):
        ctx.unsupported(
            f"B must be uint8 [{n}, {blocks}, {block * bits // 8}], found {packed.dtype} "
            f"{list(packed.shape)}"
        )
    scales = ctx.input_static(2, "scales")
    if scales.size != n * blocks:
        ctx.unsupported(f"scales must hold N x k_blocks = {n * blocks} values, found {scales.size}")
    scales = scales.astype(np.float32).reshape(n, blocks)
    zero = _nbits_zero(ctx, 3, bits, n, blocks)
    lead = g.shape(a).dims[:-1]
    rows = g.view(a, Shape.of(Shape.from_seq(lead).size(), k))
    consts = [g.constant(x) for x in (packed, scales, zero)]
    y = g.block_quant_matmul(rows, *consts, bits, block)
    y = g.view(y, Shape.from_seq([*lead, n]))
    if ctx.has_input(5):
        y = g.add(y, ctx.input(5))
    return y


def _nbits_zero(ctx: NodeContext, i: int, bits: int, n: int, blocks: int) -> np.ndarray:
    """Zero points [N, blocks]: packed uint8 unpacked to uint8, 2^(bits-1) when absent (uint8:
    a quarter of float32's memory), float ones as float32."""
    if not ctx.has_input(i):
        return np.full((n, blocks), 2 ** (bits - 1), np.uint8)
    z = ctx.input_static(i, "zero_points")
    if z.dtype == np.uint8:
        per_row = -(-blocks * bits // 8)
        if z.size != n * per_row:
            ctx.unsupported(
                f"packed zero_points must hold N x {per_row} bytes = {n * per_row}, found {z.size}"
            )
        return np.ascontiguousarray(unpack_bits(z.reshape(n, per_row), bits, blocks))
    if z.size != n * blocks:
        ctx.unsupported(f"zero_points must hold N x k_blocks = {n * blocks} values, found {z.size}")
    return z.astype(np.float32).reshape(n, blocks)


@onnx_op("GatherBlockQuantized", domain="com.microsoft")
def gather_block_quantized(ctx: NodeContext) -> Result:
    """Gather of rows of a block-quantized constant table, dequantized to the scales' type."""
    g = ctx.graph
    data = ctx.input_static(0, "data")
    scales = ctx.input_static(2, "scales")
    out_dt = DType.from_np(scales.dtype)
    if not out_dt.is_float:
        ctx.unsupported(f"scales must be a float, found {scales.dtype}")
    rank = data.ndim
    gather_axis = ctx.axis(ctx.attr_int("gather_axis", 0), rank)
    q_axis = ctx.axis(ctx.attr_int("quantize_axis", rank - 1), rank)
    block = ctx.attr_int("block_size", 128)
    bits = _bits(ctx, 4)
    blocks = -(-data.shape[q_axis] // block)
    packed = data.dtype == np.uint8 and bits < 8 and scales.shape[q_axis] != blocks
    row_packed = False  # a table packed along its rows: it stays so (`_dequantized_rows`)
    if packed:  # uint8 holding 8/bits values per byte along the last axis
        if q_axis != rank - 1 or gather_axis == q_axis:
            ctx.unsupported("packed uint8 data must be quantized along its last axis only")
        blocks = scales.shape[q_axis]
        row_packed = rank == 2 and data.shape[1] * (8 // bits) == blocks * block
        if not row_packed:
            data = unpack_bits(data, bits, blocks * block)
    if block < 16 or block & (block - 1):
        ctx.unsupported(f"block_size={block} (a power of two >= 16)")
    expect = tuple(blocks if a == q_axis else d for a, d in enumerate(data.shape))
    if scales.shape != expect:
        ctx.unsupported(f"scales must be {list(expect)}, found {list(scales.shape)}")
    # absent zero points: 2^(bits-1) for uint8 data, 0 for int4/uint4 (widened when read)
    zero = np.full(expect, 2 ** (bits - 1) if packed or bits == 8 else 0, np.float32)
    if ctx.has_input(3):
        z = ctx.input_static(3, "zero_points")
        if packed and z.shape != expect:
            z = unpack_bits(z, bits, expect[-1])
        if z.shape != expect:
            ctx.unsupported(f"zero_points must be {list(expect)}, found {list(z.shape)}")
        zero = z.astype(np.float32)
    idx = ctx.input(1)
    if not g.dtype(idx).is_int:
        ctx.unsupported(f"indices must be integers, found {g.dtype(idx)}")
    n = data.shape[gather_axis]
    idx = g.select(g.binary(BinaryOp.LT, idx, 0), g.add(idx, n), idx)
    flat = g.view(idx, Shape.of(g.shape(idx).size()))
    if row_packed:
        rows = _dequantized_rows(ctx, data, scales, zero, flat, bits, block)
        out = g.cast(rows, out_dt) if out_dt is not DType.F32 else rows
        return g.view(out, Shape.from_seq([*g.shape(idx).dims, blocks * block]))
    per_elem = [np.repeat(p, block, axis=q_axis) for p in (zero, scales.astype(np.float32))]
    cut = tuple(slice(0, d) for d in data.shape)
    table = (data.astype(np.float32) - per_elem[0][cut]) * per_elem[1][cut]
    out = g.gather(g.constant(table.astype(out_dt.np)), gather_axis, flat)
    shape = list(data.shape)
    shape[gather_axis : gather_axis + 1] = g.shape(idx).dims
    return g.view(out, Shape.from_seq(shape))


def _dequantized_rows(
    ctx: NodeContext,
    packed: np.ndarray,
    scales: np.ndarray,
    zero: np.ndarray,
    flat: Value,
    bits: int,
    block: int,
) -> Value:
    """Rows `flat` [T] of a table packed along its rows (uint8 [n, blocks·block·bits/8], low
    bits first), dequantized: [T, blocks·block] float32 = (q - zero) · scale per block."""
    g = ctx.graph
    n, blocks = scales.shape
    per = 8 // bits
    t = g.shape(flat)[0]
    table = g.constant(np.ascontiguousarray(packed).reshape(n, blocks, block // per))
    q = g.view(g.cast(g.gather(table, 0, flat), DType.I32), Shape.of(t, blocks, block // per, 1))
    shifts = g.constant(np.array([1 << (j * bits) for j in range(per)], np.int32))
    q = g.binary(BinaryOp.MOD, g.binary(BinaryOp.DIV, q, shifts), 1 << bits)  # value j of a byte
    q = g.cast(g.view(q, Shape.of(t, blocks, block)), DType.F32)

    def per_block(x: np.ndarray) -> Value:
        rows = g.gather(g.constant(np.ascontiguousarray(x, np.float32)), 0, flat)
        return g.view(rows, Shape.of(t, blocks, 1))

    w = g.mul(g.sub(q, per_block(zero)), per_block(scales))
    return g.view(w, Shape.of(t, blocks * block))
