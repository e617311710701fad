"""Recurrent layers: RNN, GRU and LSTM.

The input projection of every time step is one matmul; each step then adds the recurrent
projection and applies the cell (`rnn_cells`). A fixed, short sequence is unrolled; a symbolic
or long one runs as one "recurrence" op per direction (`rnn_steps`, `kn_graph.recurrence`). Both layouts, the three
directions, initial states, peepholes, clipping, custom activations and per-batch sequence
lengths (constants or data, in every direction) are supported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kn_graph.dtype import DType
from kn_graph.onnx.context import NodeContext, Result, onnx_op
from kn_graph.onnx.handlers.reverse_prefix import reverse_prefixes
from kn_graph.onnx.handlers.rnn_cells import Cell, read_activations
from kn_graph.onnx.handlers.rnn_steps import RNN_MAX_UNROLL, Run, run_recurrence, run_unrolled
from kn_graph.ops import BinaryOp, Value
from kn_graph.shape import Shape, Size

__all__ = ["recurrent", "recurrent_layer"]

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}


@dataclass(frozen=True, slots=True)
class Layer:
    """The node's geometry: T steps (maybe symbolic) of a batch B, hidden size H, D directions."""

    kind: str
    steps: Size
    batch: Size
    hidden: int
    directions: int
    layout: int
    clip: float | None


@dataclass(frozen=True, slots=True)
class Direction:
    """One direction's input projection, step function and initial states."""

    xw: Value  # [T, B, G·H]: input projection plus its bias, every step at once
    cell: Cell
    h0: Value  # [B, H]
    c0: Value | None  # [B, H] (LSTM)
    reverse: bool


def _layer(ctx: NodeContext, x: Value, kind: str, r: Value) -> Layer:
    g = ctx.graph
    shape = g.shape(x)
    layout = ctx.attr_int("layout", 0)
    if shape.rank != 3 or layout not in (0, 1):
        ctx.unsupported(f"expected X of rank 3 and layout 0 or 1, found {shape}, layout {layout}")
    t, b = (shape[0], shape[1]) if layout == 0 else (shape[1], shape[0])
    direction = ctx.attr_str("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        ctx.unsupported(f"direction '{direction}'")
    r_shape = g.shape(r)
    hidden = ctx.attr_int("hidden_size", 0) or (
        r_shape.dims[-1].as_int("hidden size") if r_shape.rank else 0
    )
    if hidden < 1:
        ctx.unsupported(f"hidden_size {hidden}")
    clip = ctx.attr_float("clip", 0.0) if ctx.has_attr("clip") else None
    directions = 2 if direction == "bidirectional" else 1
    return Layer(kind, t, b, hidden, directions, layout, clip)


def _batch_major(ctx: NodeContext, v: Value, layer: Layer) -> Value:
    """[D, B, H] (layout 0) or [B, D, H] (layout 1) as [D, B, H]."""
    return v if layer.layout == 0 else ctx.graph.permute(v, [1, 0, 2])


def _pick(ctx: NodeContext, v: Value, d: int) -> Value:
    """Direction d of a [D, ...] tensor, without the direction axis."""
    g = ctx.graph
    return g.squeeze(g.slice_raw(v, 0, d, 1, 1), [0])


def _state(ctx: NodeContext, layer: Layer, i: int, name: str) -> Value | None:
    """Optional input i (initial_h / initial_c) in the layer's state shape. A size that can only
    be checked per binding (the batch of X given one name, of the state another) is assumed
    equal under a guard; sizes that can never match are refused."""
    if not ctx.has_input(i):
        return None
    g = ctx.graph
    v = ctx.input(i)
    want = Shape.of(layer.directions, layer.batch, layer.hidden)
    if layer.layout == 1:
        want = Shape.of(layer.batch, layer.directions, layer.hidden)
    shape = g.shape(v)
    if shape.rank != 3 or any(
        a != b and a.is_fixed and b.is_fixed for a, b in zip(shape, want, strict=True)
    ):
        ctx.unsupported(f"{name} {shape}, expected {want}")
    for axis, size in enumerate(want):
        v = g.assume_size(v, axis, size, f"{name} axis {axis}")
    return v


def _check_weights(
    ctx: NodeContext, layer: Layer, gates: int, w: Value, r: Value
) -> tuple[Value, Value]:
    g = ctx.graph
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
    return w, r


def _directions(ctx: NodeContext, x: Value, layer: Layer, w: Value, r: Value) -> list[Direction]:
    g = ctx.graph
    gates = _GATES[layer.kind] * layer.hidden
    w, r = _check_weights(ctx, layer, gates, w, r)
    xt = x if layer.layout == 0 else g.permute(x, [1, 0, 2])  # [T, B, I]
    b = ctx.optional_input(3)
    h0 = _state(ctx, layer, 5, "initial_h")
    c0 = _state(ctx, layer, 6, "initial_c") if layer.kind == "LSTM" else None
    p = ctx.optional_input(7) if layer.kind == "LSTM" else None
    if p is not None and g.shape(p) != Shape.of(layer.directions, 3 * layer.hidden):
        ctx.unsupported(f"P {g.shape(p)}, expected [{layer.directions}, {3 * layer.hidden}]")
    zeros = g.full(0.0, Shape.of(layer.batch, layer.hidden), g.dtype(x))
    acts = read_activations(ctx, _DEFAULT_ACTS[layer.kind], layer.directions)
    per = len(_DEFAULT_ACTS[layer.kind])
    reverse = ctx.attr_str("direction", "forward") == "reverse"
    lbr = ctx.attr_bool("linear_before_reset", False) if layer.kind == "GRU" else False
    coupled = ctx.attr_bool("input_forget", False) if layer.kind == "LSTM" else False
    out = []
    for d in range(layer.directions):
        xw = g.matmul_nd(xt, g.transpose(_pick(ctx, w, d)))
        rb = None
        if b is not None:
            bd = _pick(ctx, b, d)
            xw = g.add(xw, g.slice(bd, 0, 0, gates))
            rb = g.slice(bd, 0, gates, 2 * gates)
        cell = Cell(
            layer.kind,
            _pick(ctx, r, d),
            rb,
            None if p is None else _pick(ctx, p, d),
            acts[d * per : (d + 1) * per],
            layer.clip,
            lbr,
            coupled,
        )

        def initial(v: Value | None, d: int = d) -> Value:
            return zeros if v is None else _pick(ctx, _batch_major(ctx, v, layer), d)

        c0_d = initial(c0) if layer.kind == "LSTM" else None
        out.append(Direction(xw, cell, initial(h0), c0_d, reverse or d == 1))
    return out


def _lengths(ctx: NodeContext, layer: Layer) -> Value | None:
    """sequence_lens as i64 [B], or None when absent or known to be the whole sequence."""
    if not ctx.has_input(4):
        return None
    g = ctx.graph
    lens = ctx.input(4)
    if g[lens].rank != 1 or not g.dtype(lens).is_int:
        ctx.unsupported(f"sequence_lens must be a 1-D integer tensor, found {g.shape(lens)}")
    g.guard_equal(g.shape(lens)[0], layer.batch, "sequence_lens")
    known = g.const_value(lens)
    steps = layer.steps.fixed_value()
    if known is not None and steps is not None:
        if np.any((known < 1) | (known > steps)):
            ctx.unsupported(f"sequence_lens {known.tolist()} out of range [1, {steps}]")
        if np.all(known == steps):
            return None
    return g.view(g.cast(lens, DType.I64), Shape.of(layer.batch))


def _run(ctx: NodeContext, layer: Layer, d: Direction, lens: Value | None) -> Run:
    """One direction. With sequence lengths, a reverse direction runs forward over each row's
    valid prefix reversed (one Gather before and one after), so that every run is masked the
    same way: step t runs for the rows whose length exceeds t."""
    g = ctx.graph
    xw, reverse, running = d.xw, d.reverse, None
    if lens is not None:
        plane = Shape.of(layer.steps, layer.batch, 1)
        col = g.view(lens, Shape.of(1, layer.batch, 1))
        running = g.binary(BinaryOp.LT, g.iota(plane, 0), col)  # [T, B, 1]
        if reverse:
            xw, reverse = reverse_prefixes(g, xw, lens, 0, 1), False
    steps = layer.steps.fixed_value()
    if steps is not None and 1 <= steps <= RNN_MAX_UNROLL:
        y, h, c = run_unrolled(g, d.cell, steps, xw, d.h0, d.c0, running, reverse)
    else:
        y, h, c = run_recurrence(g, d.cell, xw, d.h0, d.c0, running, reverse)
    if lens is not None and d.reverse:
        y = reverse_prefixes(g, y, lens, 0, 1)
    return y, h, c


@onnx_op("RNN", "GRU", "LSTM")
def recurrent(ctx: NodeContext) -> list[Result | None]:
    return recurrent_layer(ctx, ctx.op_type, ctx.input(1), ctx.input(2))


def recurrent_layer(ctx: NodeContext, kind: str, w: Value, r: Value) -> list[Result | None]:
    """An RNN / GRU / LSTM node (`kind`) with weights W [D, G·H, I] and R [D, G·H, H] given
    (ONNX's layout), every other input and attribute read from the node as ONNX defines them."""
    g = ctx.graph
    x = ctx.input(0)
    if not g.dtype(x).is_float:
        ctx.unsupported(f"expected a float input, found {g.dtype(x)}")
    layer = _layer(ctx, x, kind, r)
    dirs = _directions(ctx, x, layer, w, r)
    lens = _lengths(ctx, layer)
    ys, hs, cs = [], [], []
    for d in dirs:
        y, h, c = _run(ctx, layer, d, lens)
        ys.append(y)
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
