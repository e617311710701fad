"""NumPy semantics of the elementwise program instructions, written to match the generated C
(not the CPU executor): f16 values are held in f32 between instructions, integer division
truncates and gives 0 for a zero divisor, as the kernels do."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import scipy.special

from kn_cuda_eval.planning.program import Bin, Const, Index, Load, Program, Sel, Un
from kn_graph.dtype import DType, float_to_int
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


_SQRT1_2 = 1.0 / math.sqrt(2.0)
_SQRT2_PI = math.sqrt(2.0 / math.pi)


def _f(a: np.ndarray, f: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    return np.asarray(f(a)).astype(a.dtype, copy=False)


_FLOAT_UNARY: dict[UnaryOp, Callable[[np.ndarray], np.ndarray]] = {
    UnaryOp.ABS: np.abs,
    UnaryOp.NEG: np.negative,
    UnaryOp.SIN: np.sin,
    UnaryOp.COS: np.cos,
    UnaryOp.TAN: np.tan,
    UnaryOp.ASIN: np.arcsin,
    UnaryOp.ACOS: np.arccos,
    UnaryOp.ATAN: np.arctan,
    UnaryOp.SINH: np.sinh,
    UnaryOp.COSH: np.cosh,
    UnaryOp.ASINH: np.arcsinh,
    UnaryOp.ACOSH: np.arccosh,
    UnaryOp.ATANH: np.arctanh,
    UnaryOp.EXP: np.exp,
    UnaryOp.LOG: np.log,
    UnaryOp.SQRT: np.sqrt,
    UnaryOp.SIGMOID: lambda a: _f(a, scipy.special.expit),
    UnaryOp.TANH: np.tanh,
    UnaryOp.ERF: lambda a: _f(a, scipy.special.erf),
    UnaryOp.SOFTPLUS: lambda a: np.logaddexp(a.dtype.type(0), a),
    UnaryOp.RECIPROCAL: np.reciprocal,
    UnaryOp.FLOOR: np.floor,
    UnaryOp.CEIL: np.ceil,
    UnaryOp.ROUND: np.rint,
    UnaryOp.SIGN: np.sign,
    UnaryOp.GELU: lambda a: _f(a, lambda x: x * 0.5 * (1.0 + scipy.special.erf(x * _SQRT1_2))),
    UnaryOp.GELU_TANH: lambda a: _f(
        a, lambda x: 0.5 * x * (1.0 + np.tanh(_SQRT2_PI * (x + 0.044715 * x**3)))
    ),
    UnaryOp.SILU: lambda a: _f(a, lambda x: x * scipy.special.expit(x)),
}


def _unary(op: UnaryOp, a: np.ndarray, src: DType, dt: DType) -> np.ndarray:
    if op is UnaryOp.CAST:
        if dt is DType.BOOL:
            return np.asarray(a != 0)
        if src.is_float and not dt.is_float and not dt.is_bool:
            return float_to_int(a, dt.np)  # toward zero, saturating, NaN -> 0
        return _round(a, dt)
    if op is UnaryOp.BITCAST:
        stored = np.ascontiguousarray(np.asarray(a).astype(src.np))
        return np.asarray(stored.view(dt.np)).astype(compute_dtype(dt))
    if op is UnaryOp.NOT:
        return np.logical_not(a)
    if op is UnaryOp.BIT_NOT:
        return np.invert(a)
    if not src.is_float:
        match op:
            case UnaryOp.ABS:
                return np.abs(a)
            case UnaryOp.NEG:
                return np.negative(a)
            case UnaryOp.SIGN:
                return np.sign(a)
            case _:
                raise ValueError(f"unary {op.value} on {src}")
    return np.asarray(_FLOAT_UNARY[op](a))


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    safe = np.where(b == 0, 1, b)
    q = np.trunc(a.astype(np.float64) / safe) if a.dtype.itemsize < 8 else None
    if q is None:  # 64-bit: exact integer truncating division
        fl = np.floor_divide(a, safe)
        fix = (np.remainder(a, safe) != 0) & ((a < 0) != (safe < 0))
        return np.where(b == 0, 0, fl + fix.astype(fl.dtype)).astype(a.dtype)
    return np.where(b == 0, 0, q).astype(a.dtype)


def _int_pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exponentiation by squaring in the operand type; a negative exponent gives 1/a truncated."""
    a, b = np.broadcast_arrays(a, b)
    out = np.power(a, np.maximum(b, 0))
    neg = b < 0
    if neg.any():
        inv = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0))
        out = np.where(neg, inv, out)
    return out.astype(a.dtype)


def _py_mod(a: np.ndarray, b: np.ndarray, is_int: bool) -> np.ndarray:
    if is_int:
        safe = np.where(b == 0, 1, b)
        return np.where(b == 0, 0, np.mod(a, safe)).astype(a.dtype)
    r = np.fmod(a, b)
    return np.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


def _shift(a: np.ndarray, b: np.ndarray, left: bool) -> np.ndarray:
    bits = a.dtype.itemsize * 8
    big = (b < 0) | (b >= bits)
    safe = np.where(big, 0, b).astype(a.dtype)
    r = np.left_shift(a, safe) if left else np.right_shift(a, safe)
    fill = np.where(a < 0, -1, 0) if (not left and a.dtype.kind == "i") else 0
    return np.where(big, fill, r).astype(a.dtype)


def _binary(op: BinaryOp, a: np.ndarray, b: np.ndarray, src: DType) -> np.ndarray:
    is_int = src.is_int
    match op:
        case BinaryOp.ADD:
            return np.add(a, b)
        case BinaryOp.SUB:
            return np.subtract(a, b)
        case BinaryOp.MUL:
            return np.multiply(a, b)
        case BinaryOp.DIV:
            return _int_div(a, b) if is_int else np.divide(a, b)
        case BinaryOp.POW:
            return _int_pow(a, b) if is_int else np.power(a, b)
        case BinaryOp.MIN:
            return np.minimum(a, b)
        case BinaryOp.MAX:
            return np.maximum(a, b)
        case BinaryOp.MOD:
            return _py_mod(a, b, is_int)
        case BinaryOp.FMOD:
            if is_int:
                safe = np.where(b == 0, 1, b)
                return np.where(b == 0, 0, np.fmod(a, safe)).astype(a.dtype)
            return np.fmod(a, b)
        case BinaryOp.EQ:
            return np.equal(a, b)
        case BinaryOp.LT:
            return np.less(a, b)
        case BinaryOp.LE:
            return np.less_equal(a, b)
        case BinaryOp.GT:
            return np.greater(a, b)
        case BinaryOp.GE:
            return np.greater_equal(a, b)
        case BinaryOp.AND:
            return np.logical_and(a, b)
        case BinaryOp.OR:
            return np.logical_or(a, b)
        case BinaryOp.XOR:
            return np.logical_xor(a, b)
        case BinaryOp.BIT_AND:
            return np.bitwise_and(a, b)
        case BinaryOp.BIT_OR:
            return np.bitwise_or(a, b)
        case BinaryOp.BIT_XOR:
            return np.bitwise_xor(a, b)
        case BinaryOp.SHL:
            return _shift(a, b, True)
        case BinaryOp.SHR:
            return _shift(a, b, False)


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
