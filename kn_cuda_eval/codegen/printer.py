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

from collections.abc import Callable

from kn_cuda_eval.codegen import exprs
from kn_cuda_eval.codegen.template import CodeWriter
from kn_cuda_eval.planning.program import Bin, Const, Index, Load, Program, Sel, Un
from kn_graph.dtype import DType

__all__ = ["print_program"]


def print_program(
    w: CodeWriter,
    prog: Program,
    load_ref: Callable[[int], str],
    index_ref: Callable[[int], str],
    prefix: str = "v",
) -> list[str]:
    """Emit `const T vK = ...;` for every instruction; returns the value names."""
    names: list[str] = []
    dts: list[DType] = []
    for k, ins in enumerate(prog.instrs):
        match ins:
            case Load(arg, dt):
                e = exprs.load(dt, load_ref(arg))
            case Index(arg, dt):
                e = exprs.cast(f"({index_ref(arg)})", DType.I64, dt)
            case Const(value, dt):
                e = exprs.literal(value, dt)
            case Un(op, x, dt):
                e = exprs.unary(op, names[x], dts[x], dt)
            case Bin(op, a, b, dt):
                e = exprs.binary(op, names[a], names[b], dts[a], dt)
            case Sel(c, a, b):
                e = f"({names[c]} ? {names[a]} : {names[b]})"
        name = f"{prefix}{k}"
        w.line(f"const {exprs.compute_ctype(ins.dtype)} {name} = {e};")
        names.append(name)
        dts.append(ins.dtype)
    return names
