"""Running one direction of a recurrent layer over its steps: unrolled when the sequence is
fixed and short (every step in the graph, which fuses well), else as a `Dynamic` "scan" over a
body graph of one cell step (a symbolic or long sequence: one loaded graph for every length).

Both take the input projection of every step at once ([T, B, G·H], one matmul outside the loop)
and, for per-batch sequence lengths, a [T, B, 1] mask of the rows still running: a stopped row
keeps its state and outputs zeros (onnxruntime's semantics).
"""

from __future__ import annotations

from kn_graph.dtype import DType
from kn_graph.graph import Graph
from kn_graph.onnx.handlers.rnn_cells import Cell
from kn_graph.ops import Value
from kn_graph.shape import Shape

__all__ = ["run_scanned", "run_unrolled"]

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


def _into(g: Graph, body: Graph, v: Value | None, caps: list[Value], name: str) -> Value | None:
    """Outer value `v` as a value of the body: a constant is copied in, anything else becomes a
    body input fed by the scan (a capture)."""
    if v is None:
        return None
    arr = g.const_value(v)
    if arr is not None:
        return body.constant(arr)
    caps.append(v)
    return body.input(g.shape(v), g.dtype(v), name)


def run_scanned(
    g: Graph,
    cell: Cell,
    xw: Value,
    h0: Value,
    c0: Value | None,
    running: Value | None,
    reverse: bool,
) -> Run:
    """A `Dynamic` "scan" over the time axis of `xw` (and `running`): state h (and c), scan
    inputs x_t (and running_t), captures R, its bias and the peepholes; outputs h, c, y_t."""
    body = Graph()
    body.share_fresh_names(g)
    hb = body.input(g.shape(h0), g.dtype(h0), "h")
    cb = None if c0 is None else body.input(g.shape(c0), g.dtype(c0), "c")
    xs = [xw] if running is None else [xw, running]
    xb = body.input(g.shape(xw).remove(0), g.dtype(xw), "xw")
    rb_ = None if running is None else body.input(g.shape(running).remove(0), DType.BOOL, "run")
    caps: list[Value] = []
    r = _into(g, body, cell.r, caps, "r")
    assert r is not None
    inner = cell.with_weights(
        r, _into(g, body, cell.rb, caps, "rb"), _into(g, body, cell.p, caps, "p")
    )
    y, h, c = _step(body, inner, xb, hb, cb, rb_)
    states = [h] if c is None else [h, c]
    for v, name in zip([*states, y], ["h", "c", "y"] if c is not None else ["h", "y"], strict=True):
        body.add_output(v, name)
    init = [h0] if c0 is None else [h0, c0]
    n_in = len(xs)
    params = (body, len(init), n_in, (0,) * n_in, (reverse,) * n_in, (0,), (reverse,))
    shapes: list[Shape] = [g.shape(v) for v in init]
    shapes.append(g.shape(h0).insert(0, g.shape(xw)[0]))
    outs = g.dynamic("scan", [*init, *xs, *caps], params, shapes, [g.dtype(h0)] * len(shapes))
    return outs[-1], outs[0], outs[1] if c0 is not None else None
