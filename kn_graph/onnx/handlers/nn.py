"""Neural-network ONNX ops: Conv, MatMul, Gemm, pooling, normalisations, Softmax, Resize, …"""

from __future__ import annotations

from kn_graph.onnx.context import NodeContext, Result, onnx_op


@onnx_op("MatMul")
def matmul(ctx: NodeContext) -> Result:
    return ctx.graph.matmul_nd(ctx.input(0), ctx.input(1))
