"""onnxruntime's com.microsoft DynamicQuantizeLSTM (what `quantize_dynamic` makes of an LSTM):
int8/uint8 W [D, I, 4H] and R [D, H, 4H] with scales and zero points per direction or per gate
column, lowered to the LSTM with dequantized weights.

onnxruntime's kernel also quantizes X and each step's hidden state to uint8 on the fly (a
dynamic range per call) and multiplies in integers; we multiply the float activations by the
dequantized weights. Same weights, no activation rounding: the two differ by that rounding, at
most about 1/255 of each activation's range per product term (tests bound it so).
"""

from __future__ import annotations

from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.quant import dequantized
from kn_graph.onnx.handlers.rnn import recurrent_layer
from kn_graph.ops import Value
from kn_graph.shape import Shape

__all__ = ["dynamic_quantize_lstm"]


def _weights(ctx: NodeContext, i: int, scale_i: int, zero_i: int, what: str) -> Value:
    """Input i ([D, rows, 4H], 8-bit) dequantized and laid out as ONNX's LSTM has it [D, 4H, rows]."""
    g = ctx.graph
    q = ctx.input(i)
    shape = g.shape(q)
    if shape.rank != 3 or not g.dtype(q).is_int or g.dtype(q).size != 1:
        ctx.unsupported(f"{what} must be 3-D uint8 or int8, found {g.dtype(q)} {shape}")
    d, cols = shape[0], shape[2]
    params = []
    for j, name in ((scale_i, f"{what}_scale"), (zero_i, f"{what}_zero_point")):
        p = ctx.input(j)
        ps = g.shape(p)
        if ps.size() == d:  # per direction
            p = g.view(p, Shape.of(d, 1, 1))
        elif ps.rank == 2 and ps[0] == d and ps[1] == cols:  # per gate column
            p = g.view(p, Shape.of(d, 1, cols))
        else:
            ctx.unsupported(f"{name} {ps}: expected [{d}] or [{d}, {cols}]")
        params.append(p)
    scale, zero = params
    if g.dtype(zero) != g.dtype(q):
        ctx.unsupported(f"{what}_zero_point must be {g.dtype(q)}, found {g.dtype(zero)}")
    return g.permute(dequantized(g, q, scale, zero), (0, 2, 1))


@onnx_op("DynamicQuantizeLSTM", domain="com.microsoft")
def dynamic_quantize_lstm(ctx: NodeContext) -> list[Result | None]:
    """ONNX LSTM semantics (inputs 0-7 and every attribute) with dequantized W and R."""
    w = _weights(ctx, 1, 8, 9, "W")
    r = _weights(ctx, 2, 10, 11, "R")
    return recurrent_layer(ctx, "LSTM", w, r)
