"""A decoder graph trimmed to what a generation step reads: the logits of the last position and
the keys and values of the new positions.

An export returns the logits of every position, [batch, S, vocab] — for a 512-token prompt
of a 151936-token vocabulary a 311 MB tensor, and the LM head's product for all 512 rows (a
quarter of Qwen2-0.5B's prefill) — and each `present` as the whole cache, past and new,
[batch, kv heads, past + S, head size], which the caller copies out at every token. The
generation loop reads the last row of the logits and the S new positions only. So:

    logits  = view(matmul(view(h [B, S, H] -> [1, B*S, H]), W))   (what the loader makes)
         -> view(matmul(view(h[:, S-1:S] -> [1, B, H]), W))          [B, 1, vocab]
    (the same for a block-quantized W: block_quant_matmul over [B*S, H] -> over [B, H])
    present = concat(past [.., P, ..], new [.., S, ..])            (read by attention too)
         -> present[:, :, P:P+S]                                      [B, kv heads, S, D]

Where the logits are not such a product (a bias, another layout) they are sliced to the last
row as they are (the copy shrinks, the product does not); a present whose length is not past +
S (or not a concat of the past input: GroupQueryAttention's) stays whole, and the cache then
takes each step's whole present as the past (`model.Cache.overwrite`). The graph is extended in
place (new values, the outputs re-pointed); the old ones are dead and the planner drops them.
"""

from __future__ import annotations

from kn_graph import Graph, Shape, Size
from kn_graph.ops import BlockQuantMatMul, Concat, MatMul, Value, View
from kn_runtime.generate.signature import DecoderSignature

__all__ = ["trim_outputs"]


def _last_row_product(g: Graph, v: Value) -> Value | None:
    """`v` [B, S, V] = view(matmul(view(h [B, S, H]), W)) computed for the last row only (W
    float [1, H, V], or block-quantized: view(block_quant_matmul(view(h -> [B*S, H])))."""
    out = g[v]
    if not isinstance(out.op, View) or out.shape.rank != 3:
        return None
    mm = out.op.x
    op = g[mm].op
    if not isinstance(op, MatMul | BlockQuantMatMul) or g.use_count(mm) != 1:
        return None
    a = op.a
    if not isinstance(g[a].op, View):
        return None
    h = g[a].op.x
    b, s, hid = g[h].shape.dims if g[h].shape.rank == 3 else (None, None, None)
    vocab = g[mm].shape[-1]
    if b is None or out.shape != Shape.of(b, s, vocab):
        return None
    last = g.slice_raw(h, 1, s - 1, 1, 1)
    if isinstance(op, BlockQuantMatMul):
        if g[a].shape != Shape.of(b * s, hid):
            return None
        row = g.block_quant_matmul(
            g.view(last, Shape.of(b, hid)), op.packed, op.scales, op.zeros, op.bits, op.block
        )
    else:
        if g[a].shape != Shape.of(1, b * s, hid) or g[mm].shape[0] != Size(1):
            return None
        row = g.matmul(g.view(last, Shape.of(1, b, hid)), op.b)
    return g.view(row, Shape.of(b, 1, vocab))


def trim_outputs(g: Graph, sig: DecoderSignature) -> bool:
    """Cut `g`'s logits output to the last position and each present that is concat(past, new)
    along the length to the new positions (module docstring), in place. Returns whether every
    present was cut: only then may a caller keep the past itself and append the new positions
    (GroupQueryAttention's present, say, places a left-padded row's new keys after that row's
    own past, not at the end)."""
    by_name = dict(zip(g.output_names, range(len(g.outputs)), strict=True))
    inputs = dict(zip(g.input_names, g.inputs, strict=True))
    ids = inputs.get(sig.input_ids)
    if ids is None or g[ids].shape.rank != 2:
        return False
    s = g[ids].shape[1]
    k = by_name[sig.logits]
    logits = g.outputs[k]
    if g[logits].shape.rank == 3 and g[logits].shape[1] == s and s != Size(1):
        new = _last_row_product(g, logits)
        g.outputs[k] = new if new is not None else g.slice_raw(logits, 1, s - 1, 1, 1)
    cut = 0
    for p in sig.past:
        past, j = inputs.get(p.name), by_name.get(p.present)
        if past is None or j is None:
            continue
        present = g.outputs[j]
        op = g[present].op
        if not (isinstance(op, Concat) and op.axis == 2 and len(op.xs) == 2 and op.xs[0] == past):
            continue
        length = g[past].shape[2]
        if g[present].shape.rank == 4 and g[present].shape[2] == length + s:
            g.outputs[j] = g.slice_raw(present, 2, length, 1, s)
            cut += 1
    return cut == len(sig.past) > 0
