"""The plan emulator: runs a plan's steps on the CPU over a `uint8` array standing in for the
arena, reading and writing through the planned offsets and strides exactly as the device would —
so a wrong offset, an overlap or a missed copy gives a wrong answer. It sees only the plan.

GEMMs are emulated from their cuBLAS arguments (m, n, k, transposes, leading dimensions, batch
strides); the arena starts filled with 0xFF bytes (NaN for floats) so reading memory nothing wrote
shows up. A plan is validated before its first emulation, and the arena and each step's scratch
are checked against the memory available before anything is allocated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import assert_never

import numpy as np

from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.emulator_ops import compute_dtype, eval_program, index_values
from kn_cuda_eval.planning.limits import check_plan
from kn_cuda_eval.planning.plan import Plan
from kn_cuda_eval.planning.view import StridedView
from kn_graph.binding import available_bytes
from kn_graph.blockquant import dequantize
from kn_graph.dtype import DType
from kn_graph.errors import EvaluationError, InputMismatchError
from kn_graph.ops import ReduceOp

__all__ = ["emulate", "emulate_step", "load_arena", "plan_inputs", "view_array"]


def _nd(arena: np.ndarray, v: StridedView) -> np.ndarray:
    """The view as a NumPy array aliasing the arena (bounds-checked by NumPy)."""
    if v.numel == 0:
        return np.zeros(v.shape, v.dtype.np)
    size = v.itemsize
    return np.ndarray(
        v.shape,
        v.dtype.np,
        buffer=arena,
        offset=v.offset,
        strides=tuple(s * size for s in v.strides),
    )


def _store(arena: np.ndarray, v: StridedView, value: np.ndarray) -> None:
    if v.numel == 0:
        return
    if v.dtype is DType.BOOL:
        value = np.asarray(value) != 0
    _nd(arena, v)[...] = np.asarray(value).astype(v.dtype.np)


def _expr(arena: np.ndarray, e: st.Expr) -> np.ndarray:
    loads = [_nd(arena, v) for v in e.inputs]
    idx = [index_values(v.offset, v.shape, v.strides) for v in e.indices]
    vals = eval_program(e.program, loads, idx)
    return np.broadcast_to(vals[e.program.roots[0]], e.shape)


def emulate(
    plan: Plan, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]
) -> list[np.ndarray]:
    """Execute `plan` on the CPU; returns the outputs as fresh arrays."""
    arena = load_arena(plan, inputs)
    for k, s in enumerate(plan.steps):
        emulate_step(arena, k, s)
    return [np.array(_nd(arena, v)) for v in plan.outputs]


def load_arena(plan: Plan, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> np.ndarray:
    """The arena before the first step: 0xFF everywhere, then the constants, the inputs and a
    zero status word (what `emulate` starts from; the host kernel check steps through it)."""
    arrays = plan_inputs(plan, inputs)
    plan.validate_once()
    have = available_bytes()
    if plan.arena_size > have:
        raise EvaluationError(
            f"emulate: needs {_gib(plan.arena_size)} GiB for the arena, have {_gib(have)} GiB "
            "available"
        )
    budget = have - plan.arena_size
    for k, s in enumerate(plan.steps):
        need = _scratch_bytes(s)
        if need > budget:
            raise EvaluationError(
                f"emulate: step {k} ({s.describe()[:200]}) needs about {_gib(need)} GiB of "
                f"scratch, have {_gib(budget)} GiB available beside the arena"
            )
    check_plan(plan, who="emulate")  # the outputs' copies too (a Tile of 2^40 elements)
    arena = np.full(plan.arena_size, 0xFF, dtype=np.uint8)
    for off, data in plan.constants:
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        arena[off : off + raw.size] = raw
    for v, a in zip(plan.inputs, arrays, strict=True):
        _store(arena, v, a)
    _store(arena, plan.status, np.zeros((), np.uint32))
    return arena


def plan_inputs(
    plan: Plan, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]
) -> list[np.ndarray]:
    """The inputs (in order, or by name) as arrays in the plan's order, each checked against its
    view's shape and dtype (InputMismatchError); what every host-side plan runner reads."""
    if isinstance(inputs, Mapping):
        missing = [n for n in plan.input_names if n not in inputs]
        if missing:
            raise InputMismatchError(
                f"missing inputs {missing}; the plan takes {list(plan.input_names)}"
            )
        arrays = [inputs[n] for n in plan.input_names]
    else:
        arrays = list(inputs)
    if len(arrays) != len(plan.inputs):
        raise InputMismatchError(f"expected {len(plan.inputs)} inputs, found {len(arrays)}")
    out = []
    for name, v, a in zip(plan.input_names, plan.inputs, arrays, strict=True):
        a = np.asarray(a)
        if a.shape != v.shape or a.dtype != v.dtype.np:
            raise InputMismatchError(
                f"input '{name}': expected {v.dtype}{list(v.shape)}, found {a.dtype}{list(a.shape)}"
            )
        out.append(a)
    return out


view_array = _nd


def emulate_step(arena: np.ndarray, k: int, s: st.Step) -> None:
    """Execute step `k` of a plan over `arena`; errors name the step."""
    try:
        _step(arena, s)
    except EvaluationError as e:
        raise EvaluationError(f"step {k} ({s.describe()}): {e}") from None
    except MemoryError as e:  # the estimate was short: still ours, naming the step
        raise EvaluationError(f"step {k} ({s.describe()[:200]}): out of memory: {e}") from e


def _gib(n: int) -> str:
    x = n / 2**30
    return f"{x:.3g}" if x < 1000 else f"{x:,.0f}"


def _scratch_bytes(s: st.Step) -> int:
    """About the most the emulator allocates beside the arena for one step: f64-wide
    temporaries (a few values of a fused program alive at once), the operands a GEMM or a
    convolution converts, the im2col matrix."""
    match s:
        case st.Elementwise():
            return 3 * 8 * math.prod(s.shape)
        case st.Reduce(x) | st.Softmax(x) | st.Layernorm(x):
            return 3 * 8 * math.prod(x.shape)
        case st.Copy(src):
            return src.nbytes
        case st.MatMul():
            return 8 * s.batch * (s.m * s.k + s.k * s.n + 2 * s.m * s.n)
        case st.Conv() | st.IntConv():
            ks = math.prod(s.w.shape[2:])
            cols = s.out.numel * s.x.shape[1] // s.groups * ks
            return 8 * (cols + 2 * s.out.numel + s.x.numel + s.w.numel)
        case st.IntMatMul():
            return 8 * (s.a.numel + s.b.numel + 2 * s.out.numel)
        case st.BlockQuantMatMul():
            return 4 * (s.a.numel + s.out.numel + 2 * s.out.shape[1] * s.a.shape[1])
        case st.Gather():
            return 8 * (s.out.numel + s.indices.numel)
        case st.Attention():
            scores = math.prod(s.q.shape[:-1]) * s.k.shape[-2]
            return 8 * (3 * scores + s.q.numel + s.k.numel + s.v.numel + s.out.numel)
        case _:
            assert_never(s)


def _step(arena: np.ndarray, s: st.Step) -> None:
    match s:
        case st.Elementwise():
            loads = [_nd(arena, v) for v in s.inputs]
            idx = [index_values(v.offset, v.shape, v.strides) for v in s.indices]
            vals = eval_program(s.program, loads, idx)
            results = [np.broadcast_to(vals[r], s.shape) for r in s.program.roots]
            for out, val in zip(s.outputs, results, strict=True):
                _store(arena, out, val)
        case st.Copy(src, dst):
            _store(arena, dst, np.array(_nd(arena, src)))
        case st.MatMul():
            _gemm(arena, s)
        case st.Conv():
            _conv(arena, s)
        case st.IntMatMul():
            _int_matmul(arena, s)
        case st.IntConv():
            _int_conv(arena, s)
        case st.BlockQuantMatMul():
            a = _nd(arena, s.a)
            consts = (_nd(arena, v) for v in (s.packed, s.scales, s.zeros))
            w = dequantize(*consts, s.bits, s.block, s.a.shape[1])
            _store(arena, s.out, np.matmul(a, w.T.astype(a.dtype)))
        case st.Reduce(x, out, op):
            _store(
                arena,
                out,
                _reduce(_expr(arena, x), op, len(x.shape) - out.rank, x.dtype, out.dtype),
            )
        case st.Softmax(x, out):
            _store(arena, out, _softmax(_expr(arena, x).astype(compute_dtype(x.dtype))))
        case st.Layernorm(x, out, eps):
            _store(arena, out, _layernorm(_expr(arena, x).astype(compute_dtype(x.dtype)), eps))
        case st.Gather(x, indices, out, axis):
            xa, ia = _nd(arena, x), _nd(arena, indices).astype(np.int64)
            n = x.shape[axis]
            bad = (ia < 0) | (ia >= n)
            if bad.any():
                raise EvaluationError(f"gather: index {ia[bad][0]} out of range [0, {n})")
            _store(arena, out, np.take(xa, ia, axis=axis))
        case st.Attention():
            _attention(arena, s)
        case _:
            assert_never(s)


def _matrix(arena: np.ndarray, v: StridedView) -> np.ndarray:
    """A cuBLAS operand as stored ([batch, cols, rows] view) → [batch, rows, cols]."""
    return _nd(arena, v).transpose(0, 2, 1)


def _gemm(arena: np.ndarray, s: st.MatMul) -> None:
    ct = np.float64 if s.dtype is DType.F64 else np.float32
    a = _matrix(arena, s.a).astype(ct)
    b = _matrix(arena, s.b).astype(ct)
    opa = a.transpose(0, 2, 1) if s.transa else a
    opb = b.transpose(0, 2, 1) if s.transb else b
    assert opa.shape[1:] == (s.m, s.k) and opb.shape[1:] == (s.k, s.n), (opa.shape, opb.shape, s)
    with np.errstate(all="ignore"):
        c = np.matmul(opa, opb) * ct(s.alpha)
        if s.beta != 0:
            c = c + np.multiply(_matrix(arena, s.c).astype(ct), ct(s.beta))
    _store(arena, s.c, c.transpose(0, 2, 1))


def _conv(arena: np.ndarray, s: st.Conv) -> None:
    ct = np.float64 if s.out.dtype is DType.F64 else np.float32
    x = _nd(arena, s.x).astype(ct)
    w = _nd(arena, s.w).astype(ct)
    y = _correlate(x, w, s.stride, s.padding, s.dilation, s.groups)
    nd = len(s.stride)
    if s.bias is not None:
        y = y + _nd(arena, s.bias).astype(ct).reshape((1, w.shape[0]) + (1,) * nd)
    if s.residual is not None:
        y = y + _nd(arena, s.residual).astype(ct)
    if s.relu:
        y = np.maximum(y, 0)
    _store(arena, s.out, y)


def _correlate(
    x: np.ndarray,
    w: np.ndarray,
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    dilation: tuple[int, ...],
    g: int,
) -> np.ndarray:
    """Cross-correlation of x [N, C, *spatial] with w [K, C/g, *k], zero-padded, as one batched
    matmul per group over stacked shifted views (im2col), in x's float type."""
    nd = len(stride)
    n, c = x.shape[:2]
    k_out = w.shape[0]
    ks = w.shape[2:]
    xp = np.pad(x, [(0, 0), (0, 0), *((p, p) for p in padding)])
    span = tuple(d * (k - 1) + 1 for d, k in zip(dilation, ks, strict=True))
    win = np.lib.stride_tricks.sliding_window_view(xp, span, axis=tuple(range(2, 2 + nd)))
    sel = (
        slice(None),
        slice(None),
        *(slice(None, None, st_) for st_ in stride),
        *(slice(None, None, d) for d in dilation),
    )
    win = win[sel]
    out_sp = win.shape[2 : 2 + nd]
    cg = c // g
    win = win.reshape((n, g, cg, *out_sp, *ks))
    perm = (0, 1, *range(3, 3 + nd), 2, *range(3 + nd, 3 + 2 * nd))
    cols = win.transpose(perm).reshape(n, g, int(np.prod(out_sp)), cg * int(np.prod(ks)))
    wm = w.reshape(g, k_out // g, cg * int(np.prod(ks)))
    return (
        np.matmul(cols, wm.transpose(0, 2, 1)[None])
        .transpose(0, 1, 3, 2)
        .reshape((n, k_out, *out_sp))
    )


def _shifted(q: np.ndarray, zero: np.ndarray) -> np.ndarray:
    """q - zero in float64: exact for 8-bit operands, and so is every sum of their products
    below 2^37 terms (as the reference executor computes integer products)."""
    return q.astype(np.float64) - zero.astype(np.float64)


def _int_matmul(arena: np.ndarray, s: st.IntMatMul) -> None:
    a = _shifted(_nd(arena, s.a), _nd(arena, s.a_zero))
    b = _shifted(_nd(arena, s.b), _nd(arena, s.b_zero))
    _store(arena, s.out, np.matmul(a, b).astype(np.int64))  # the i32 store wraps, as a sum


def _int_conv(arena: np.ndarray, s: st.IntConv) -> None:
    x = _shifted(_nd(arena, s.x), _nd(arena, s.x_zero))  # padding: zero after the shift
    zw = _nd(arena, s.w_zero).reshape((-1,) + (1,) * (s.w.rank - 1))
    acc = _correlate(x, _shifted(_nd(arena, s.w), zw), s.stride, s.padding, s.dilation, s.groups)
    _store(arena, s.out, acc.astype(np.int64))


def _reduce(x: np.ndarray, op: ReduceOp, nred: int, xdt: DType, odt: DType) -> np.ndarray:
    axes = tuple(range(x.ndim - nred, x.ndim))
    ct = compute_dtype(xdt)
    xa = np.asarray(x).astype(ct, copy=False)
    with np.errstate(all="ignore"):
        match op:
            case ReduceOp.SUM:
                return np.sum(xa, axis=axes, dtype=ct)
            case ReduceOp.PROD:
                return np.prod(xa, axis=axes, dtype=ct)
            case ReduceOp.MEAN:
                cnt = int(np.prod([x.shape[a] for a in axes]))
                return (
                    np.sum(xa, axis=axes, dtype=ct) / ct.type(cnt)
                    if cnt
                    else np.full(x.shape[: x.ndim - nred], np.nan, ct)
                )
            case ReduceOp.MIN | ReduceOp.MAX:
                hi = op is ReduceOp.MIN
                if ct.kind == "f":
                    init = ct.type(np.inf if hi else -np.inf)
                elif ct.kind == "b":
                    init = hi
                else:
                    info = np.iinfo(ct)
                    init = info.max if hi else info.min
                if hi:
                    return np.min(xa, axis=axes, initial=init)
                return np.max(xa, axis=axes, initial=init)
            case ReduceOp.ARGMIN | ReduceOp.ARGMAX:
                flat = xa.reshape((*x.shape[: x.ndim - nred], -1))
                if flat.shape[-1] == 0:
                    return np.zeros(flat.shape[:-1], np.int64)
                if op is ReduceOp.ARGMIN:
                    return np.argmin(flat, axis=-1).astype(np.int64)
                return np.argmax(flat, axis=-1).astype(np.int64)
            case _:
                assert_never(op)


def _softmax(a: np.ndarray) -> np.ndarray:
    if a.size == 0:
        return a
    with np.errstate(all="ignore"):
        m = np.max(a, axis=-1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0)
        e = np.exp(a - m)
        return e / np.sum(e, axis=-1, keepdims=True)


def _layernorm(a: np.ndarray, eps: float) -> np.ndarray:
    with np.errstate(all="ignore"):
        mean = np.mean(a, axis=-1, keepdims=True)
        d = a - mean
        var = np.mean(d * d, axis=-1, keepdims=True)
        return d / np.sqrt(var + a.dtype.type(eps))


def _attention(arena: np.ndarray, s: st.Attention) -> None:
    ct = np.float64 if s.out.dtype is DType.F64 else np.float32
    q = _nd(arena, s.q).astype(ct)
    k = _nd(arena, s.k).astype(ct)
    v = _nd(arena, s.v).astype(ct)
    with np.errstate(all="ignore"):
        sc = np.matmul(q, np.swapaxes(k, -1, -2)) * ct(s.scale)
        if s.mask is not None:
            sc = sc + _nd(arena, s.mask).astype(ct)
        if s.causal:
            m, n = sc.shape[-2], sc.shape[-1]
            above = np.arange(n)[None, :] > np.arange(m)[:, None] + (n - m)
            sc = np.where(above, ct(-np.inf), sc)
        _store(arena, s.out, np.matmul(_softmax(sc), v))
