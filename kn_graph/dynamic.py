"""The kinds of `Dynamic` op: what each computes on whole NumPy arrays, simply and obviously
correctly (the CPU executor runs these; the device runners call the same functions at the
host points of a segmented plan, so there is one semantics).

Each kind maps (op, argument arrays, bindings, a graph runner) to its list of results. Control
flow (If / Loop / Scan) runs its subgraphs through the runner it is given: `kn_graph.reference.evaluate`
on the reference executor, a device's own runner on a device. Results are checked against the
op's declared shapes by `bind_results`, which also binds the run-time size symbols.

The graph's builders import this module (a Dynamic op of constants is computed when it is
built), so a subgraph is named here by `GraphBase`, the layer below the builders: the kinds only
hand it to the runner, and `outer_bindings` only reads its inputs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from kn_graph.errors import EvaluationError
from kn_graph.recurrence import Recurrence, run_recurrence
from kn_graph.shape import Shape, infer_symbols

if TYPE_CHECKING:
    from kn_graph.graph_base import GraphBase
    from kn_graph.ops import Dynamic

__all__ = [
    "CONTROL",
    "KINDS",
    "MAX_LOOP_ITERATIONS",
    "RunGraph",
    "bind_results",
    "max_loop_iterations",
    "outer_bindings",
    "run_dynamic",
]

RunGraph = Callable[["GraphBase", list[np.ndarray], Mapping[str, int]], list[np.ndarray]]
"""Evaluates a subgraph (a Loop body, an If branch) on arrays, given the enclosing graph's
bindings (`outer_bindings` picks the ones its inputs share); returns its outputs."""

Run = Callable[["Dynamic", list[np.ndarray], Mapping[str, int], RunGraph], list[np.ndarray]]

MAX_LOOP_ITERATIONS = 1 << 20
"""A Loop stops with EvaluationError after this many iterations (`KN_MAX_LOOP_ITERATIONS`
overrides it): a loop whose condition never turns false is an error, never a hang."""


def max_loop_iterations() -> int:
    raw = os.environ.get("KN_MAX_LOOP_ITERATIONS", "")
    try:
        return max(0, int(raw)) if raw else MAX_LOOP_ITERATIONS
    except ValueError:
        return MAX_LOOP_ITERATIONS


# -- data-dependent sizes --------------------------------------------------------------------------
def _nonzero(op: Dynamic, xs: list[np.ndarray], b: Mapping[str, int], run: RunGraph) -> list:
    return [np.array(np.nonzero(xs[0]), dtype=np.int64).reshape(xs[0].ndim, -1)]


def _descending_key(x: np.ndarray) -> np.ndarray:
    """A key whose ascending order is `x`'s descending order, without overflow: -x for floats,
    ~x for integers (~x = -x - 1, also for unsigned), not x for booleans."""
    if x.dtype.kind == "f":
        return -x
    return ~x if x.dtype.kind in "iub" else -x


def _topk(op: Dynamic, xs: list[np.ndarray], b: Mapping[str, int], run: RunGraph) -> list:
    axis, largest, _sorted = op.params
    x, k_arr = xs
    k = int(np.asarray(k_arr).reshape(-1)[0])
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise EvaluationError(f"topk: k = {k} is outside [0, {n}] (the length of axis {axis})")
    # onnxruntime's order: by value, ties by the lower index (a stable sort on the key)
    key = _descending_key(x) if largest else x
    order = np.argsort(key, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis).astype(np.int64)
    return [np.take_along_axis(x, idx, axis=axis), idx]


def _nms(op: Dynamic, xs: list[np.ndarray], b: Mapping[str, int], run: RunGraph) -> list:
    """ONNX NonMaxSuppression as onnxruntime computes it (float32 arithmetic, the same order of
    operations): per batch and class, the candidates scoring above the threshold in score order
    (ties: lower box index first); each is kept unless its IoU with a kept box exceeds the
    threshold; at most max_output_boxes_per_class."""
    center, has_max, has_iou, has_score = op.params
    boxes, scores, *rest = xs
    rest = list(rest)
    max_out = int(np.asarray(rest.pop(0)).reshape(-1)[0]) if has_max else 0
    iou_t = np.float32(np.asarray(rest.pop(0)).reshape(-1)[0]) if has_iou else np.float32(0)
    score_t = np.float32(np.asarray(rest.pop(0)).reshape(-1)[0]) if has_score else None
    nb, _, ns = scores.shape
    if boxes.shape != (nb, ns, 4):
        raise EvaluationError(
            f"nms: boxes {list(boxes.shape)} do not match scores {list(scores.shape)}"
        )
    bx = boxes.astype(np.float32)
    if center:
        half_w, half_h = bx[..., 2] / np.float32(2), bx[..., 3] / np.float32(2)
        x1, x2 = bx[..., 0] - half_w, bx[..., 0] + half_w
        y1, y2 = bx[..., 1] - half_h, bx[..., 1] + half_h
    else:
        y1, y2 = np.minimum(bx[..., 0], bx[..., 2]), np.maximum(bx[..., 0], bx[..., 2])
        x1, x2 = np.minimum(bx[..., 1], bx[..., 3]), np.maximum(bx[..., 1], bx[..., 3])
    area = (x2 - x1) * (y2 - y1)
    out: list[np.ndarray] = []
    for bi in range(nb if max_out > 0 else 0):
        picks = _nms_batch(
            scores[bi].astype(np.float32),
            score_t,
            max_out,
            iou_t,
            x1[bi],
            y1[bi],
            x2[bi],
            y2[bi],
            area[bi],
        )
        for ci, kept in enumerate(picks):
            rows = np.empty((len(kept), 3), np.int64)
            rows[:, 0], rows[:, 1], rows[:, 2] = bi, ci, kept
            out.append(rows)
    return [np.concatenate(out) if out else np.zeros((0, 3), np.int64)]


def _nms_batch(s, score_t, max_out, iou_t, x1, y1, x2, y2, area) -> list[list[int]]:
    """Greedy NMS of every class of one batch at once: per step, each class keeps its best live
    candidate and suppresses what overlaps it (arrays [classes, candidates])."""
    nc = s.shape[0]
    live = np.ones_like(s, bool) if score_t is None else s > score_t
    counts = live.sum(axis=1)
    width = int(counts.max()) if nc else 0
    key = np.where(live, -s, np.float32(np.inf))
    order = np.argsort(key, axis=1, kind="stable")[:, :width]  # box index per (class, rank)
    alive = np.arange(width)[None, :] < counts[:, None]
    picks: list[list[int]] = [[] for _ in range(nc)]
    rows = np.arange(nc)
    ox1, oy1, ox2, oy2, oarea = x1[order], y1[order], x2[order], y2[order], area[order]
    for _ in range(min(max_out, width)):
        first = np.argmax(alive, axis=1)
        has = alive[rows, first]
        if not has.any():
            break
        j = order[rows, first]
        for ci in np.flatnonzero(has):
            picks[ci].append(int(j[ci]))
        alive[rows, first] = False
        jj = j[:, None]
        ix = np.maximum(np.minimum(x2[jj], ox2) - np.maximum(x1[jj], ox1), 0)
        iy = np.maximum(np.minimum(y2[jj], oy2) - np.maximum(y1[jj], oy1), 0)
        inter = ix * iy
        a1, a2 = area[jj], oarea
        union = a1 + a2 - inter
        ok = (a1 > 0) & (a2 > 0) & (union > 0)
        with np.errstate(all="ignore"):
            iou = inter / np.where(ok, union, np.float32(1))
        alive &= ~(ok & (iou > iou_t) & has[:, None])
    return picks


def _unique(op: Dynamic, xs: list[np.ndarray], b: Mapping[str, int], run: RunGraph) -> list:
    axis, sort = op.params
    x = xs[0]
    if axis is None:
        y, first, inverse, counts = np.unique(
            x.reshape(-1), return_index=True, return_inverse=True, return_counts=True
        )
    else:
        y, first, inverse, counts = np.unique(
            x, return_index=True, return_inverse=True, return_counts=True, axis=axis
        )
    inverse = inverse.reshape(-1)
    if not sort:  # first-occurrence order
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y = y[order] if axis is None else np.take(y, order, axis=axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    i64 = np.int64
    return [np.ascontiguousarray(y), first.astype(i64), inverse.astype(i64), counts.astype(i64)]


def _slice(op: Dynamic, xs: list[np.ndarray], b: Mapping[str, int], run: RunGraph) -> list:
    """ONNX Slice with bounds from data: clamped to the axis as the spec says."""
    axes, steps = op.params
    x, starts, ends = xs
    index = [slice(None)] * x.ndim
    for a, s0, e0, st in zip(axes, starts.tolist(), ends.tolist(), steps, strict=True):
        n = x.shape[a]
        s0 = s0 + n if s0 < 0 else s0
        e0 = e0 + n if e0 < 0 else e0
        if st > 0:
            s0, e0 = min(max(s0, 0), n), min(max(e0, 0), n)
        else:
            s0, e0 = min(max(s0, 0), n - 1), min(max(e0, -1), n - 1)
        index[a] = slice(s0, None if e0 < 0 else e0, st)
    return [np.ascontiguousarray(x[tuple(index)])]


_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _wrapped(idx: np.ndarray, n: int, what: str) -> np.ndarray:
    """Indices with negatives counted from the end; EvaluationError for any out of range."""
    out = np.where(idx < 0, idx + n, idx)
    bad = (out < 0) | (out >= n)
    if bad.any():
        raise EvaluationError(f"{what}: index {int(idx[bad][0])} out of range for size {n}")
    return out


def _scatter_into(
    data: np.ndarray, where: tuple[np.ndarray, ...], upd: np.ndarray, reduction: str
) -> np.ndarray:
    out = data.copy()
    if reduction == "none":  # in order: a repeated position keeps the last write
        out[where] = upd
    elif reduction in _REDUCE:
        _REDUCE[reduction].at(out, where, upd)
    else:
        raise EvaluationError(f"scatter: reduction '{reduction}' is not supported")
    return out


def _scatter_elements(
    op: Dynamic, xs: list[np.ndarray], b: Mapping[str, int], run: RunGraph
) -> list:
    axis, reduction = op.params
    data, idx, upd = xs
    if idx.shape != upd.shape or idx.ndim != data.ndim:
        raise EvaluationError(
            f"scatter_elements: indices {list(idx.shape)}, updates {list(upd.shape)} and data "
            f"{list(data.shape)} do not fit"
        )
    if any(i > d for a, (i, d) in enumerate(zip(idx.shape, data.shape, strict=True)) if a != axis):
        raise EvaluationError(
            f"scatter_elements: indices {list(idx.shape)} exceed data {list(data.shape)}"
        )
    where = list(np.indices(idx.shape, sparse=True))
    where[axis] = _wrapped(idx, data.shape[axis], "scatter_elements")
    return [_scatter_into(data, tuple(where), upd, reduction)]


def _scatter_nd(op: Dynamic, xs: list[np.ndarray], b: Mapping[str, int], run: RunGraph) -> list:
    (reduction,) = op.params
    data, idx, upd = xs
    k = idx.shape[-1] if idx.ndim else 0
    if idx.ndim < 1 or k > data.ndim or upd.shape != idx.shape[:-1] + data.shape[k:]:
        raise EvaluationError(
            f"scatter_nd: indices {list(idx.shape)}, updates {list(upd.shape)} and data "
            f"{list(data.shape)} do not fit"
        )
    where = tuple(_wrapped(idx[..., j], data.shape[j], "scatter_nd") for j in range(k))
    return [_scatter_into(data, where, upd, reduction)]


# -- sizes from data (inside a Loop body: a step counter) ----------------------------------------
# Each of these params ends in `where` (the node, for errors): its sizes come from the values of
# its size inputs, known only when it runs.
def _ints(a: np.ndarray, where: str, what: str) -> list[int]:
    a = np.asarray(a)
    if a.dtype.kind not in "iu":
        raise EvaluationError(f"{where}: {what} must be integers, found {a.dtype}")
    return [int(v) for v in a.reshape(-1)]


def _one(a: np.ndarray, where: str, what: str) -> np.ndarray:
    a = np.asarray(a)
    if a.size != 1:
        raise EvaluationError(f"{where}: {what} must have one element, found shape {list(a.shape)}")
    return a.reshape(-1)[0]


def _sizes(dims: list[int], where: str, what: str) -> list[int]:
    if any(d < 0 for d in dims):
        raise EvaluationError(f"{where}: {what} {dims} has a negative size")
    return dims


def _range(op: Dynamic, xs: list[np.ndarray], b: Mapping[str, int], run: RunGraph) -> list:
    """ONNX Range: start + i * delta for i < max(ceil((limit - start) / delta), 0); integers
    exactly, floats computed in float64 and rounded once (as the load-time Range is)."""
    (where,) = op.params
    start, limit, delta = (
        _one(a, where, w) for a, w in zip(xs, ("start", "limit", "delta"), strict=True)
    )
    dt = op.dtypes[0].np
    if delta == 0:
        raise EvaluationError(f"{where}: delta is zero (start {start}, limit {limit})")
    if dt.kind in "iu":
        s0, e0, d0 = int(start), int(limit), int(delta)
        n = max(-((s0 - e0) // d0), 0)  # ceil((e0 - s0) / d0) in integers
        return [(s0 + d0 * np.arange(n, dtype=np.int64)).astype(dt)]
    lo, hi, d = float(start), float(limit), float(delta)
    span = (hi - lo) / d
    if not np.isfinite(span):
        raise EvaluationError(f"{where}: Range({lo}, {hi}, {d}) has no finite length")
    n = max(int(np.ceil(span)), 0)
    return [(lo + d * np.arange(n, dtype=np.float64)).astype(dt)]


def _constant_of_shape(
    op: Dynamic, xs: list[np.ndarray], b: Mapping[str, int], run: RunGraph
) -> list:
    value, where = op.params
    dims = _sizes(_ints(xs[0], where, "the shape"), where, "the shape")
    return [np.full(dims, value, op.dtypes[0].np)]


def _expand(op: Dynamic, xs: list[np.ndarray], b: Mapping[str, int], run: RunGraph) -> list:
    """ONNX Expand: x and the target shape broadcast both ways (a 1 in the target keeps x's size)."""
    (where,) = op.params
    x, target = xs
    dims = _sizes(_ints(target, where, "the shape"), where, "the shape")
    try:
        out = np.broadcast_shapes(x.shape, tuple(dims))
    except ValueError:
        raise EvaluationError(
            f"{where}: cannot expand {list(x.shape)} to {dims} (sizes must be equal or 1)"
        ) from None
    return [np.ascontiguousarray(np.broadcast_to(x, out))]


def _reshape(op: Dynamic, xs: list[np.ndarray], b: Mapping[str, int], run: RunGraph) -> list:
    """ONNX Reshape: a 0 copies x's size on that axis (a size 0 with allowzero), one -1 is
    inferred from the element count."""
    allowzero, where = op.params
    x, target = xs
    given = _ints(target, where, "the shape")
    dims = list(given)
    for i, d in enumerate(given):
        if d < -1:
            raise EvaluationError(f"{where}: invalid size {d} in the shape {given}")
        if d == 0 and not allowzero:
            if i >= x.ndim:
                raise EvaluationError(
                    f"{where}: the shape {given} copies axis {i} of {list(x.shape)}, which has "
                    f"no such axis"
                )
            dims[i] = x.shape[i]
    if dims.count(-1) > 1 or (allowzero and -1 in dims and 0 in dims):
        raise EvaluationError(f"{where}: the shape {given} cannot be solved for its -1")
    if -1 in dims:
        rest = math.prod(d for d in dims if d != -1)
        if rest == 0 or x.size % rest:
            raise EvaluationError(
                f"{where}: cannot reshape {list(x.shape)} ({x.size} elements) to {given}"
            )
        dims[dims.index(-1)] = x.size // rest
    if math.prod(dims) != x.size:
        raise EvaluationError(
            f"{where}: cannot reshape {list(x.shape)} ({x.size} elements) to {given} "
            f"({math.prod(dims)} elements)"
        )
    return [np.ascontiguousarray(x).reshape(dims)]


def _tile(op: Dynamic, xs: list[np.ndarray], b: Mapping[str, int], run: RunGraph) -> list:
    (where,) = op.params
    x, repeats = xs
    reps = _sizes(_ints(repeats, where, "the repeats"), where, "the repeats")
    if len(reps) != x.ndim:
        raise EvaluationError(f"{where}: {len(reps)} repeats for rank {x.ndim}")
    return [np.tile(x, reps) if x.ndim else x.copy()]


# -- control flow ------------------------------------------------------------------------------
def _flag(a: np.ndarray, what: str) -> bool:
    a = np.asarray(a)
    if a.size != 1:
        raise EvaluationError(f"{what} must have one element, found shape {list(a.shape)}")
    return bool(a.reshape(-1)[0])


def _if(op: Dynamic, xs: list[np.ndarray], b: Mapping[str, int], run: RunGraph) -> list:
    then_g, else_g, n_then = op.params
    cond, caps = xs[0], xs[1:]
    if _flag(cond, "if: the condition"):
        return run(then_g, caps[:n_then], b)
    return run(else_g, caps[n_then:], b)


def _dims_or_zero(shape: Shape, bindings: Mapping[str, int]) -> list[int]:
    """The sizes of `shape` where bound; 0 where a symbol is not (a scan output of a loop that
    ran no iteration has no element to take its sizes from)."""
    return [d.eval(bindings) if d.symbols <= bindings.keys() else 0 for d in shape.dims]


def _stack(parts: list[np.ndarray], shape, dtype, bindings: Mapping[str, int]) -> np.ndarray:
    if parts:
        return np.stack(parts)
    return np.zeros([0, *_dims_or_zero(shape, bindings)[1:]], dtype.np)


def _loop(op: Dynamic, xs: list[np.ndarray], b: Mapping[str, int], run: RunGraph) -> list:
    body, has_m, has_cond, n_carried, n_scan = op.params
    xs = list(xs)
    trip = int(np.asarray(xs.pop(0)).reshape(-1)[0]) if has_m else None
    cond = _flag(xs.pop(0), "loop: the condition") if has_cond else True
    carried, caps = xs[:n_carried], xs[n_carried:]
    limit = max_loop_iterations()
    scans: list[list[np.ndarray]] = [[] for _ in range(n_scan)]
    i = 0
    while cond and (trip is None or i < trip):
        if i >= limit:
            raise EvaluationError(
                f"loop: still running after {limit} iterations (trip count "
                f"{'none' if trip is None else trip}); KN_MAX_LOOP_ITERATIONS raises the limit"
            )
        outs = run(body, [np.array(i, np.int64), np.array(cond), *carried, *caps], b)
        cond = _flag(outs[0], "loop: the body's condition")
        carried = outs[1 : 1 + n_carried]
        for j in range(n_scan):
            scans[j].append(outs[1 + n_carried + j])
        i += 1
    tail = op.shapes[n_carried:]
    return [*carried] + [
        _stack(p, tail[j], op.dtypes[n_carried + j], b) for j, p in enumerate(scans)
    ]


def _scan(op: Dynamic, xs: list[np.ndarray], b: Mapping[str, int], run: RunGraph) -> list:
    body, n_state, n_in, in_axes, in_rev, out_axes, out_rev = op.params
    state, ins, caps = xs[:n_state], xs[n_state : n_state + n_in], xs[n_state + n_in :]
    lengths = {a.shape[ax] for a, ax in zip(ins, in_axes, strict=True)}
    if len(lengths) > 1:
        raise EvaluationError(f"scan: the scan inputs have different lengths {sorted(lengths)}")
    n = lengths.pop() if lengths else 0
    outs_per_step: list[list[np.ndarray]] = []
    for t in range(n):
        sl = [
            np.take(a, n - 1 - t if r else t, axis=ax)
            for a, ax, r in zip(ins, in_axes, in_rev, strict=True)
        ]
        outs = run(body, [*state, *sl, *caps], b)
        state = outs[:n_state]
        outs_per_step.append(outs[n_state:])
    results = list(state)
    for j, (ax, r) in enumerate(zip(out_axes, out_rev, strict=True)):
        parts = [o[j] for o in outs_per_step]
        if r:
            parts = parts[::-1]
        shape, dt = op.shapes[n_state + j], op.dtypes[n_state + j]
        if parts:
            results.append(np.stack(parts, axis=ax))
        else:
            results.append(np.zeros(_dims_or_zero(shape, b), dt.np))
    return results


def _recurrence(op: Dynamic, xs: list[np.ndarray], b: Mapping[str, int], run: RunGraph) -> list:
    """One direction of an RNN / GRU / LSTM layer over all its steps (`kn_graph.recurrence`)."""
    (spec,) = op.params
    if not isinstance(spec, Recurrence):
        raise EvaluationError(f"recurrence: params {op.params!r}, expected one Recurrence")
    return run_recurrence(spec, xs)


KINDS: dict[str, Run] = {
    "nonzero": _nonzero,
    "topk": _topk,
    "nms": _nms,
    "unique": _unique,
    "slice": _slice,
    "scatter_elements": _scatter_elements,
    "scatter_nd": _scatter_nd,
    "range": _range,
    "constant_of_shape": _constant_of_shape,
    "expand": _expand,
    "reshape": _reshape,
    "tile": _tile,
    "if": _if,
    "loop": _loop,
    "scan": _scan,
    "recurrence": _recurrence,
}
CONTROL = frozenset({"if", "loop", "scan"})
"""Kinds with subgraphs (their first params are Graphs)."""


def run_dynamic(
    op: Dynamic, args: Sequence[np.ndarray], bindings: Mapping[str, int], run: RunGraph
) -> list[np.ndarray]:
    """Every result of `op` (not only `op.output`) computed on `args`."""
    fn = KINDS.get(op.kind)
    if fn is None:
        raise EvaluationError(f"dynamic op of unknown kind '{op.kind}'")
    return fn(op, list(args), bindings, run)


def bind_results(
    op: Dynamic, results: Sequence[np.ndarray], bindings: Mapping[str, int]
) -> dict[str, int]:
    """`bindings` plus the run-time symbols the results' sizes bind; ShapeMismatchError when a
    result contradicts its declared shape or dtype (e.g. If branches of different sizes where
    the graph assumed one)."""
    if len(results) != len(op.shapes):
        raise EvaluationError(f"{op.kind}: {len(results)} results, expected {len(op.shapes)}")
    for j, (r, dt) in enumerate(zip(results, op.dtypes, strict=True)):
        if r.dtype != dt.np:
            raise EvaluationError(f"{op.kind}: result {j} is {r.dtype}, expected {dt}")
    return infer_symbols(
        list(op.shapes),
        [r.shape for r in results],
        [f"{op.kind} result {j}" for j in range(len(results))],
        bindings,
    )


def outer_bindings(graph: GraphBase, bindings: Mapping[str, int]) -> dict[str, int]:
    """The enclosing graph's bindings of the symbols a subgraph's inputs use: a captured value
    of size `topk0 + topk1` cannot tell its two symbols apart, the enclosing graph can."""
    used: set[str] = set()
    for v in graph.inputs:
        used |= graph[v].shape.symbols
    return {k: v for k, v in bindings.items() if k in used}
