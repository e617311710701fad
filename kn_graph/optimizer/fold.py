"""Constant folding: a value whose operands are all constants is computed once, at optimize time,
with the CPU executor, and becomes a Constant.

Elementwise ops are computed on the compact (un-broadcast) forms of their operands, so adding two
broadcast scalars gives one broadcast scalar, never a materialised [B, 4096] array. Other ops are
computed on their full operands, and only when the result is not much larger than its inputs
(`settings.fold_max_growth`): a Broadcast of a constant always stays a Broadcast.

x + 2·3 over [4]:

    %0: f32[4] = input #0 "x"          %0: f32[4] = input #0 "x"
    %1: f32[] = const 2.0        ──▶   %1: f32[1] = const [6.0]
    %2: f32[1] = view(%1)              %2: f32[4] = broadcast(%1)
    %3: f32[4] = broadcast(%2)         %3: f32[4] = add(%0, %2)
    %4: f32[] = const 3.0
    %5: f32[1] = view(%4)
    %6: f32[4] = broadcast(%5)
    %7: f32[4] = mul(%3, %6)
    %8: f32[4] = add(%0, %7)
"""

from __future__ import annotations

import math

import numpy as np

from kn_graph.errors import KnError
from kn_graph.graph import Graph, ValueInfo
from kn_graph.ops import Binary, Broadcast, Constant, Dynamic, Input, Select, Unary, Value, View
from kn_graph.optimizer.core import Rewriter, copy_op, rewrite
from kn_graph.optimizer.patterns import MAX_MATERIALISE, compact, emit_compact
from kn_graph.reference import evaluate
from kn_graph.shape import Shape

__all__ = ["fold_constant"]


def _run(info: ValueInfo, operands: list[np.ndarray]) -> np.ndarray | None:
    """Compute `info.op` on constant operands with the CPU executor (the reference), in a
    scratch graph; None when the executor refuses (the error then surfaces at run time)."""
    scratch = Graph()
    consts = [scratch.constant(a) for a in operands]
    it = iter(consts)
    try:
        out = copy_op(scratch, info, info.op.map_inputs(lambda _: next(it)))
        scratch.add_output(out)
        (result,) = evaluate(scratch, [])
    except KnError:
        return None
    return result


@rewrite("fold_constants")
def fold_constant(rw: Rewriter, v: Value) -> Value | None:
    """Replace a value computed from constants only by its result. Elementwise results stay in
    compact form (a constant broadcast to the shape); everything else must have fixed shapes and
    may grow at most `fold_max_growth`-fold over its compact inputs."""
    info = rw.info(v)
    op = info.op
    if isinstance(op, Input | Constant | Broadcast | Dynamic):  # the builder folds Dynamic
        return None
    operands = [rw.get(x) for x in op.inputs]
    compacts = [compact(rw.new, u) for u in operands]
    if any(c is None for c in compacts):
        return None
    arrays = [c for c in compacts if c is not None]
    limit = rw.settings.fold_max_growth * max(1, sum(a.size for a in arrays))
    match op:
        case View():
            arr = compact(rw.new, rw.copy(v))  # the builder reshapes; read back its compact form
            if arr is None:
                return None
            return emit_compact(rw.new, arr, info.shape)
        case Unary() | Binary() | Select():
            shape = np.broadcast_shapes(*(a.shape for a in arrays))
            if math.prod(shape) > limit:
                return None
            small = ValueInfo(Shape.of(*shape), info.dtype, op)
            result = _run(small, arrays)
            return None if result is None else emit_compact(rw.new, result, info.shape)
        case _:
            if not info.shape.is_fixed or not all(rw.new[u].shape.is_fixed for u in operands):
                return None
            if info.shape.size().eval({s: 1 for s in info.shape.symbols}) > limit:
                return None
            full_shapes = [rw.new[u].shape.fixed_dims() for u in operands]
            if sum(math.prod(s) for s in full_shapes) > MAX_MATERIALISE:
                return None
            full = [np.broadcast_to(a, s) for a, s in zip(arrays, full_shapes, strict=True)]
            result = _run(info, full)
            return None if result is None else rw.new.constant(result)
