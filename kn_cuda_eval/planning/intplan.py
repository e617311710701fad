"""Integer products (`IntMatMul`, `IntConv`) as integer steps of their own, planned when
`PlanSettings.integer_steps` is on (the CPU backend, which runs them through oneDNN's int8
primitives); otherwise `plan()` has lowered them to float64 GEMMs and convolutions already. The
same for block-quantized products (`BlockQuantMatMul`, `PlanSettings.block_quant_steps`)."""

from __future__ import annotations

import math

from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.context import PlannerContext
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType
from kn_graph.errors import PlanError
from kn_graph.ops import BlockQuantMatMul, Broadcast, IntConv, IntMatMul, Value, View

__all__ = [
    "GEMM_ROWS",
    "TILE_FLOATS",
    "block_scratch",
    "plan_block_product",
    "plan_int_conv",
    "plan_int_matmul",
    "plan_integer_product",
]


def plan_integer_product(p: PlannerContext, i: int, op: IntMatMul | IntConv) -> None:
    """Value i, an integer product, as an integer step (PlanError without `integer_steps`)."""
    if not p.s.integer_steps:
        raise PlanError(
            f"{p.g.format_value(p.val(i))}: integer products are lowered before planning "
            "without PlanSettings.integer_steps (kn_graph.integer.lower_integer_products, "
            "which plan() applies)"
        )
    if isinstance(op, IntMatMul):
        plan_int_matmul(p, i, op)
    else:
        plan_int_conv(p, i, op)


def _zero_point(p: PlannerContext, v: Value) -> StridedView:
    """A zero point as a view with zero strides of the one element that holds it, when it is one
    value stretched by Views and Broadcasts (DynamicQuantizeLinear's run-time zero point reaches
    IntMatMul as view(broadcast(view(z)))): the runner then reads one value, and nothing is
    materialized at the operand's size. Otherwise the value as it is."""
    base = v
    while isinstance(op := p.g[base].op, View | Broadcast):
        base = op.x
    shape = p.shape(v.index)
    if math.prod(p.shape(base.index)) == 1:
        one = p.mat(base.index)
        return StridedView(one.offset, shape, (0,) * len(shape), one.dtype)
    return p.mat(v.index)


def plan_int_matmul(p: PlannerContext, i: int, op: IntMatMul) -> None:
    """out [b,m,n] i32 = (a - a_zero) @ (b - b_zero) on the operands' views as they are (the
    zero points as broadcast views of what holds them, usually one element)."""
    out = p.temp(p.shape(i), DType.I32, p.name(i))
    p.state[i] = out
    a, b = p.mat(op.a.index), p.mat(op.b.index)
    za, zb = _zero_point(p, op.a_zero), _zero_point(p, op.b_zero)
    if out.numel > 0:
        p.steps.append(st.IntMatMul(a, b, za, zb, out))


def plan_int_conv(p: PlannerContext, i: int, op: IntConv) -> None:
    """out i32 = conv(x - x_zero, w - w_zero) over dense x and w, as the float convolution step
    reads them."""
    out = p.temp(p.shape(i), DType.I32, p.name(i))
    p.state[i] = out
    x = p.dense(p.mat(op.x.index), p.name(op.x.index))
    w = p.dense(p.mat(op.w.index), p.name(op.w.index))
    zx, zw = _zero_point(p, op.x_zero), _zero_point(p, op.w_zero)
    d = op.details
    if out.numel > 0:
        p.steps.append(st.IntConv(x, w, zx, zw, out, d.stride, d.padding, d.dilation, d.groups))


def plan_block_product(p: PlannerContext, i: int, op: BlockQuantMatMul) -> None:
    """out [m, n] = a @ dequantized weightsᵀ over dense a and the packed constants as stored
    (PlanError without `block_quant_steps`: `plan()` lowers the op otherwise)."""
    if not p.s.block_quant_steps:
        raise PlanError(
            f"{p.g.format_value(p.val(i))}: block-quantized products are lowered before "
            "planning without PlanSettings.block_quant_steps (kn_graph.blockquant)"
        )
    out = p.temp(p.shape(i), p.g[p.val(i)].dtype, p.name(i))
    p.state[i] = out
    a = p.dense(p.mat(op.a.index), p.name(op.a.index))
    consts = [p.dense(p.mat(v.index), p.name(v.index)) for v in (op.packed, op.scales, op.zeros)]
    if out.numel > 0:
        (m, k), n = a.shape, out.shape[1]
        nbytes = block_scratch(m, k, n, op.block)
        scratch = p.temp((nbytes,), DType.U8, f"{p.name(i)}/scratch")
        p.steps.append(st.BlockQuantMatMul(a, *consts, out, scratch, op.bits, op.block))


GEMM_ROWS = 16
"""From this many rows of f32 a, the CPU kernel dequantizes tiles of weights and multiplies them
with oneDNN's sgemm (prefill); below, it reads the packed weights directly (decode)."""

TILE_FLOATS = 1 << 22
"""Dequantized weights per tile (16 MB): a whole matrix of a 0.5B-parameter LLM's layers."""


def block_scratch(m: int, k: int, n: int, block: int) -> int:
    """Bytes of scratch the CPU kernel of a BlockQuantMatMul needs: 16 (the tile being
    dequantized), a's rows reordered as float32, and with `GEMM_ROWS` rows or more a tile of
    dequantized weights (the direct path stays the fallback when oneDNN is absent)."""
    kp = -(-k // block) * block
    tile = min(n, max(1, TILE_FLOATS // kp)) * kp if m >= GEMM_ROWS else 0
    return 16 + 4 * (m * kp + tile)
