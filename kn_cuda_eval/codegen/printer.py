"""A fused step's program printed as SSA lines, `const T vK = <expr>;`, from the expression table
(`exprs`): the body of every elementwise kernel of both backends (CUDA kernels and C steps).

>>> from kn_cuda_eval.planning.program import Bin, Const, Load, Program
>>> from kn_graph.ops import BinaryOp
>>> prog = Program((Load(0, DType.F32), Const(2.0, DType.F32), Bin(BinaryOp.MUL, 0, 1, DType.F32)), (2,))
>>> w = CodeWriter()
>>> print_program(w, prog, lambda a: f"x{a}[i]", lambda a: "i")
['v0', 'v1', 'v2']
>>> print(w)
const float v0 = x0[i];
const float v1 = 2.0f;
const float v2 = (v0 * v1);
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from kn_cuda_eval.codegen import exprs
from kn_cuda_eval.codegen.template import CodeWriter
from kn_cuda_eval.planning.program import Bin, Const, Index, Load, Program, Sel, Un
from kn_graph.dtype import DType
from kn_graph.ops import BinaryOp, UnaryOp

__all__ = ["print_program"]


def print_program(
    w: CodeWriter,
    prog: Program,
    load_ref: Callable[[int], str],
    index_ref: Callable[[int], str],
    prefix: str = "v",
    const_ref: Callable[[Const], str | None] | None = None,
) -> list[str]:
    """Emit `const T vK = ...;` for every instruction; returns the value names. The bounds of
    float values clamped by min/max with constants are followed, so that a cast to a small
    integer of a clamped value skips its saturation (`exprs.cast`'s `in_range`). `const_ref`
    names a constant's parameter (an i64 the kernel reads), or None for a literal."""
    names: list[str] = []
    dts: list[DType] = []
    bounds: list[tuple[float, float]] = []  # each value lies within, or is NaN
    for k, ins in enumerate(prog.instrs):
        rng = _ANY
        match ins:
            case Load(arg, dt):
                e = exprs.load(dt, load_ref(arg))
            case Index(arg, dt):
                e = exprs.cast(f"({index_ref(arg)})", DType.I64, dt)
            case Const(value, dt):
                ref = None if const_ref is None else const_ref(ins)
                e = exprs.literal(value, dt) if ref is None else exprs.cast(ref, DType.I64, dt)
                if dt.is_float and not math.isnan(float(value)):
                    rng = (float(value), float(value))
            case Un(UnaryOp.CAST, x, dt) if dts[x].is_float and dt.is_int and dt is not DType.BOOL:
                info = np.iinfo(dt.np)
                fits = info.min <= bounds[x][0] and bounds[x][1] <= info.max
                e = exprs.cast(names[x], dts[x], dt, in_range=fits)
            case Un(op, x, dt):
                e = exprs.unary(op, names[x], dts[x], dt)
            case Bin(op, a, c, dt):
                e = exprs.binary(op, names[a], names[c], dts[a], dt)
                if dt.is_float and op is BinaryOp.MIN:
                    rng = (min(bounds[a][0], bounds[c][0]), min(bounds[a][1], bounds[c][1]))
                elif dt.is_float and op is BinaryOp.MAX:
                    rng = (max(bounds[a][0], bounds[c][0]), max(bounds[a][1], bounds[c][1]))
            case Sel(c, a, b):
                e = f"({names[c]} ? {names[a]} : {names[b]})"
        name = f"{prefix}{k}"
        w.line(f"const {exprs.compute_ctype(ins.dtype)} {name} = {e};")
        names.append(name)
        dts.append(ins.dtype)
        bounds.append(rng)
    return names


_ANY = (-math.inf, math.inf)
