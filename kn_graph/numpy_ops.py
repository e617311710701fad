"""NumPy semantics of the IR's element ops: one function per `UnaryOp` (`UNARY`, with `cast` and
`bitcast`, whose result type is an argument) and per `BinaryOp` (`BINARY`). The reference
executor (`kn_graph.reference`) evaluates graphs with `unary`/`binary`, which round f16 after
every op; the plan emulator (`kn_cuda_eval.planning.emulator_ops`) applies the same table to
values held in f32 between instructions, as the generated kernels do, and overrides the entries
whose kernels really differ (each override says why there).

Integer semantics are C's, as the kernels' (`kn_idiv`, `kn_ifmod`, ...): division truncates
toward zero, and division or remainder by zero gives 0 instead of a crash; NumPy's shifts give 0
(or the sign) for counts outside [0, bits), as `kn_shl`/`kn_shr` do (NumPy >= 1.18).

>>> binary(BinaryOp.DIV, np.array([7, -7], np.int32), np.array([2, 0], np.int32))
array([3, 0], dtype=int32)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
import scipy.special

from kn_graph.dtype import float_to_int
from kn_graph.errors import EvaluationError
from kn_graph.ops import BinaryOp, UnaryOp

__all__ = ["BINARY", "UNARY", "binary", "bitcast", "cast", "unary"]

UnaryFn = Callable[[np.ndarray], np.ndarray]
BinaryFn = Callable[[np.ndarray, np.ndarray], np.ndarray]

_SQRT1_2 = 1.0 / math.sqrt(2.0)
_SQRT2_PI = math.sqrt(2.0 / math.pi)


def _sigmoid(a: np.ndarray) -> np.ndarray:
    return scipy.special.expit(a).astype(a.dtype, copy=False)


UNARY: Mapping[UnaryOp, UnaryFn] = {
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
    UnaryOp.SIGMOID: _sigmoid,
    UnaryOp.TANH: np.tanh,
    UnaryOp.ERF: lambda a: scipy.special.erf(a).astype(a.dtype, copy=False),
    UnaryOp.SOFTPLUS: lambda a: np.logaddexp(a.dtype.type(0), a),
    UnaryOp.RECIPROCAL: np.reciprocal,
    UnaryOp.FLOOR: np.floor,
    UnaryOp.CEIL: np.ceil,
    UnaryOp.ROUND: np.round,  # on floats, np.rint: halves to even, as C's rint
    UnaryOp.SIGN: np.sign,
    UnaryOp.NOT: np.logical_not,
    UnaryOp.BIT_NOT: np.invert,
    UnaryOp.GELU: lambda a: (a * 0.5 * (1.0 + scipy.special.erf(a * _SQRT1_2))).astype(
        a.dtype, copy=False
    ),
    UnaryOp.GELU_TANH: lambda a: (
        0.5 * a * (1.0 + np.tanh(_SQRT2_PI * (a + 0.044715 * a**3)))
    ).astype(a.dtype, copy=False),
    UnaryOp.SILU: lambda a: a * _sigmoid(a),
}
"""Every `UnaryOp` but CAST and BITCAST, on an array of the operand's type (f16 computed as is:
the callers decide where f16 is held in f32)."""


def cast(a: np.ndarray, out: np.dtype) -> np.ndarray:
    """Value conversion: → bool is `!= 0`; float → int truncates toward zero, saturating, NaN →
    0 (`float_to_int`: what the kernels' casts do); else NumPy's `astype`."""
    if out == np.bool_:
        return a != 0
    if a.dtype.kind == "f" and out.kind in "iu":
        return float_to_int(a, out)
    return a.astype(out)


def bitcast(a: np.ndarray, out: np.dtype) -> np.ndarray:
    """The same bytes read as `out` (an array of the stored type)."""
    return a.view(out)


def _is_int(a: np.ndarray) -> bool:
    return a.dtype.kind in "iu"


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C semantics: truncation toward zero; division by zero gives 0 instead of a crash."""
    safe = np.where(b == 0, 1, b)
    q = np.floor_divide(a, safe)
    fix = (np.remainder(a, safe) != 0) & ((a < 0) != (safe < 0))
    return np.where(b == 0, 0, q + fix.astype(q.dtype)).astype(a.dtype)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _int_div(a, b) if _is_int(a) else np.divide(a, b)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if _is_int(a) and (b < 0).any():
        raise EvaluationError("pow: negative integer exponent")
    return np.power(a, b)


def _int_safe(f: BinaryFn) -> BinaryFn:
    """The remainder `f` with 0 for an integer divisor of 0, as the kernels' `kn_pymod_i` and
    `kn_ifmod` give, never NumPy's own handling of a zero divisor."""

    def g(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if not _is_int(a):
            return f(a, b)
        safe = np.where(b == 0, 1, b)
        return np.where(b == 0, 0, f(a, safe)).astype(a.dtype)

    return g


BINARY: Mapping[BinaryOp, BinaryFn] = {
    BinaryOp.ADD: np.add,
    BinaryOp.SUB: np.subtract,
    BinaryOp.MUL: np.multiply,
    BinaryOp.DIV: _div,
    BinaryOp.POW: _pow,
    BinaryOp.MIN: np.minimum,
    BinaryOp.MAX: np.maximum,
    BinaryOp.MOD: _int_safe(np.mod),
    BinaryOp.FMOD: _int_safe(np.fmod),
    BinaryOp.EQ: np.equal,
    BinaryOp.LT: np.less,
    BinaryOp.LE: np.less_equal,
    BinaryOp.GT: np.greater,
    BinaryOp.GE: np.greater_equal,
    BinaryOp.AND: np.logical_and,
    BinaryOp.OR: np.logical_or,
    BinaryOp.XOR: np.logical_xor,
    BinaryOp.BIT_AND: np.bitwise_and,
    BinaryOp.BIT_OR: np.bitwise_or,
    BinaryOp.BIT_XOR: np.bitwise_xor,
    BinaryOp.SHL: np.left_shift,
    BinaryOp.SHR: np.right_shift,
}
"""Every `BinaryOp`, on two arrays of the operands' (one) type."""


def unary(op: UnaryOp, a: np.ndarray, out: np.dtype) -> np.ndarray:
    """The reference's unary op: f16 math in f32, rounded to f16 after the op; `out` is the
    result type (it matters for CAST and BITCAST)."""
    with np.errstate(all="ignore"):
        if op is UnaryOp.CAST:
            return cast(a, out)
        if op is UnaryOp.BITCAST:
            return bitcast(a, out)
        f = UNARY[op]
        if a.dtype == np.float16:
            return f(a.astype(np.float32)).astype(np.float16)
        return f(a)


def binary(op: BinaryOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The reference's binary op: f16 arithmetic in f32, rounded to f16 after the op."""
    with np.errstate(all="ignore"):
        f = BINARY[op]
        if a.dtype == np.float16 and not op.is_comparison:
            return f(a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
        return np.asarray(f(a, b))
