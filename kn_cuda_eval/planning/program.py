"""The small SSA program of a fused elementwise kernel, shared by the kernel generator (which
prints it as C) and the emulator (which runs it with NumPy).

Instruction k defines value k. `Load(i)` reads operand view i at the current coordinate,
`Index(j)` is the element address of index view j (how Iota, and slices or permutes of it, are
computed without memory), `Const` is an inlined scalar. f16 values are computed in f32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kn_graph.dtype import DType
from kn_graph.ops import BinaryOp, UnaryOp

__all__ = [
    "Bin",
    "Const",
    "Index",
    "Instr",
    "Load",
    "Program",
    "ProgramBuilder",
    "Sel",
    "Un",
    "prune",
]


@dataclass(frozen=True, slots=True)
class Load:
    arg: int
    dtype: DType

    @property
    def operands(self) -> tuple[int, ...]:
        """The values this instruction reads (none: it reads memory or is a constant)."""
        return ()

    def with_operands(self, ops: Sequence[int]) -> Load:
        return self


@dataclass(frozen=True, slots=True)
class Index:
    arg: int
    dtype: DType

    @property
    def operands(self) -> tuple[int, ...]:
        """The values this instruction reads (none: it reads memory or is a constant)."""
        return ()

    def with_operands(self, ops: Sequence[int]) -> Index:
        return self


@dataclass(frozen=True, slots=True)
class Const:
    value: float | int | bool
    dtype: DType

    @property
    def operands(self) -> tuple[int, ...]:
        """The values this instruction reads (none: it reads memory or is a constant)."""
        return ()

    def with_operands(self, ops: Sequence[int]) -> Const:
        return self


@dataclass(frozen=True, slots=True)
class Un:
    """Unary op; CAST/BITCAST convert to `dtype` (the source type is that of `x`)."""

    op: UnaryOp
    x: int
    dtype: DType

    @property
    def operands(self) -> tuple[int, ...]:
        return (self.x,)

    def with_operands(self, ops: Sequence[int]) -> Un:
        (x,) = ops
        return Un(self.op, x, self.dtype)


@dataclass(frozen=True, slots=True)
class Bin:
    op: BinaryOp
    a: int
    b: int
    dtype: DType

    @property
    def operands(self) -> tuple[int, ...]:
        return (self.a, self.b)

    def with_operands(self, ops: Sequence[int]) -> Bin:
        a, b = ops
        return Bin(self.op, a, b, self.dtype)


@dataclass(frozen=True, slots=True)
class Sel:
    cond: int
    a: int
    b: int
    dtype: DType

    @property
    def operands(self) -> tuple[int, ...]:
        return (self.cond, self.a, self.b)

    def with_operands(self, ops: Sequence[int]) -> Sel:
        c, a, b = ops
        return Sel(c, a, b, self.dtype)


Instr = Load | Index | Const | Un | Bin | Sel


@dataclass(frozen=True, slots=True)
class Program:
    """Instructions in dependency order; `roots` are the values the kernel stores."""

    instrs: tuple[Instr, ...]
    roots: tuple[int, ...]

    @property
    def cost(self) -> int:
        """Arithmetic instructions: what fusing through a broadcast would recompute."""
        return sum(isinstance(i, Un | Bin | Sel) for i in self.instrs)

    def format(self, root: int | None = None) -> str:
        """A one-line expression, e.g. `max(add(ld0, ld1), 0.0)`."""
        names: list[str] = []
        for ins in self.instrs:
            match ins:
                case Load(arg):
                    names.append(f"ld{arg}")
                case Index(arg):
                    names.append(f"idx{arg}")
                case Const(value):
                    names.append(repr(value))
                case Un(op, x, dt):
                    op_name = f"{op.value}_{dt}" if op.changes_dtype else op.value
                    names.append(f"{op_name}({names[x]})")
                case Bin(op, a, b):
                    names.append(f"{op.value}({names[a]}, {names[b]})")
                case Sel(c, a, b):
                    names.append(f"select({names[c]}, {names[a]}, {names[b]})")
        return names[self.roots[0] if root is None else root]


class ProgramBuilder:
    """Appends instructions with hash-consing (identical instructions are shared), so merging
    the programs of two operands that read the same view loads it once."""

    def __init__(self) -> None:
        self.instrs: list[Instr] = []
        self._ids: dict[object, int] = {}

    def add(self, ins: Instr) -> int:
        # constants key by repr so that 0.0 and -0.0 (equal, same hash) stay apart
        key: object = ("const", repr(ins.value), ins.dtype) if isinstance(ins, Const) else ins
        hit = self._ids.get(key)
        if hit is not None:
            return hit
        self.instrs.append(ins)
        self._ids[key] = len(self.instrs) - 1
        return len(self.instrs) - 1

    def splice(self, prog: Program, load_map: Sequence[int], index_map: Sequence[int]) -> list[int]:
        """Copy `prog` in, renumbering its loads and index operands; returns the new ids of
        its values."""
        ids: list[int] = []
        for ins in prog.instrs:
            match ins:
                case Load(arg, dt):
                    ins = Load(load_map[arg], dt)
                case Index(arg, dt):
                    ins = Index(index_map[arg], dt)
                case _:
                    ins = ins.with_operands([ids[x] for x in ins.operands])
            ids.append(self.add(ins))
        return ids

    def build(self, roots: Sequence[int]) -> Program:
        return Program(tuple(self.instrs), tuple(roots))


def prune(p: Program) -> Program:
    """`p` without the instructions its roots do not need (splicing keeps whole operand
    programs; a rewrite may orphan some)."""
    need = [False] * len(p.instrs)
    for r in p.roots:
        need[r] = True
    for i in range(len(p.instrs) - 1, -1, -1):
        if need[i]:
            for x in p.instrs[i].operands:
                need[x] = True
    if all(need):
        return p
    pb = ProgramBuilder()
    ids: dict[int, int] = {}
    for i, ins in enumerate(p.instrs):
        if not need[i]:
            continue
        ids[i] = pb.add(ins.with_operands([ids[x] for x in ins.operands]))
    return pb.build([ids[r] for r in p.roots])
