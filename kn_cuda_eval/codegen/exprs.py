"""C expressions per op and dtype: the one table both backends print programs with.

Values live in their *compute* type inside a kernel: f16 is stored as `half` and computed as
`float`; every other type is computed as itself. The expressions use one vocabulary (`half`,
`__half2float`, `KN_INF`, `KN_BITCAST`, the `kn_*` helpers) that two preludes define: the CUDA
backend's `cuda/kernels/templates/prelude.cu` and the CPU backend's `cpu/prelude.h`.
"""

from __future__ import annotations

import math

import numpy as np

from kn_graph.dtype import DType
from kn_graph.ops import BinaryOp, UnaryOp

__all__ = [
    "acc_ctype",
    "binary",
    "cast",
    "compute_ctype",
    "extreme",
    "literal",
    "load",
    "storage_ctype",
    "store",
    "unary",
]


def storage_ctype(dt: DType) -> str:
    return "half" if dt is DType.F16 else dt.c


def compute_ctype(dt: DType) -> str:
    return "float" if dt is DType.F16 else dt.c


def load(dt: DType, ref: str) -> str:
    """Read one element `ref` (an lvalue of the storage type) as its compute type."""
    return f"__half2float({ref})" if dt is DType.F16 else ref


def store(dt: DType, value: str) -> str:
    """A compute-type value converted for storage."""
    if dt is DType.F16:
        return f"__float2half({value})"
    if dt is DType.BOOL:
        return f"(bool)({value})"
    return f"({dt.c})({value})"


def literal(value: float | int | bool, dt: DType) -> str:
    """A C literal of the compute type (f16 constants are rounded to f16 first)."""
    if dt is DType.BOOL:
        return "true" if value else "false"
    if dt.is_float:
        v = float(np.float16(value)) if dt is DType.F16 else float(value)
        ct = compute_ctype(dt)
        if math.isnan(v):
            return f"(({ct})__int_as_float(0x7fc00000))"
        if math.isinf(v):
            return f"(({ct}){'-' if v < 0 else ''}KN_INF)"
        if ct == "float":
            v32 = float(np.float32(v))
            return f"{v32!r}f"
        return repr(v)
    iv = int(value)
    if dt is DType.I64 and iv == -(2**63):
        return "(-9223372036854775807LL - 1)"
    if dt is DType.I32 and iv == -(2**31):
        return "(-2147483647 - 1)"
    suffix = (
        "ULL" if dt is DType.U64 else "LL" if dt is DType.I64 else "U" if dt in (DType.U32,) else ""
    )
    return f"(({dt.c}){iv}{suffix})"


# -- unary -------------------------------------------------------------------------------------
# float table: {x} is the operand, {f} the float-function suffix ("f" for float, "" for double),
# {h} the literal suffix
_FLOAT_UNARY: dict[UnaryOp, str] = {
    UnaryOp.ABS: "fabs{f}({x})",
    UnaryOp.NEG: "(-{x})",
    UnaryOp.SIN: "sin{f}({x})",
    UnaryOp.COS: "cos{f}({x})",
    UnaryOp.TAN: "tan{f}({x})",
    UnaryOp.ASIN: "asin{f}({x})",
    UnaryOp.ACOS: "acos{f}({x})",
    UnaryOp.ATAN: "atan{f}({x})",
    UnaryOp.SINH: "sinh{f}({x})",
    UnaryOp.COSH: "cosh{f}({x})",
    UnaryOp.ASINH: "asinh{f}({x})",
    UnaryOp.ACOSH: "acosh{f}({x})",
    UnaryOp.ATANH: "atanh{f}({x})",
    UnaryOp.EXP: "exp{f}({x})",
    UnaryOp.LOG: "log{f}({x})",
    UnaryOp.SQRT: "sqrt{f}({x})",
    UnaryOp.SIGMOID: "(1.0{h} / (1.0{h} + exp{f}(-{x})))",
    UnaryOp.TANH: "tanh{f}({x})",
    UnaryOp.ERF: "erf{f}({x})",
    UnaryOp.SOFTPLUS: "(fmax{f}({x}, 0.0{h}) + log1p{f}(exp{f}(-fabs{f}({x}))))",
    UnaryOp.RECIPROCAL: "(1.0{h} / {x})",
    UnaryOp.FLOOR: "floor{f}({x})",
    UnaryOp.CEIL: "ceil{f}({x})",
    UnaryOp.ROUND: "rint{f}({x})",
    UnaryOp.SIGN: "({x} > 0 ? 1.0{h} : ({x} < 0 ? -1.0{h} : {x}))",
    UnaryOp.GELU: "(0.5{h} * {x} * (1.0{h} + erf{f}({x} * 0.7071067811865476{h})))",
    UnaryOp.GELU_TANH: "(0.5{h} * {x} * (1.0{h} + tanh{f}(0.7978845608028654{h} * ({x} + 0.044715{h} * {x} * {x} * {x}))))",
    UnaryOp.SILU: "({x} / (1.0{h} + exp{f}(-{x})))",
}

_INT_UNARY: dict[UnaryOp, str] = {
    UnaryOp.ABS: "({x} < 0 ? -{x} : {x})",
    UnaryOp.NEG: "(-{x})",
    UnaryOp.SIGN: "(({x} > 0) - ({x} < 0))",
    UnaryOp.BIT_NOT: "(~{x})",
}


def cast(x: str, src: DType, dst: DType, in_range: bool = False) -> str:
    """Value conversion: → bool is `!= 0`; float → int truncates toward zero, saturating at the
    bounds, NaN → 0 (`kn_graph.dtype.float_to_int`: C leaves out-of-range conversions undefined,
    and x86, AVX-512 and CUDA each give something else). `x` is an SSA name: it may repeat.
    `in_range`: x is known to lie within dst's bounds or be NaN (a clamp before it, as every
    QuantizeLinear has), and dst has at most 16 bits: then only NaN is tested, through int, a
    form GCC vectorizes (the three-way saturating one kept a u8 requantization scalar: 13 ms
    instead of ~1 over 400x1536)."""
    if dst is DType.BOOL:
        return f"({x} != 0)"
    if dst is DType.F16:
        conv = "__double2half" if src is DType.F64 else "__float2half"
        arg = x if src in (DType.F64, DType.F32, DType.F16) else f"(float)({x})"
        return f"__half2float({conv}({arg}))"
    ct = compute_ctype(dst)
    if src.is_float and dst.is_int and in_range and dst.np.itemsize <= 2:
        h = "" if src is DType.F64 else "f"
        return f"(({ct})(int)({x} != {x} ? 0.0{h} : {x}))"
    if src.is_float and dst.is_int:
        info = np.iinfo(dst.np)
        h = "" if src is DType.F64 else "f"
        lo = f"{float(info.min).hex()}{h}"  # -2^(n-1) or 0: exact in f32
        hi = f"{(2.0 ** (info.bits - (1 if dst.is_signed else 0))).hex()}{h}"  # max + 1: exact
        return (
            f"({x} != {x} ? ({ct})0 : {x} <= {lo} ? {literal(int(info.min), dst)} : "
            f"{x} >= {hi} ? {literal(int(info.max), dst)} : ({ct})({x}))"
        )
    return f"(({ct})({x}))"


def bitcast(x: str, src: DType, dst: DType) -> str:
    """Reinterpret the stored bits (f16 goes through `half`)."""
    inner = f"__float2half({x})" if src is DType.F16 else x
    out = f"KN_BITCAST({storage_ctype(dst)}, {storage_ctype(src)}, {inner})"
    return f"__half2float({out})" if dst is DType.F16 else out


def unary(op: UnaryOp, x: str, src: DType, dst: DType) -> str:
    if op is UnaryOp.CAST:
        return cast(x, src, dst)
    if op is UnaryOp.BITCAST:
        return bitcast(x, src, dst)
    if op is UnaryOp.NOT:
        return f"(!{x})"
    if src.is_float:
        f, h = ("", "") if src is DType.F64 else ("f", "f")
        tpl = _FLOAT_UNARY.get(op)
        if tpl is None:
            raise KeyError(
                f"no C expression for unary {op.value} on {src}; float ops: {sorted(o.value for o in _FLOAT_UNARY)}"
            )
        return tpl.format(x=x, f=f, h=h)
    tpl = _INT_UNARY.get(op)
    if tpl is None:
        raise KeyError(
            f"no C expression for unary {op.value} on {src}; integer ops: {sorted(o.value for o in _INT_UNARY)}"
        )
    if op is UnaryOp.ABS and not src.is_signed:
        return x
    return f"(({compute_ctype(dst)}){tpl.format(x=x)})"


# -- binary ------------------------------------------------------------------------------------
_ANY_BINARY: dict[BinaryOp, str] = {
    BinaryOp.ADD: "({a} + {b})",
    BinaryOp.SUB: "({a} - {b})",
    BinaryOp.MUL: "({a} * {b})",
    BinaryOp.EQ: "({a} == {b})",
    BinaryOp.LT: "({a} < {b})",
    BinaryOp.LE: "({a} <= {b})",
    BinaryOp.GT: "({a} > {b})",
    BinaryOp.GE: "({a} >= {b})",
    BinaryOp.AND: "({a} && {b})",
    BinaryOp.OR: "({a} || {b})",
    BinaryOp.XOR: "({a} != {b})",
    BinaryOp.BIT_AND: "({a} & {b})",
    BinaryOp.BIT_OR: "({a} | {b})",
    BinaryOp.BIT_XOR: "({a} ^ {b})",
    BinaryOp.SHL: "kn_shl({a}, {b})",
    BinaryOp.SHR: "kn_shr({a}, {b})",
}
_FLOAT_BINARY: dict[BinaryOp, str] = {
    BinaryOp.DIV: "({a} / {b})",
    BinaryOp.POW: "pow{f}({a}, {b})",
    BinaryOp.MIN: "kn_fmin({a}, {b})",
    BinaryOp.MAX: "kn_fmax({a}, {b})",
    BinaryOp.MOD: "kn_pymod_f({a}, {b})",
    BinaryOp.FMOD: "fmod{f}({a}, {b})",
}
_INT_BINARY: dict[BinaryOp, str] = {
    BinaryOp.DIV: "kn_idiv({a}, {b})",
    BinaryOp.POW: "kn_ipow({a}, {b})",
    BinaryOp.MIN: "({a} < {b} ? {a} : {b})",
    BinaryOp.MAX: "({a} > {b} ? {a} : {b})",
    BinaryOp.MOD: "kn_pymod_i({a}, {b})",
    BinaryOp.FMOD: "kn_ifmod({a}, {b})",
}


def binary(op: BinaryOp, a: str, b: str, src: DType, dst: DType) -> str:
    """`src` is the operands' type, `dst` the result's (bool for comparisons)."""
    tpl = _ANY_BINARY.get(op)
    if tpl is None:
        table = _FLOAT_BINARY if src.is_float else _INT_BINARY
        tpl = table.get(op)
        if tpl is None:
            raise KeyError(f"no C expression for binary {op.value} on {src}")
    f = "" if src is DType.F64 else "f"
    expr = tpl.format(a=a, b=b, f=f)
    return (
        expr
        if op.is_comparison or src.is_float or src.is_bool
        else f"(({compute_ctype(dst)}){expr})"
    )


def acc_ctype(dt: DType) -> str:
    """The accumulator of a float reduction over `dt` (f16 and f32 sum in float)."""
    return "double" if dt is DType.F64 else "float"


def extreme(dt: DType, acc: str, high: bool) -> str:
    """The largest (`high`) or smallest value of `dt` as an `acc` literal: the start of a min/max
    reduction."""
    if dt.is_float:
        return f"(({acc}){'' if high else '-'}KN_INF)"
    if dt is DType.BOOL:
        return "1" if high else "0"
    info = np.iinfo(dt.np)
    return literal(info.max if high else info.min, dt)
