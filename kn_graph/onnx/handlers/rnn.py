"""Recurrent layers: RNN, GRU and LSTM, unrolled over their (fixed) sequence length.

The input projection of every time step is one matmul; each step then adds the recurrent
projection and applies the cell. Both layouts, the three directions, initial states, peepholes,
clipping, custom activations and (forward) per-batch sequence lengths are supported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kn_graph.onnx.context import MAX_UNROLL, NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.rnn_cells import (
    Activation,
    gru_cell,
    lstm_cell,
    read_activations,
    rnn_cell,
)
from kn_graph.ops import BinaryOp, Value
from kn_graph.shape import Shape, Size

__all__ = ["recurrent"]

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


@dataclass(frozen=True, slots=True)
class Layer:
    """The node's geometry: T steps of a batch B, hidden size H, D directions."""

    kind: str
    steps: int
    batch: Size
    hidden: int
    directions: int
    layout: int
    clip: float | None


@dataclass(frozen=True, slots=True)
class Direction:
    """One direction's weights (already split per direction) and initial states."""

    xw: Value  # [T, B, G·H]: input projection plus its bias, every step at once
    r: Value  # [G·H, H]
    rb: Value | None  # [G·H]
    h0: Value  # [B, H]
    c0: Value | None  # [B, H] (LSTM)
    p: Value | None  # [3H] (LSTM peepholes)
    acts: list[Activation]
    reverse: bool


def _layer(ctx: NodeContext, x: Value) -> Layer:
    g = ctx.graph
    shape = g.shape(x)
    layout = ctx.attr_int("layout", 0)
    if shape.rank != 3 or layout not in (0, 1):
        ctx.unsupported(f"expected X of rank 3 and layout 0 or 1, found {shape}, layout {layout}")
    t, b = (shape[0], shape[1]) if layout == 0 else (shape[1], shape[0])
    direction = ctx.attr_str("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        ctx.unsupported(f"direction '{direction}'")
    r_shape = g.shape(ctx.input(2))
    hidden = ctx.attr_int("hidden_size", 0) or (
        r_shape.dims[-1].as_int("hidden size") if r_shape.rank else 0
    )
    if hidden < 1:
        ctx.unsupported(f"hidden_size {hidden}")
    clip = ctx.attr_float("clip", 0.0) if ctx.has_attr("clip") else None
    return Layer(
        ctx.op_type,
        t.as_int("sequence length"),
        b,
        hidden,
        2 if direction == "bidirectional" else 1,
        layout,
        clip,
    )


def _batch_major(ctx: NodeContext, v: Value, layer: Layer) -> Value:
    """[D, B, H] (layout 0) or [B, D, H] (layout 1) as [D, B, H]."""
    return v if layer.layout == 0 else ctx.graph.permute(v, [1, 0, 2])


def _pick(ctx: NodeContext, v: Value, d: int) -> Value:
    """Direction d of a [D, ...] tensor, without the direction axis."""
    g = ctx.graph
    return g.squeeze(g.slice_raw(v, 0, d, 1, 1), [0])


def _directions(ctx: NodeContext, x: Value, layer: Layer) -> list[Direction]:
    g = ctx.graph
    gates = _GATES[layer.kind] * layer.hidden
    w, r = ctx.input(1), ctx.input(2)
    if g[w].rank != 3 or g[r].rank != 3:
        ctx.unsupported(f"W and R must be 3-D, found {g.shape(w)} and {g.shape(r)}")
    if (
        g.shape(w)[0] != Size(layer.directions)
        or g.shape(w)[1] != Size(gates)
        or g.shape(r)[1] != Size(gates)
    ):
        ctx.unsupported(
            f"W {g.shape(w)} / R {g.shape(r)} do not fit {layer.directions} direction(s) of {gates} gates"
        )
    xt = x if layer.layout == 0 else g.permute(x, [1, 0, 2])  # [T, B, I]
    b = ctx.optional_input(3)
    h0 = ctx.optional_input(5)
    c0 = ctx.optional_input(6) if layer.kind == "LSTM" else None
    p = ctx.optional_input(7) if layer.kind == "LSTM" else None
    state = Shape.of(layer.directions, layer.batch, layer.hidden)
    if layer.layout == 1:
        state = Shape.of(layer.batch, layer.directions, layer.hidden)
    for name, v in (("initial_h", h0), ("initial_c", c0)):
        if v is not None and g.shape(v) != state:
            ctx.unsupported(f"{name} {g.shape(v)}, expected {state}")
    if p is not None and g.shape(p) != Shape.of(layer.directions, 3 * layer.hidden):
        ctx.unsupported(f"P {g.shape(p)}, expected [{layer.directions}, {3 * layer.hidden}]")
    zeros = g.full(0.0, Shape.of(layer.batch, layer.hidden), g.dtype(x))
    acts = read_activations(ctx, _DEFAULT_ACTS[layer.kind], layer.directions)
    per = len(_DEFAULT_ACTS[layer.kind])
    reverse = ctx.attr_str("direction", "forward") == "reverse"
    out = []
    for d in range(layer.directions):
        xw = g.matmul_nd(xt, g.transpose(_pick(ctx, w, d)))
        rb = None
        if b is not None:
            bd = _pick(ctx, b, d)
            xw = g.add(xw, g.slice(bd, 0, 0, gates))
            rb = g.slice(bd, 0, gates, 2 * gates)
        out.append(
            Direction(
                xw,
                _pick(ctx, r, d),
                rb,
                zeros if h0 is None else _pick(ctx, _batch_major(ctx, h0, layer), d),
                None
                if layer.kind != "LSTM"
                else zeros
                if c0 is None
                else _pick(ctx, _batch_major(ctx, c0, layer), d),
                None if p is None else _pick(ctx, p, d),
                acts[d * per : (d + 1) * per],
                reverse or d == 1,
            )
        )
    return out


def _step_mask(
    ctx: NodeContext, layer: Layer, dirs: list[Direction]
) -> Callable[[int], Value | None]:
    """For per-batch sequence lengths: the batch rows still running at step t ([B, 1] bool)."""
    g = ctx.graph
    if not ctx.has_input(4):
        return lambda t: None
    lens = ctx.input(4)
    known = g.const_value(lens)
    if known is not None and np.all(known == layer.steps):
        return lambda t: None
    if any(d.reverse for d in dirs):
        ctx.unsupported("sequence_lens shorter than the sequence with a reverse direction")
    col = g.view(lens, Shape.of(layer.batch, 1))
    return lambda t: g.binary(BinaryOp.GT, col, t)


def _run(
    ctx: NodeContext, layer: Layer, d: Direction, mask: Callable[[int], Value | None]
) -> tuple[list[Value], Value, Value | None]:
    """All hidden states in time order, the last hidden state and (LSTM) the last cell state."""
    g = ctx.graph
    h, c = d.h0, d.c0
    outs: list[Value | None] = [None] * layer.steps
    order = range(layer.steps - 1, -1, -1) if d.reverse else range(layer.steps)
    for t in order:
        xw = g.squeeze(g.slice_raw(d.xw, 0, t, 1, 1), [0])
        match layer.kind:
            case "RNN":
                h_new, c_new = rnn_cell(g, xw, h, d.r, d.rb, d.acts, layer.clip), None
            case "GRU":
                lbr = ctx.attr_bool("linear_before_reset", False)
                h_new, c_new = gru_cell(g, xw, h, d.r, d.rb, d.acts, layer.clip, lbr), None
            case _:
                assert c is not None
                coupled = ctx.attr_bool("input_forget", False)
                h_new, c_new = lstm_cell(g, xw, h, c, d.r, d.rb, d.p, d.acts, layer.clip, coupled)
        running = mask(t)
        if running is None:
            outs[t], h, c = h_new, h_new, c_new
        else:
            outs[t] = g.select(running, h_new, 0.0)
            h = g.select(running, h_new, h)
            c = None if c_new is None or c is None else g.select(running, c_new, c)
    return [o for o in outs if o is not None], h, c


@onnx_op("RNN", "GRU", "LSTM")
def recurrent(ctx: NodeContext) -> list[Result | None]:
    g = ctx.graph
    x = ctx.input(0)
    if not g.dtype(x).is_float:
        ctx.unsupported(f"expected a float input, found {g.dtype(x)}")
    layer = _layer(ctx, x)
    if not 1 <= layer.steps <= MAX_UNROLL:
        ctx.unsupported(f"a sequence of {layer.steps} steps (supported: 1 to {MAX_UNROLL})")
    dirs = _directions(ctx, x, layer)
    mask = _step_mask(ctx, layer, dirs)
    ys, hs, cs = [], [], []
    for d in dirs:
        seq, h, c = _run(ctx, layer, d, mask)
        ys.append(g.concat([g.unsqueeze(s, [0]) for s in seq], 0))  # [T, B, H]
        hs.append(h)
        cs.append(c)
    y = g.concat([g.unsqueeze(v, [1]) for v in ys], 1)  # [T, D, B, H]
    y_h = g.concat([g.unsqueeze(v, [0]) for v in hs], 0)  # [D, B, H]
    y_c = (
        None
        if layer.kind != "LSTM"
        else g.concat([g.unsqueeze(v, [0]) for v in cs if v is not None], 0)
    )
    if layer.layout == 1:
        y = g.permute(y, [2, 0, 1, 3])
        y_h = g.permute(y_h, [1, 0, 2])
        y_c = None if y_c is None else g.permute(y_c, [1, 0, 2])
    return [y, y_h, y_c]
