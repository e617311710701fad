"""Elementwise ONNX ops: arithmetic, math, activations, comparisons, logic, casts, Where."""

from __future__ import annotations

import operator

from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.common import all_known, known_elementwise
from kn_graph.ops import BinaryOp

_ARITH = {
    "Add": (BinaryOp.ADD, operator.add),
    "Sub": (BinaryOp.SUB, operator.sub),
    "Mul": (BinaryOp.MUL, operator.mul),
}


@onnx_op("Add", "Sub", "Mul")
def arith(ctx: NodeContext) -> Result:
    op, f = _ARITH[ctx.op_type]
    if (ks := all_known(ctx)) is not None:
        return known_elementwise(ks, f)
    return ctx.graph.binary(op, ctx.input(0), ctx.input(1))


@onnx_op("Relu")
def relu(ctx: NodeContext) -> Result:
    return ctx.graph.relu(ctx.input(0))
