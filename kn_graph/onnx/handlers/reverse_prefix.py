"""Reversing each batch row's valid prefix along time (ONNX ReverseSequence; the reverse
direction of a recurrent layer with per-batch sequence lengths), for lengths that are data.

One Gather over the rows of the (time, batch) plane: row (t, b) reads row (src, b) with
src = len[b] - 1 - t where t < len[b], else t. The indices are iota arithmetic, so the lengths
may be constants, data or computed from sizes, and no step depends on the batch size.
"""

from __future__ import annotations

from kn_graph.dtype import DType
from kn_graph.graph import Graph
from kn_graph.ops import BinaryOp, Value
from kn_graph.shape import Shape

__all__ = ["reverse_prefixes"]


def reverse_prefixes(g: Graph, x: Value, lens: Value, time_axis: int, batch_axis: int) -> Value:
    """`x` with x[0:len[b]] reversed along `time_axis` in each row b of `batch_axis` (`lens`: one
    integer per batch row). A length outside [0, time size] makes the Gather fail when it runs
    (its indices for that row are -1), as onnxruntime refuses such lengths."""
    shape = g.shape(x)
    steps, batch = shape[time_axis], shape[batch_axis]
    rest = [a for a in range(shape.rank) if a not in (time_axis, batch_axis)]
    perm = [time_axis, batch_axis, *rest]
    xt = x if perm == list(range(shape.rank)) else g.permute(x, perm)
    inner = Shape(tuple(shape[a] for a in rest))
    rows = g.view(xt, Shape.of(steps * batch) + inner)
    n = g.view(g.cast(lens, DType.I64), Shape.of(1, batch))
    plane = Shape.of(steps, batch)
    t, b = g.iota(plane, 0), g.iota(plane, 1)
    src = g.select(g.binary(BinaryOp.LT, t, n), g.sub(g.sub(n, 1), t), t)
    flat = g.add(g.mul(src, g.size_value(batch)), b)
    bad = g.binary(
        BinaryOp.OR,
        g.binary(BinaryOp.LT, n, 0),
        g.binary(BinaryOp.GT, n, g.size_value(steps)),
    )
    flat = g.select(bad, -1, flat)
    out = g.view(g.gather(rows, 0, g.view(flat, Shape.of(steps * batch))), g.shape(xt))
    if xt == x:
        return out
    inverse = [perm.index(a) for a in range(shape.rank)]
    return g.permute(out, inverse)
