"""onnxruntime's graph-optimizer fusions, as they appear in models saved after its extended
optimizations (`SessionOptions.optimized_model_filepath`): com.microsoft FusedMatMul (scaled,
transposed MatMul), FusedGemm and FusedConv (Gemm / Conv followed by an activation, FusedConv
with an optional residual Z added before it). They lower to the plain ops and an activation.
"""

from __future__ import annotations

from collections.abc import Sequence

from kn_graph.graph import Graph
from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.conv import conv
from kn_graph.onnx.handlers.nn import gemm
from kn_graph.onnx.handlers.rnn_cells import activate
from kn_graph.ops import Value
from kn_graph.recurrence import Activation

__all__ = ["fused_conv", "fused_gemm", "fused_matmul"]


def _activate(ctx: NodeContext, g: Graph, x: Value, name: str, params: Sequence[float]) -> Value:
    """The activations onnxruntime's MLAS fuses (MlasActivation), with their parameters in
    order: LeakyRelu (alpha), Clip (min, max), HardSigmoid (alpha, beta); the formulas are the
    recurrent ops' (`rnn_cells.activate`), Clip aside."""

    def param(i: int, default: float) -> float:
        return float(params[i]) if i < len(params) else default

    match name:
        case "":
            return x
        case "Clip":
            return g.clamp(x, param(0, float("-inf")), param(1, float("inf")))
        case "Relu" | "Tanh" | "Sigmoid":
            return activate(g, Activation(name), x)
        case "LeakyRelu":
            return activate(g, Activation(name, param(0, 0.01)), x)
        case "HardSigmoid":
            return activate(g, Activation(name, param(0, 0.2), param(1, 0.5)), x)
        case _:
            ctx.unsupported(f"activation '{name}'")


@onnx_op("FusedMatMul", domain="com.microsoft")
def fused_matmul(ctx: NodeContext) -> Result:
    """alpha · op(A) @ op(B), op transposing the last two axes when transA / transB is set."""
    g = ctx.graph
    a, b = ctx.input(0), ctx.input(1)
    if ctx.attr_int("transBatchA", 0) or ctx.attr_int("transBatchB", 0):
        ctx.unsupported("transBatchA / transBatchB (batch axes moved behind the matrix axes)")
    for flag, name in ((ctx.attr_int("transA", 0), "a"), (ctx.attr_int("transB", 0), "b")):
        if flag:
            v = a if name == "a" else b
            rank = g[v].rank
            if rank < 2:
                ctx.unsupported(f"trans{name.upper()} of a rank-{rank} operand")
            perm = (*range(rank - 2), rank - 1, rank - 2)
            if name == "a":
                a = g.permute(a, perm)
            else:
                b = g.permute(b, perm)
    y = g.matmul_nd(a, b)
    alpha = ctx.attr_float("alpha", 1.0)
    return y if alpha == 1.0 else g.mul(y, alpha)


@onnx_op("FusedGemm", domain="com.microsoft")
def fused_gemm(ctx: NodeContext) -> Result:
    """Gemm, then the activation (activation_alpha / _beta as its parameters)."""
    y = gemm(ctx)
    assert isinstance(y, Value)
    name = ctx.attr_str("activation", "")
    params = [ctx.attr_float(p, 0.0) for p in ("activation_alpha", "activation_beta")]
    params = params if ctx.has_attr("activation_alpha") else []
    ctx.ignore_attrs("activation_gamma")  # no MLAS activation reads it
    return _activate(ctx, ctx.graph, y, name, params)


@onnx_op("FusedConv", domain="com.microsoft")
def fused_conv(ctx: NodeContext) -> Result:
    """Conv (+ bias), plus the residual Z, then the activation (activation_params)."""
    g = ctx.graph
    y = conv(ctx)
    assert isinstance(y, Value)
    if ctx.has_input(3):
        y = g.add(y, ctx.input(3))
    name = ctx.attr_str("activation", "")
    return _activate(ctx, g, y, name, ctx.attr_floats("activation_params", []) or [])
