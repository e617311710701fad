"""The NumPy reference executor: the oracle every backend is checked against.

A short loop over values in index (= topological) order; each value is freed after its last use.

>>> from kn_graph import Graph, DType, Shape, Size
>>> g = Graph()
>>> x = g.input(Shape.of(Size.sym("B"), 3), DType.F32, "x")
>>> g.add_output(g.reduce(g.mul(x, 2.0), [1], ReduceOp.SUM), "y")
>>> evaluate(g, [np.ones((2, 3), np.float32)])[0]
array([6., 6.], dtype=float32)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import assert_never

import numpy as np

from kn_graph import numpy_ops
from kn_graph.binding import Inputs, available_bytes, bind_inputs
from kn_graph.blockquant import dequantize
from kn_graph.dynamic import bind_results, outer_bindings, run_dynamic
from kn_graph.errors import (
    EvaluationError,
    KnError,
    ShapeMismatchError,
)
from kn_graph.filemap import check_unchanged
from kn_graph.graph import Graph, ValueInfo
from kn_graph.ops import (
    Attention,
    Binary,
    BlockQuantMatMul,
    Broadcast,
    Concat,
    Constant,
    Conv,
    ConvDetails,
    Dynamic,
    Gather,
    Input,
    IntConv,
    IntMatMul,
    Iota,
    Layernorm,
    MatMul,
    Permute,
    Reduce,
    ReduceOp,
    Select,
    Slice,
    Softmax,
    Unary,
    View,
)

__all__ = ["evaluate"]


def evaluate(
    graph: Graph,
    inputs: Inputs,
    batch_size: int | None = None,
    *,
    known: Mapping[str, int] | None = None,
) -> list[np.ndarray]:
    """Evaluate the graph's outputs for the given inputs (a list in input order, or a name map);
    `known` pre-binds size symbols (an enclosing graph's, for a subgraph)."""
    arrays, bindings = bind_inputs(graph, inputs, batch_size, known)
    infos = graph.value_infos()
    operands = [tuple(x.index for x in info.op.inputs) for info in infos]
    last_use = list(range(len(infos)))
    for i, ops in enumerate(operands):
        for x in ops:
            last_use[x] = i
    keep = {v.index for v in graph.outputs}
    env: list[np.ndarray | None] = [None] * len(infos)
    budget = available_bytes()  # less what this evaluation holds (`held`, owned arrays only)
    held = 0
    owned = [0] * len(infos)
    memo: dict[Dynamic, list[np.ndarray]] = {}  # the results of each Dynamic op
    checked: set[int] = set()  # mapped model files found unchanged (one stat each)
    for i, info in enumerate(infos):
        try:
            if isinstance(info.op, Constant):
                check_unchanged(info.op.tensor.array, checked)
            if isinstance(info.op, Dynamic):
                bindings = _run_dynamic(graph, info.op, env, bindings, memo)
            shape = info.shape.eval(bindings)
            if isinstance(info.op, Iota):  # one arange along the axis, broadcast
                need = (shape[info.op.axis] if 0 not in shape else 0) * info.dtype.size
            else:
                need = 0 if isinstance(info.op, _FREE_OPS) else math.prod(shape) * info.dtype.size
            if need > budget - held:
                raise EvaluationError(
                    f"needs {need / 2**30:.3g} GiB for this value, have "
                    f"{max(budget - held, 0) / 2**30:.3g} GiB available"
                )
            result = _compute(info, shape, env, arrays, bindings, memo)
        except (EvaluationError, ShapeMismatchError) as e:  # an op's own check, an unbound symbol
            raise type(e)(f"while computing {graph.format_value(graph.value(i))}: {e}") from e
        except KnError:
            raise
        except Exception as e:  # numpy errors become ours, naming the value and its op
            raise EvaluationError(
                f"while computing {graph.format_value(graph.value(i))}: {type(e).__name__}: {e}"
            ) from e
        if result.shape != shape or result.dtype != info.dtype.np:
            raise EvaluationError(
                f"internal: {graph.format_value(graph.value(i))} produced {result.dtype}"
                f"{list(result.shape)}, expected {info.dtype}{list(shape)}"
            )
        env[i] = result
        if result.base is None:
            owned[i] = result.nbytes
            held += owned[i]
        for x in operands[i]:
            if last_use[x] == i and x not in keep and env[x] is not None:
                env[x] = None
                held -= owned[x]
                owned[x] = 0
    return [
        np.array(env[v.index]) for v in graph.outputs
    ]  # writable copies, never views of constants


_FREE_OPS = (Input, Constant, View, Broadcast, Permute, Slice, Iota, Dynamic)
"""Ops whose results are views (or given, or computed before the memory check): no new
memory at the check."""


def _run_graph(
    graph: Graph, inputs: list[np.ndarray], bindings: Mapping[str, int]
) -> list[np.ndarray]:
    return evaluate(graph, inputs, known=outer_bindings(graph, bindings))


def _run_dynamic(
    graph: Graph,
    op: Dynamic,
    env: list[np.ndarray | None],
    bindings: dict[str, int],
    memo: dict[Dynamic, list[np.ndarray]],
) -> dict[str, int]:
    """Run a Dynamic op once for all its results (memoised), bind the run-time symbols of its
    sizes and check the guards that mention them."""
    key = op.key
    if key in memo:
        return bindings
    args = []
    for x in op.args:
        a = env[x.index]
        assert a is not None, "value used after it was freed"
        args.append(a)
    results = run_dynamic(op, args, bindings, _run_graph)
    memo[key] = results
    new = bind_results(op, results, bindings)
    if new.keys() != bindings.keys():
        graph.check_bindings(new)
    return new


def _compute(
    info: ValueInfo,
    shape: tuple[int, ...],
    env: list[np.ndarray | None],
    inputs: list[np.ndarray],
    bindings: dict[str, int],
    memo: dict[Dynamic, list[np.ndarray]],
) -> np.ndarray:
    def get(x: object) -> np.ndarray:
        a = env[x.index]  # type: ignore[attr-defined]
        assert a is not None, "value used after it was freed"
        return a

    dt = info.dtype.np
    match info.op:
        case Input(index):
            return inputs[index]
        case Constant(tensor):
            return tensor.array
        case View(x):
            return get(x).reshape(shape)
        case Broadcast(x):
            return np.broadcast_to(get(x), shape)
        case Permute(x, perm):
            return get(x).transpose(perm)
        case Slice(x, axis, start, step):
            a = get(x)
            s = start.eval(bindings)
            count = shape[axis]
            if count == 0:
                return a[(slice(None),) * axis + (slice(0, 0),)]
            last = s + step * (count - 1)
            end = last + (1 if step > 0 else -1)
            return a[(slice(None),) * axis + (slice(s, None if end < 0 else end, step),)]
        case Gather(x, axis, indices):
            a, idx = get(x), get(indices)
            n = a.shape[axis]
            bad = (idx < 0) | (idx >= n)
            if bad.any():
                raise EvaluationError(
                    f"gather: index {idx[bad][0]} out of range [0, {n}) on axis {axis}"
                )
            return np.take(a, idx, axis=axis)
        case Concat(xs, axis):
            return np.concatenate([get(x) for x in xs], axis=axis)
        case Conv(x, w, details):
            return _conv(get(x), get(w), details)
        case MatMul(a, b):
            with np.errstate(over="ignore", invalid="ignore"):  # NaN/Inf flow, as in every op
                return np.matmul(get(a), get(b))
        case BlockQuantMatMul(a, packed, scales, zeros, bits, block):
            x = get(a)
            w = dequantize(get(packed), get(scales), get(zeros), bits, block, x.shape[1])
            with np.errstate(over="ignore", invalid="ignore"):
                return np.matmul(x, w.T.astype(x.dtype))
        case IntMatMul(a, b, za, zb):
            return _wrap_i32(np.matmul(_shifted(get(a), get(za)), _shifted(get(b), get(zb))))
        case IntConv(x, w, zx, zw, details):
            zw_k = get(zw).reshape((-1,) + (1,) * (len(get(w).shape) - 1))
            return _wrap_i32(_conv(_shifted(get(x), get(zx)), _shifted(get(w), zw_k), details))
        case Unary(x, op):
            return numpy_ops.unary(op, get(x), dt)
        case Binary(a, b, op):
            return numpy_ops.binary(op, get(a), get(b))
        case Select(c, a, b):
            return np.where(get(c), get(a), get(b))
        case Iota(axis):
            if 0 in shape:
                return np.empty(shape, dt)
            r = np.arange(shape[axis], dtype=dt).reshape(
                [-1 if i == axis else 1 for i in range(len(shape))]
            )
            return np.broadcast_to(r, shape)
        case Softmax(x, axis):
            return _softmax(get(x), axis)
        case Layernorm(x, axis, eps):
            return _layernorm(get(x), axis, eps)
        case Reduce(x, axes, op):
            return _reduce(op, get(x), axes, dt)
        case Attention(q, k, v, mask, scale, causal):
            return _attention(
                get(q), get(k), get(v), None if mask is None else get(mask), scale, causal
            )
        case Dynamic():
            return memo[info.op.key][info.op.output]
        case _:
            assert_never(info.op)  # type: ignore[arg-type]


def _softmax(a: np.ndarray, axis: int) -> np.ndarray:
    if a.dtype == np.float16:
        return _softmax(a.astype(np.float32), axis).astype(np.float16)
    if a.size == 0:
        return a.copy()
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(a - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def _attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, scale: float, causal: bool
) -> np.ndarray:
    """softmax(q·kᵀ·scale + mask, causal: -inf where j > i + n - m)·v; f16 math in f32."""
    if q.dtype == np.float16:
        m32 = None if mask is None else mask.astype(np.float32)
        f32 = (q.astype(np.float32), k.astype(np.float32), v.astype(np.float32))
        return _attention(*f32, m32, scale, causal).astype(np.float16)
    with np.errstate(over="ignore", invalid="ignore"):
        s = np.matmul(q, k.transpose(0, 2, 1)) * q.dtype.type(scale)
        if mask is not None:
            s = s + mask
        if causal:
            m, n = s.shape[1], s.shape[2]
            above = np.arange(n)[None, :] > np.arange(m)[:, None] + (n - m)
            s = np.where(above, q.dtype.type(-np.inf), s)
        return np.matmul(_softmax(s, 2), v).astype(q.dtype, copy=False)


def _layernorm(a: np.ndarray, axis: int, eps: float) -> np.ndarray:
    if a.dtype == np.float16:
        return _layernorm(a.astype(np.float32), axis, eps).astype(np.float16)
    mean = np.mean(a, axis=axis, keepdims=True)
    d = a - mean
    var = np.mean(d * d, axis=axis, keepdims=True)
    return (d / np.sqrt(var + a.dtype.type(eps))).astype(a.dtype, copy=False)


def _reduce(op: ReduceOp, a: np.ndarray, axes: tuple[int, ...], dt: np.dtype) -> np.ndarray:
    # reduced axes that are broadcasts (stride 0) hold one value n times: reduce one copy
    # (sum of 2^40 broadcast ones would otherwise take hours)
    rep = [ax for ax in axes if a.strides[ax] == 0 and a.shape[ax] > 1]
    if rep and not op.is_arg and 0 not in a.shape:
        n = math.prod(a.shape[ax] for ax in rep)
        a = a[tuple(slice(0, 1) if ax in rep else slice(None) for ax in range(a.ndim))]
        out = _reduce(op, a, axes, dt)
        with np.errstate(all="ignore"):
            if op is ReduceOp.SUM:
                acc = _acc(a.dtype)
                return (out.astype(acc) * acc.type(n)).astype(dt, copy=False)
            if op is ReduceOp.PROD:
                acc = _acc(a.dtype)
                return np.power(out.astype(acc), n).astype(dt, copy=False)
        return out  # mean, min, max of n equal values
    with np.errstate(all="ignore"):
        match op:
            case ReduceOp.SUM:  # f16 accumulates in f32, as the GPU kernels do
                return np.sum(a, axis=axes, dtype=_acc(a.dtype)).astype(dt, copy=False)
            case ReduceOp.PROD:
                return np.prod(a, axis=axes, dtype=_acc(a.dtype)).astype(dt, copy=False)
            case ReduceOp.MEAN:
                acc = np.float32 if a.dtype == np.float16 else a.dtype
                return np.mean(a, axis=axes, dtype=acc).astype(dt)
            case ReduceOp.MIN:
                return np.min(a, axis=axes, initial=_extreme(a.dtype, True))
            case ReduceOp.MAX:
                return np.max(a, axis=axes, initial=_extreme(a.dtype, False))
            case ReduceOp.ARGMIN | ReduceOp.ARGMAX if a.shape[axes[0]] == 0:
                raise EvaluationError(
                    f"{op.value} over axis {axes[0]}, which is empty (shape {list(a.shape)})"
                )
            case ReduceOp.ARGMIN:
                return np.argmin(a, axis=axes[0]).astype(np.int64)
            case ReduceOp.ARGMAX:
                return np.argmax(a, axis=axes[0]).astype(np.int64)
            case _:
                assert_never(op)


def _acc(dtype: np.dtype) -> np.dtype:
    """The accumulator type of a reduction: f32 for f16, else the type itself."""
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def _extreme(dtype: np.dtype, high: bool) -> object:
    if dtype.kind == "f":
        return dtype.type(np.inf if high else -np.inf)
    if dtype.kind == "b":
        return high
    info = np.iinfo(dtype)
    return info.max if high else info.min


def _shifted(q: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """q - zero in float64: exact for 8-bit operands, and sums of their products stay exact up
    to 2^53 (BLAS speed for an integer GEMM, which NumPy computes without BLAS)."""
    return q.astype(np.float64) - zero.astype(np.float64)


def _wrap_i32(acc: np.ndarray) -> np.ndarray:
    """An exact integral float64 sum as an int32 accumulator holds it (wrapping past 2^31)."""
    return acc.astype(np.int64).astype(np.int32)


def _conv(x: np.ndarray, w: np.ndarray, d: ConvDetails) -> np.ndarray:
    """Cross-correlation as one batched matmul per group over stacked shifted views (im2col)."""
    nd = d.rank
    if x.dtype == np.float16:
        return _conv(x.astype(np.float32), w.astype(np.float32), d).astype(np.float16)
    n, c, *sp = x.shape
    k_out, cg, *ks = w.shape
    g = d.groups
    xp = x
    if any(d.padding):  # zero padding by hand: np.pad's generality costs more than the copy
        xp = np.zeros((n, c, *(m + 2 * p for m, p in zip(sp, d.padding, strict=True))), x.dtype)
        xp[
            (
                slice(None),
                slice(None),
                *(slice(p, p + m) for m, p in zip(sp, d.padding, strict=True)),
            )
        ] = x
    geo = list(zip(xp.shape[2:], ks, d.stride, d.dilation, strict=True))
    out_sp = tuple((m - dl * (k - 1) - 1) // s + 1 for m, k, s, dl in geo)
    # one strided view [N, C, *out] per kernel offset: basic slicing, no copy
    views = [
        xp[
            (
                slice(None),
                slice(None),
                *(
                    slice(o * dl, o * dl + (q - 1) * s + 1, s)
                    for o, q, (_, _, s, dl) in zip(offs, out_sp, geo, strict=True)
                ),
            )
        ]
        for offs in np.ndindex(*ks)
    ]
    if cg == 1 and k_out == g:  # depthwise: a weighted sum of the views
        wk = w.reshape(c, -1)
        acc = views[0] * wk[:, 0].reshape((c,) + (1,) * nd)
        for i in range(1, len(views)):
            acc += views[i] * wk[:, i].reshape((c,) + (1,) * nd)
        return acc
    p = math.prod(out_sp)
    cols = views[0] if len(views) == 1 else np.stack(views, axis=2)  # [N, C, K, *out]
    cols = cols.reshape(n, g, cg * len(views), p)  # (cg, k) order matches the filter layout
    wm = w.reshape(g, k_out // g, cg * len(views))
    out = np.matmul(wm[None], cols)  # [N, G, Kg, P]
    return out.reshape((n, k_out, *out_sp))
