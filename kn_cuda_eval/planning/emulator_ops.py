"""NumPy semantics of the elementwise program instructions, written to match the generated C
(not the reference executor): f16 values are held in f32 between instructions, as the kernels
do. The element ops are `kn_graph.numpy_ops` (the reference executor's table), overridden only
where the kernels' semantics differ (`_binary`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kn_cuda_eval.planning.program import Bin, Const, Index, Load, Program, Sel, Un
from kn_graph import numpy_ops
from kn_graph.dtype import DType
from kn_graph.ops import BinaryOp, UnaryOp

__all__ = ["compute_dtype", "eval_program", "index_values"]


def compute_dtype(dt: DType) -> np.dtype:
    """The type a value of `dt` is held in inside a kernel (f16 → f32)."""
    return np.dtype(np.float32) if dt is DType.F16 else dt.np


def _round(a: np.ndarray, dt: DType) -> np.ndarray:
    """Rounding to the storage type and back, as a cast to f16 does in a kernel."""
    if dt is DType.F16:
        return np.asarray(a).astype(np.float16).astype(np.float32)
    return np.asarray(a).astype(dt.np)


def index_values(offset: int, shape: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    """Element addresses of an index view (i64 virtual space; `offset` in bytes)."""
    out = np.full((1,) * len(shape), offset // 8, dtype=np.int64)
    for k, (d, s) in enumerate(zip(shape, strides, strict=True)):
        if s:
            r = np.arange(d, dtype=np.int64) * s
            out = out + r.reshape([-1 if j == k else 1 for j in range(len(shape))])
    return np.broadcast_to(out, tuple(shape))


def _unary(op: UnaryOp, a: np.ndarray, src: DType, dt: DType) -> np.ndarray:
    """`numpy_ops` on compute-type values; the result is brought to `dt`'s compute type by the
    caller (so a cast to f16 rounds there, as the kernel's `__float2half`)."""
    match op:
        case UnaryOp.CAST:
            return numpy_ops.cast(a, dt.np)
        case UnaryOp.BITCAST:  # the stored bits: an f16 value is stored as half first
            stored = np.ascontiguousarray(np.asarray(a).astype(src.np))
            return numpy_ops.bitcast(stored, dt.np)
        case _ if op.float_only and not src.is_float:  # the kernels have no C for it either
            raise ValueError(f"unary {op.value} on {src}")
        case _:
            return np.asarray(numpy_ops.UNARY[op](a))


def _int_pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exponentiation by squaring in the operand type; a negative exponent gives 1/a truncated."""
    a, b = np.broadcast_arrays(a, b)
    out = np.power(a, np.maximum(b, 0))
    neg = b < 0
    if neg.any():
        inv = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0))
        out = np.where(neg, inv, out)
    return out.astype(a.dtype)


def _float_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`kn_pymod_f`: fmod, plus b where the signs differ."""
    r = np.fmod(a, b)
    return np.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


def _binary(op: BinaryOp, a: np.ndarray, b: np.ndarray, src: DType) -> np.ndarray:
    """`numpy_ops.BINARY` but where the kernels differ from the reference executor:
    - integer POW with a negative exponent: `kn_ipow` gives 1/a truncated (1, -1 or 0); the
      reference refuses it (ONNX leaves it undefined);
    - float MOD: `kn_pymod_f` (fmod, then + b where the signs differ) gives a zero remainder
      the sign of a, where NumPy's `mod` gives it the sign of b."""
    match op:
        case BinaryOp.POW if src.is_int:
            return _int_pow(a, b)
        case BinaryOp.MOD if src.is_float:
            return _float_mod(a, b)
        case _:
            return numpy_ops.BINARY[op](a, b)


_FREED = np.empty(0)


def eval_program(
    prog: Program, loads: Sequence[np.ndarray], indices: Sequence[np.ndarray]
) -> list[np.ndarray]:
    """The program's values (in compute types), operands already read from the arena. A value
    that is no root is replaced by an empty array after its last use, so a long fused chain
    holds a few full-size arrays at a time, not one per instruction."""
    n = len(prog.instrs)
    last = list(range(n))
    for k, ins in enumerate(prog.instrs):
        for x in ins.operands:
            last[x] = k
    for r in prog.roots:
        last[r] = n
    vals: list[np.ndarray] = []
    dts: list[DType] = []
    with np.errstate(all="ignore"):
        for k, ins in enumerate(prog.instrs):
            match ins:
                case Load(arg, dt):
                    v = np.asarray(loads[arg]).astype(compute_dtype(dt), copy=False)
                case Index(arg, dt):
                    v = _round(indices[arg], dt) if dt is not DType.BOOL else indices[arg] != 0
                case Const(value, dt):
                    v = (
                        _round(np.array(value), dt)
                        if dt is not DType.BOOL
                        else np.array(bool(value))
                    )
                case Un(op, x, dt):
                    v = _unary(op, vals[x], dts[x], dt)
                case Bin(op, a, b, dt):
                    v = _binary(op, vals[a], vals[b], dts[a])
                case Sel(c, a, b, dt):
                    v = np.where(vals[c], vals[a], vals[b])
            vals.append(np.asarray(v).astype(compute_dtype(ins.dtype), copy=False))
            dts.append(ins.dtype)
            for x in ins.operands:
                if last[x] == k:
                    vals[x] = _FREED
    return vals
