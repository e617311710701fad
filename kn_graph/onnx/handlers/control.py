"""Control flow: If with a condition known at load time (exports guard shape cases with it); the
taken branch is inlined into the graph, the other is never imported. Loop and Scan are not."""

from __future__ import annotations

import numpy as np

from kn_graph.onnx.context import NodeContext, Result, onnx_op


def _condition(ctx: NodeContext) -> bool:
    k = ctx.input_known(0)
    arr = k.data if k is not None else np.asarray(ctx.input_static(0, "the condition"))
    if arr.size != 1 or arr.dtype == object:
        ctx.unsupported(f"the condition must be one known element, found {arr.tolist()}")
    return bool(arr.reshape(-1)[0])


@onnx_op("If")
def if_(ctx: NodeContext) -> list[Result]:
    taken = _condition(ctx)
    then_branch, else_branch = ctx.attr_graph("then_branch"), ctx.attr_graph("else_branch")
    branch = then_branch if taken else else_branch
    if branch is None:
        ctx.unsupported("a branch is missing")
    outs = ctx.loader.inline_graph(branch, ctx)
    if len(outs) != len(ctx.node.output):
        ctx.unsupported(f"the branch has {len(outs)} outputs, the node {len(ctx.node.output)}")
    return outs
