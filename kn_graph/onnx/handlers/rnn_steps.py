"""Running one direction of a recurrent layer over its steps: unrolled when the sequence is
fixed and short (every step in the graph, which fuses well), else as one `Dynamic`
"recurrence" op (a symbolic or long sequence: one loaded graph for every length, each step a
few microseconds of NumPy).

Both take the input projection of every step at once ([T, B, G·H], one matmul outside the loop)
and, for per-batch sequence lengths, a [T, B, 1] mask of the rows still running: a stopped row
keeps its state and outputs zeros (onnxruntime's semantics).
"""

from __future__ import annotations

from kn_graph.graph import Graph
from kn_graph.onnx.handlers.rnn_cells import Cell
from kn_graph.ops import Value
from kn_graph.recurrence import Recurrence

__all__ = ["RNN_MAX_UNROLL", "run_recurrence", "run_unrolled"]

RNN_MAX_UNROLL = 16
"""The longest fixed sequence that is unrolled: unrolled steps fuse with their neighbours and run
without a host point, but each costs load and prepare time (a matmul and a dozen element ops;
626 GRU steps took ~2 minutes to prepare) while a "recurrence" op costs ~10 µs per step."""

Run = tuple[Value, Value, Value | None]
"""All hidden states [T, B, H] in time order, the last hidden state and (LSTM) cell state."""


def _step(
    g: Graph, cell: Cell, xw: Value, h: Value, c: Value | None, running: Value | None
) -> tuple[Value, Value, Value | None]:
    """One step: (output, next hidden state, next cell state); rows not running keep theirs."""
    h_new, c_new = cell(g, xw, h, c)
    if running is None:
        return h_new, h_new, c_new
    y = g.select(running, h_new, 0.0)
    c_next = None if c_new is None or c is None else g.select(running, c_new, c)
    return y, g.select(running, h_new, h), c_next


def run_unrolled(
    g: Graph,
    cell: Cell,
    steps: int,
    xw: Value,
    h0: Value,
    c0: Value | None,
    running: Value | None,
    reverse: bool,
) -> Run:
    """Every step in the graph, last to first when `reverse`."""
    h, c = h0, c0
    outs: list[Value | None] = [None] * steps
    for t in range(steps - 1, -1, -1) if reverse else range(steps):
        x_t = g.squeeze(g.slice_raw(xw, 0, t, 1, 1), [0])
        r_t = None if running is None else g.squeeze(g.slice_raw(running, 0, t, 1, 1), [0])
        outs[t], h, c = _step(g, cell, x_t, h, c, r_t)
    y = g.concat([g.unsqueeze(o, [0]) for o in outs if o is not None], 0)
    return y, h, c


def run_recurrence(
    g: Graph,
    cell: Cell,
    xw: Value,
    h0: Value,
    c0: Value | None,
    running: Value | None,
    reverse: bool,
) -> Run:
    """A `Dynamic` "recurrence" (`kn_graph.recurrence`): every step in one NumPy loop, for any
    length. Arguments xw, R[, Rb], h0[, c0][, P][, running]; results Y, h_T[, c_T]."""
    n = g.shape(h0)[-1].as_int("hidden size")
    spec = Recurrence(
        cell.kind,
        n,
        tuple(cell.acts),
        cell.clip,
        cell.linear_before_reset,
        cell.input_forget,
        has_bias=cell.rb is not None,
        has_peepholes=cell.p is not None,
        masked=running is not None,
        reverse=reverse,
    )
    optional = [cell.rb, h0, c0, cell.p, running]
    args = [xw, cell.r, *(v for v in optional if v is not None)]
    states = [h0] if c0 is None else [h0, c0]
    shapes = [g.shape(h0).insert(0, g.shape(xw)[0]), *(g.shape(v) for v in states)]
    outs = g.dynamic("recurrence", args, (spec,), shapes, [g.dtype(h0)] * len(shapes))
    return outs[0], outs[1], outs[2] if c0 is not None else None
