"""C kernels of the element-parallel steps — elementwise (and copy) and gather — over the loop
nest of `kernel.nest`: the fused program printed at every element from the shared expression
table, walked in the order the output is stored (`memory_order`), with its row-invariant
transcendentals tabulated once per inner coordinate (`hoisted`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from kn_cuda_eval.codegen import exprs
from kn_cuda_eval.codegen.printer import print_program
from kn_cuda_eval.codegen.template import CodeWriter
from kn_cuda_eval.cpu.csource.kernel import (
    HEAVY,
    Args,
    CCall,
    Term,
    call,
    nest,
    offset_sum,
    program_weight,
    stride_terms,
)
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.program import Const, Index, Instr, Load, Program, Un, prune

__all__ = ["HOIST_MAX", "copy_call", "elementwise_call", "gather_call", "hoisted", "memory_order"]


def memory_order(s: st.Elementwise) -> st.Elementwise:
    """`s` with its axes permuted (every view alike: the same element at every coordinate) so
    that the first output is walked in the order it is stored, its smallest stride innermost —
    a channels-last output of a logical NCHW step is then written contiguously, with its
    per-channel operands contiguous too, instead of at a stride of C."""
    if not s.outputs or len(s.shape) < 2:
        return s
    strides = s.outputs[0].strides
    # size-1 axes first (their stride does not matter), the rest by decreasing stride
    perm = [i for i in range(len(s.shape)) if s.shape[i] == 1] + [
        i for i in sorted(range(len(s.shape)), key=lambda i: -abs(strides[i])) if s.shape[i] != 1
    ]
    if perm == sorted(perm) or any(x < 0 for x in strides):
        return s
    return st.Elementwise(
        tuple(s.shape[i] for i in perm),
        tuple(v.permute(perm) for v in s.inputs),
        tuple(v.permute(perm) for v in s.indices),
        tuple(v.permute(perm) for v in s.outputs),
        s.program,
    )


HOIST_MAX = 4096
"""Inner sizes up to this many elements may have row-invariant work tabulated (`hoisted`)."""


def hoisted(s: st.Elementwise) -> list[int]:
    """Instructions of `s.program` worth computing once per inner coordinate instead of at
    every element: those reading only operands that do not move along the outer axes (stride
    0 there) with a transcendental in them, whose value some instruction that does move uses
    (or that is stored). The sigmoid of a squeeze-and-excitation's per-channel scale, walked
    over H·W rows of C channels, is then C exponentials instead of C·H·W."""
    prog, r = s.program, len(s.shape)
    if r < 2 or s.shape[-1] > HOIST_MAX or math.prod(s.shape[:-1]) < 2:
        return []
    fixed: list[bool] = []  # the value does not change along the outer axes
    heavy: list[bool] = []
    for ins in prog.instrs:
        match ins:
            case Load(arg):
                fixed.append(all(t == 0 for t in s.inputs[arg].strides[:-1]))
                heavy.append(False)
            case Index(arg):
                fixed.append(all(t == 0 for t in s.indices[arg].strides[:-1]))
                heavy.append(False)
            case Const():
                fixed.append(True)
                heavy.append(False)
            case _:
                fixed.append(all(fixed[x] for x in ins.operands))
                heavy.append(
                    any(heavy[x] for x in ins.operands) or (isinstance(ins, Un) and ins.op in HEAVY)
                )
    used_by_moving: set[int] = set(i for i in prog.roots)
    for i, ins in enumerate(prog.instrs):
        if not fixed[i]:
            used_by_moving.update(ins.operands)
    # (a table holds the compute type, and a load converts only from a storage type: no f16)
    same = [exprs.load(ins.dtype, "x") == "x" for ins in prog.instrs]
    return [
        i
        for i in range(len(prog.instrs))
        if fixed[i] and heavy[i] and same[i] and i in used_by_moving
    ]


def elementwise_call(s: st.Elementwise) -> CCall:
    s = memory_order(s)
    a = Args()
    dims = [a.int_(f"d{i}", d) for i, d in enumerate(s.shape)]
    operands: list[tuple[str, Sequence[Term]]] = []
    outs = [a.ptr(f"out{k}", v, const=False) for k, v in enumerate(s.outputs)]
    for k, v in enumerate(s.outputs):
        operands.append(("", stride_terms(a.strides(f"so{k}", v.strides))))
    ins = [a.ptr(f"in{k}", v) for k, v in enumerate(s.inputs)]
    for k, v in enumerate(s.inputs):
        operands.append(("", stride_terms(a.strides(f"si{k}", v.strides))))
    for k, v in enumerate(s.indices):
        base = a.int_(f"ix{k}", v.offset // 8)
        operands.append((base, stride_terms(a.strides(f"sx{k}", v.strides))))
    w = CodeWriter(1)
    nout, nin = len(outs), len(ins)
    hoist = hoisted(s)
    prog, prologue = s.program, None
    if hoist:  # tabulated per thread over the inner axis, then loaded like an input
        inner = [(b, terms[-1]("j")) for b, terms in operands]
        tables = {i: f"hv{n}" for n, i in enumerate(hoist)}

        def prologue(w: CodeWriter) -> None:
            for i, t in tables.items():
                w.line(f"{exprs.compute_ctype(s.program.instrs[i].dtype)} {t}[kn_inner];")
            sub = _live(list(s.program.instrs), hoist)
            with w.block("for (long long j = 0; j < kn_inner; ++j)"):
                names = print_program(
                    w,
                    sub,
                    lambda q: f"{ins[q]}[{offset_sum(*inner[nout + q])}]",
                    lambda q: f"({offset_sum(*inner[nout + nin + q])})",
                    prefix="h",
                    const_ref=a.const,
                )
                for t, root in zip(tables.values(), sub.roots, strict=True):
                    w.line(f"{t}[j] = {names[root]};")

        prog = _with_tables(s.program, hoist, nin)

    def body(w: CodeWriter, offs: list[str]) -> None:
        names = print_program(
            w,
            prog,
            lambda i: f"{ins[i]}[{offs[nout + i]}]" if i < nin else f"hv{i - nin}[j]",
            lambda i: f"({offs[nout + nin + i]})",
            const_ref=a.const,
        )
        for k, (v, root) in enumerate(zip(s.outputs, prog.roots, strict=True)):
            w.line(f"{outs[k]}[{offs[k]}] = {exprs.store(v.dtype, names[root])};")

    nest(w, a, dims, operands, body, program_weight(prog), prologue)
    return call("ew", a, w)


def _with_tables(prog: Program, hoist: Sequence[int], nin: int) -> Program:
    """`prog` with each hoisted instruction a load of its table (load argument nin + n), and
    what only they used dropped."""
    repl = {i: Load(nin + n, prog.instrs[i].dtype) for n, i in enumerate(hoist)}
    return _live([repl.get(i, ins) for i, ins in enumerate(prog.instrs)], prog.roots)


def _live(instrs: Sequence[Instr], roots: Sequence[int]) -> Program:
    """The instructions `roots` need, renumbered, with those as the roots."""
    return prune(Program(tuple(instrs), tuple(roots)))


def copy_call(s: st.Copy) -> CCall:
    prog = Program((Load(0, s.src.dtype),), (0,))
    return elementwise_call(st.Elementwise(s.dst.shape, (s.src,), (), (s.dst,), prog))


def gather_call(s: st.Gather) -> CCall:
    a = Args()
    r = len(s.out.shape)
    dims = [a.int_(f"d{i}", d) for i, d in enumerate(s.out.shape)]
    out = a.ptr("out", s.out, const=False)
    so = a.strides("so", s.out.strides)
    x = a.ptr("x", s.x)
    sx = a.strides("sx", s.x.strides, inner=s.axis != r - 1)
    ind = a.ptr("ind", s.indices)
    si = a.int_("si", s.indices.strides[0])
    nidx = a.int_("nidx", s.indices.shape[0])
    axis_n = a.int_("axis_n", s.x.shape[s.axis])
    w = CodeWriter(1)
    with w.block(f"for (long long t = 0; t < {nidx}; ++t)"):
        w.line(f"const long long jx = (long long){ind}[t * {si}];")
        w.line(f"if (jx < 0 || jx >= {axis_n}) return 1;")
    xterms = stride_terms(sx)
    xterms[s.axis] = lambda c: f"(long long){ind}[{c} * {si}] * {sx[s.axis]}"

    def body(w: CodeWriter, offs: list[str]) -> None:
        w.line(f"{out}[{offs[0]}] = {x}[{offs[1]}];")

    nest(w, a, dims, [("", stride_terms(so)), ("", xterms)], body, 1)
    return call("gather", a, w)
