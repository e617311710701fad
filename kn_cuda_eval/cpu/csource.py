"""Host C for a plan's fused steps: elementwise (and copy), reduce, softmax, layernorm, gather and
attention, printed from the same expression table as the CUDA kernels (`kernels/exprs.py`, through
`codegen/printer.py`), over the C prelude `prelude.h` (half, the `kn_*` helpers, vectorizable
exp / tanh / erf).

Every kernel has the signature `int name(char* base, const long long* p, const double* f)`: sizes,
strides and byte offsets come in `p`, scales and epsilons in `f`, so one compiled function serves
every step of the same structure (program, dtypes, rank, innermost stride class). It returns 0, or
1 when a gather index is out of range (nothing written). Loops: the innermost axis is a plain
counted loop over restrict pointers (vectorizable), the outer axes are split into chunks that the
process's thread pool (`pool.c`) hands out dynamically when the step is big enough (`PAR_WORK`
units of work): the parallel part of a kernel is a region function of its own (`_parallel`),
which the calling thread runs too, taking chunks until none is left.

>>> from kn_cuda_eval.planning.program import Bin, Load, Program
>>> from kn_cuda_eval.planning.view import StridedView
>>> from kn_graph.dtype import DType
>>> from kn_graph.ops import BinaryOp
>>> v = StridedView.dense(256, (4, 8), DType.F32)
>>> prog = Program((Load(0, DType.F32), Load(1, DType.F32), Bin(BinaryOp.ADD, 0, 1, DType.F32)), (2,))
>>> call = step_call(st.Elementwise((4, 8), (v, v.with_offset(512)), (), (v.with_offset(768),), prog))
>>> call.kernel.name.startswith("kn_ew_"), call.ints[:3]
(True, (4, 8, 768))
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import assert_never

from kn_cuda_eval.codegen import exprs
from kn_cuda_eval.codegen.printer import print_program
from kn_cuda_eval.codegen.template import CodeWriter
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.program import Const, Index, Instr, Load, Program, Un, prune
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType
from kn_graph.ops import ReduceOp, UnaryOp

__all__ = ["PAR_WORK", "CCall", "CKernel", "library_sources", "step_call"]

PAR_WORK = 1 << 16
"""A step runs on several threads when its elements times its per-element weight pass this."""

_HEAVY = frozenset(
    {
        UnaryOp.EXP,
        UnaryOp.LOG,
        UnaryOp.ERF,
        UnaryOp.TANH,
        UnaryOp.SIGMOID,
        UnaryOp.GELU,
        UnaryOp.GELU_TANH,
        UnaryOp.SILU,
        UnaryOp.SOFTPLUS,
        UnaryOp.SIN,
        UnaryOp.COS,
    }
)


@dataclass(frozen=True, slots=True)
class CKernel:
    """One C function; `source` defines `static int name(char*, const long long*, const double*)`."""

    name: str
    source: str


@dataclass(frozen=True, slots=True)
class CCall:
    """A step as a call of a kernel with its arguments."""

    kernel: CKernel
    ints: tuple[int, ...]
    floats: tuple[float, ...]


class _Args:
    """Kernel parameters read from `p` / `f` at the top of the function, with their values."""

    def __init__(self) -> None:
        self.decls: list[str] = []
        self.ints: list[int] = []
        self.floats: list[float] = []
        self.regions: list[CodeWriter] = []  # parallel region functions (`_parallel`)

    def int_(self, name: str, value: int) -> str:
        self.decls.append(f"const long long {name} = p[{len(self.ints)}];")
        self.ints.append(int(value))
        return name

    def ptr(self, name: str, v: StridedView, const: bool = True) -> str:
        q = "const " if const else ""
        ct = exprs.storage_ctype(v.dtype)
        self.decls.append(f"{q}{ct}* restrict {name} = ({q}{ct}*)(base + p[{len(self.ints)}]);")
        self.ints.append(int(v.offset))
        return name

    def float_(self, name: str, value: float, ctype: str) -> str:
        self.decls.append(f"const {ctype} {name} = ({ctype})f[{len(self.floats)}];")
        self.floats.append(float(value))
        return name

    def strides(self, prefix: str, strides: Sequence[int], inner: bool = True) -> list[str]:
        """Stride names; the innermost one (with `inner`) is specialised to a literal 0 or 1,
        the stride classes that vectorize differently."""
        out = [self.int_(f"{prefix}_{a}", s) for a, s in enumerate(strides[:-1])]
        if strides:
            s = strides[-1]
            last = f"{prefix}_{len(strides) - 1}"
            out.append(str(s) if inner and s in (0, 1) else self.int_(last, s))
        return out


def _term(coord: str, stride: str) -> str:
    if stride == "0":
        return ""
    return coord if stride == "1" else f"{coord} * {stride}"


def _sum(base: str, terms: Sequence[str]) -> str:
    parts = [t for t in (base, *terms) if t and t != "0"]
    return " + ".join(parts) if parts else "0"


Term = Callable[[str], str]
"""The offset contribution of one axis given its coordinate's C name."""


def _stride_terms(strides: Sequence[str]) -> list[Term]:
    return [lambda c, s=s: _term(c, s) for s in strides]


def _weight(prog: Program) -> int:
    heavy = sum(isinstance(i, Un) and i.op in _HEAVY for i in prog.instrs)
    return 1 + prog.cost + 8 * heavy


def _parallel(
    w: CodeWriter,
    a: _Args,
    shared: Sequence[str],
    units: str,
    work: str,
    region: Callable[[CodeWriter], None],
) -> None:
    """A parallel loop over `units` units of work: `region` (writing at the level of a function
    body) becomes a function of its own, `KN_REGION<i>` until `_kernel` names it, that loops
    `while (kn_next(kn_t, &lo, &hi))` over the chunks [lo, hi) it is given; the kernel calls
    `kn_parallel`, which runs it on the pool's threads when `work` passes `PAR_WORK`, else once
    over every unit. `shared`: declarations both need, written in both."""
    r = CodeWriter(1)
    for line in shared:
        r.line(line)
    region(r)
    w.line(f"kn_parallel(KN_REGION{len(a.regions)}, base, p, f, {units}, {work});")
    a.regions.append(r)


def _nest(
    w: CodeWriter,
    args: _Args,
    dims: Sequence[str],
    operands: Sequence[tuple[str, Sequence[Term]]],
    body: Callable[[CodeWriter, list[str]], None],
    weight: int,
    prologue: Callable[[CodeWriter], None] | None = None,
) -> None:
    """Loops over `dims` (the last one innermost): the units are (outer coordinates, inner
    chunk) pairs, and each chunk of them a thread is given it walks like an odometer; `body`
    gets each operand's element offset inside the inner loop. `prologue` runs once per thread
    before (`kn_inner` is the inner size)."""
    r = len(dims)
    if r == 0:
        body(w, [_sum(b, []) for b, _ in operands])
        return
    outer, inner = dims[:-1], dims[-1]
    rows = " * ".join(outer) if outer else "1"
    shared = [
        f"const long long kn_rows = {rows}, kn_inner = {inner};",
        "const long long kn_split = (kn_rows >= 64 || kn_inner < 8192) ? 1 : kn_inner / 4096;",
        "const long long kn_chunk = (kn_inner + kn_split - 1) / kn_split;",
    ]

    def region(w: CodeWriter) -> None:
        if prologue is not None:
            prologue(w)
        w.line("long long lo, hi;")
        with w.block("while (kn_next(kn_t, &lo, &hi))"):
            w.line("long long sp = lo % kn_split, rem = lo / kn_split;")
            for a in range(len(outer) - 1, -1, -1):
                w.line(f"long long c{a} = rem % {outer[a]}; rem /= {outer[a]};")
            with w.block("for (long long u = lo; u < hi; ++u)"):
                w.line("const long long j0 = sp * kn_chunk;")
                w.line("const long long j1 = j0 + kn_chunk < kn_inner ? j0 + kn_chunk : kn_inner;")
                offs = []
                for k, (base, terms) in enumerate(operands):
                    outer_terms = [t(f"c{a}") for a, t in enumerate(terms[:-1])]
                    w.line(f"const long long o{k} = {_sum(base, outer_terms)};")
                    offs.append(_sum(f"o{k}", [terms[-1]("j")]))
                with w.block("for (long long j = j0; j < j1; ++j)"):
                    body(w, offs)
                w.line("if (++sp < kn_split) continue;")
                w.line("sp = 0;")
                for a in range(len(outer) - 1, -1, -1):
                    w.line(f"if (++c{a} < {outer[a]}) continue;")
                    w.line(f"c{a} = 0;")

    with w.block(""):
        for line in shared:
            w.line(line)
        with w.block("if (kn_rows > 0 && kn_inner > 0)"):
            _parallel(
                w, args, shared, "kn_rows * kn_split", f"kn_rows * kn_inner * {weight}", region
            )


_REGION = re.compile(r"\bKN_REGION(\d+)\b")


def _kernel(
    kind: str, a: _Args, body: CodeWriter
) -> tuple[CKernel, tuple[int, ...], tuple[float, ...]]:
    decls = "\n".join("    " + d for d in a.decls) + "\n"
    text = decls + str(body)
    regions = "".join(
        f"static void KN_REGION{i}(kn_task* restrict kn_t, char* restrict base, "
        "const long long* restrict p, const double* restrict f) {\n"
        f"    (void)base; (void)p; (void)f;\n{decls}{r}\n}}\n"
        for i, r in enumerate(a.regions)
    )
    name = f"kn_{kind}_{hashlib.sha256((regions + text).encode()).hexdigest()[:16]}"
    src = regions + (
        f"KN_KERNEL int {name}(char* restrict base, const long long* restrict p, "
        f"const double* restrict f) {{\n    (void)base; (void)p; (void)f;\n{text}\n    return 0;\n}}\n"
    )
    src = _REGION.sub(lambda m: f"{name}_r{m.group(1)}", src)
    return CKernel(name, src), tuple(a.ints), tuple(a.floats)


def _call(kind: str, a: _Args, body: CodeWriter) -> CCall:
    k, ints, floats = _kernel(kind, a, body)
    return CCall(k, ints, floats)


# -- element-parallel steps -----------------------------------------------------------------------
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
"""Inner sizes up to this many elements may have row-invariant work tabulated (`_hoisted`)."""


def _hoisted(s: st.Elementwise) -> list[int]:
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
                    any(heavy[x] for x in ins.operands)
                    or (isinstance(ins, Un) and ins.op in _HEAVY)
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


def _elementwise(s: st.Elementwise) -> CCall:
    s = memory_order(s)
    a = _Args()
    dims = [a.int_(f"d{i}", d) for i, d in enumerate(s.shape)]
    operands: list[tuple[str, Sequence[Term]]] = []
    outs = [a.ptr(f"out{k}", v, const=False) for k, v in enumerate(s.outputs)]
    for k, v in enumerate(s.outputs):
        operands.append(("", _stride_terms(a.strides(f"so{k}", v.strides))))
    ins = [a.ptr(f"in{k}", v) for k, v in enumerate(s.inputs)]
    for k, v in enumerate(s.inputs):
        operands.append(("", _stride_terms(a.strides(f"si{k}", v.strides))))
    for k, v in enumerate(s.indices):
        base = a.int_(f"ix{k}", v.offset // 8)
        operands.append((base, _stride_terms(a.strides(f"sx{k}", v.strides))))
    w = CodeWriter(1)
    nout, nin = len(outs), len(ins)
    hoist = _hoisted(s)
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
                    lambda q: f"{ins[q]}[{_sum(*inner[nout + q])}]",
                    lambda q: f"({_sum(*inner[nout + nin + q])})",
                    prefix="h",
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
        )
        for k, (v, root) in enumerate(zip(s.outputs, prog.roots, strict=True)):
            w.line(f"{outs[k]}[{offs[k]}] = {exprs.store(v.dtype, names[root])};")

    _nest(w, a, dims, operands, body, _weight(prog), prologue)
    return _call("ew", a, w)


def _with_tables(prog: Program, hoist: Sequence[int], nin: int) -> Program:
    """`prog` with each hoisted instruction a load of its table (load argument nin + n), and
    what only they used dropped."""
    repl = {i: Load(nin + n, prog.instrs[i].dtype) for n, i in enumerate(hoist)}
    return _live([repl.get(i, ins) for i, ins in enumerate(prog.instrs)], prog.roots)


def _live(instrs: Sequence[Instr], roots: Sequence[int]) -> Program:
    """The instructions `roots` need, renumbered, with those as the roots."""
    return prune(Program(tuple(instrs), tuple(roots)))


def _copy(s: st.Copy) -> CCall:
    prog = Program((Load(0, s.src.dtype),), (0,))
    return _elementwise(st.Elementwise(s.dst.shape, (s.src,), (), (s.dst,), prog))


def _gather(s: st.Gather) -> CCall:
    a = _Args()
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
    xterms = _stride_terms(sx)
    xterms[s.axis] = lambda c: f"(long long){ind}[{c} * {si}] * {sx[s.axis]}"

    def body(w: CodeWriter, offs: list[str]) -> None:
        w.line(f"{out}[{offs[0]}] = {x}[{offs[1]}];")

    _nest(w, a, dims, [("", _stride_terms(so)), ("", xterms)], body, 1)
    return _call("gather", a, w)


# -- row steps --------------------------------------------------------------------------------------
class _Rows:
    """A row kernel: rows over the leading `n_outer` axes of the expression x, in parallel; per
    row, loops over the remaining axes computing x's program at each element."""

    def __init__(self, x: st.Expr, n_outer: int, out: StridedView) -> None:
        self.x = x
        self.n = n_outer
        a = self.a = _Args()
        self.odims = [a.int_(f"od{i}", d) for i, d in enumerate(x.shape[:n_outer])]
        self.rdims = [a.int_(f"rd{i}", d) for i, d in enumerate(x.shape[n_outer:])]
        self.ins = [
            (a.ptr(f"in{k}", v), a.strides(f"si{k}", v.strides)) for k, v in enumerate(x.inputs)
        ]
        self.idx = [
            (a.int_(f"ix{k}", v.offset // 8), a.strides(f"sx{k}", v.strides))
            for k, v in enumerate(x.indices)
        ]
        self.out = a.ptr("out", out, const=False)
        self.so = a.strides("so", out.strides)
        self.acc = exprs.acc_ctype(x.dtype)
        self.w = CodeWriter(3)

    def open(self) -> None:
        """Row bases: `bi{k}`, `bx{k}`, `bo` (the caller opens the parallel loop)."""
        w = self.w
        w.line("long long rem = row;")
        for i in range(len(self.odims) - 1, -1, -1):
            w.line(f"const long long c{i} = rem % {self.odims[i]}; rem /= {self.odims[i]};")
        coords = [f"c{i}" for i in range(len(self.odims))]
        for k, (_, s) in enumerate(self.ins):
            w.line(
                f"const long long bi{k} = {_sum('', [_term(c, t) for c, t in zip(coords, s[: self.n], strict=True)])};"
            )
        for k, (name, s) in enumerate(self.idx):
            w.line(
                f"const long long bx{k} = {_sum(name, [_term(c, t) for c, t in zip(coords, s[: self.n], strict=True)])};"
            )
        so = self.so[: len(coords)]
        w.line(
            f"const long long bo = {_sum('', [_term(c, t) for c, t in zip(coords, so, strict=True)])};"
        )

    def loop(
        self, prefix: str, body: Callable[[CodeWriter, str, str], None], pragma: str = ""
    ) -> None:
        """Nested loops over the row axes; `body(w, value, flat)` gets the element's value and
        its flat index in the row. The innermost loop carries `pragma`."""
        w = self.w
        r = len(self.rdims)
        coords = [f"{prefix}{i}" for i in range(r)]
        opened = 0
        for i in range(r - 1):
            w.line(
                f"for (long long {coords[i]} = 0; {coords[i]} < {self.rdims[i]}; ++{coords[i]}) {{"
            )
            w.level += 1
            opened += 1
        if r:
            if pragma:
                w.line(pragma)
            w.line(
                f"for (long long {coords[-1]} = 0; {coords[-1]} < {self.rdims[-1]}; ++{coords[-1]}) {{"
            )
            w.level += 1
            opened += 1
        n = self.n
        names = print_program(
            w,
            self.x.program,
            lambda a: (
                f"{self.ins[a][0]}[{_sum(f'bi{a}', [_term(c, t) for c, t in zip(coords, self.ins[a][1][n:], strict=True)])}]"
            ),
            lambda a: (
                f"({_sum(f'bx{a}', [_term(c, t) for c, t in zip(coords, self.idx[a][1][n:], strict=True)])})"
            ),
            prefix=f"{prefix}v",
        )
        flat = coords[0] if coords else "0"
        for i in range(1, r):
            flat = f"({flat}) * {self.rdims[i]} + {coords[i]}"
        body(w, f"({self.acc}){names[self.x.program.roots[0]]}", flat)
        for _ in range(opened):
            w.level -= 1
            w.line("}")

    def out_ref(self, j: str | None) -> str:
        off = "bo" if j is None else _sum("bo", [_term(j, self.so[-1])])
        return f"{self.out}[{off}]"

    def finish(self, kind: str, weight: int) -> CCall:
        rows = " * ".join(self.odims) if self.odims else "1"
        ncols = " * ".join(self.rdims) if self.rdims else "1"
        shared = [f"const long long rows = {rows}, ncols = {ncols};", "(void)ncols;"]
        top = CodeWriter(1)
        for line in shared:
            top.line(line)

        def region(w: CodeWriter) -> None:
            w.line("long long lo, hi;")
            with (
                w.block("while (kn_next(kn_t, &lo, &hi))"),
                w.block("for (long long row = lo; row < hi; ++row)"),
            ):
                w.lines.extend(self.w.lines)

        _parallel(top, self.a, shared, "rows", f"rows * ncols * {weight}", region)
        return _call(kind, self.a, top)


def _softmax(s: st.Softmax) -> CCall:
    r = _Rows(s.x, len(s.x.shape) - 1, s.out)
    acc, w = r.acc, r.w
    e = "exp" if acc == "double" else "expf"
    r.open()
    w.line(f"{acc} mx = -KN_INF;")
    r.loop(
        "a",
        lambda w, v, _: w.line(f"mx = {v} > mx ? {v} : mx;"),
        "#pragma omp simd reduction(max : mx)",
    )
    w.line("if (!isfinite(mx)) mx = 0;  // as the reference: a row of -inf gives NaN")
    w.line(f"{acc} sum = 0;")
    direct = exprs.compute_ctype(s.out.dtype) == acc
    if direct:  # store the exponentials, then divide them in place

        def keep(w: CodeWriter, v: str, j: str) -> None:
            w.line(f"const {acc} ev = {e}({v} - mx);")
            w.line(f"{r.out_ref(j)} = ev;")
            w.line("sum += ev;")

        r.loop("b", keep, "#pragma omp simd reduction(+ : sum)")
        rd = r.rdims[-1]
        with w.block(f"for (long long cj = 0; cj < {rd}; ++cj)"):
            w.line(f"{r.out_ref('cj')} = {r.out_ref('cj')} / sum;")
    else:
        r.loop(
            "b",
            lambda w, v, _: w.line(f"sum += {e}({v} - mx);"),
            "#pragma omp simd reduction(+ : sum)",
        )
        r.loop(
            "c",
            lambda w, v, j: w.line(
                f"{r.out_ref(j)} = {exprs.store(s.out.dtype, f'{e}({v} - mx) / sum')};"
            ),
        )
    return r.finish("softmax", 12)


def _layernorm(s: st.Layernorm) -> CCall:
    r = _Rows(s.x, len(s.x.shape) - 1, s.out)
    acc, w = r.acc, r.w
    f = "" if acc == "double" else "f"
    eps = r.a.float_("eps", s.eps, acc)
    r.open()
    w.line(f"{acc} sum = 0;")
    r.loop("a", lambda w, v, _: w.line(f"sum += {v};"), "#pragma omp simd reduction(+ : sum)")
    w.line(f"const {acc} mean = sum / ({acc})ncols;")
    w.line(f"{acc} sq = 0;")

    def var(w: CodeWriter, v: str, _: str) -> None:
        w.line(f"const {acc} dv = {v} - mean;")
        w.line("sq += dv * dv;")

    r.loop("b", var, "#pragma omp simd reduction(+ : sq)")
    w.line(f"const {acc} den = sqrt{f}(sq / ({acc})ncols + {eps});")
    r.loop(
        "c",
        lambda w, v, j: w.line(
            f"{r.out_ref(j)} = {exprs.store(s.out.dtype, f'({v} - mean) / den')};"
        ),
    )
    return r.finish("layernorm", 4)


COLUMNS = 16
"""Outputs one task of a column reduction accumulates side by side (a vector register of f32)."""


def _columnar(s: st.Reduce) -> bool:
    """Whether `s` reduces down columns: its last kept axis is contiguous (stride 1) in an input
    whose reduced axes are not (a channels-last tensor averaged over H and W), and every other
    input has stride 0 or 1 there. The row kernel would walk each output's values at a stride
    of C; the column kernel walks the rows once, C outputs side by side."""
    x, n = s.x, s.out.rank
    if n == 0 or s.reduced_rank == 0 or x.indices or s.op not in _COLUMN_OPS:
        return False
    inner = [v.strides[n - 1] for v in x.inputs]
    if not x.inputs or any(t not in (0, 1) for t in inner) or x.shape[n - 1] < 2:
        return False
    return any(t == 1 and v.strides[-1] != 1 for t, v in zip(inner, x.inputs, strict=True))


def _reduce_columns(s: st.Reduce, acc: str) -> CCall:
    """A reduction down columns (see `_columnar`): each task takes up to `COLUMNS` consecutive
    outputs of one row of the kept axes and walks the reduced coordinates once, accumulating
    them side by side in a vectorized inner loop."""
    x, n, xdt = s.x, s.out.rank, s.x.dtype
    a = _Args()
    odims = [a.int_(f"od{i}", d) for i, d in enumerate(x.shape[:n])]
    rdims = [a.int_(f"rd{i}", d) for i, d in enumerate(x.shape[n:])]
    ins = [(a.ptr(f"in{k}", v), v.strides) for k, v in enumerate(x.inputs)]
    sis = [
        [a.int_(f"si{k}_{i}", t) for i, t in enumerate(v.strides) if i != n - 1]
        for k, v in enumerate(x.inputs)
    ]
    out = a.ptr("out", s.out, const=False)
    so = a.strides("so", s.out.strides, inner=False)
    w = CodeWriter(1)
    cols = odims[-1]
    rows = " * ".join(odims[:-1]) or "1"
    ncols = " * ".join(rdims)
    shared = [
        f"const long long rows = {rows}, ncols = {ncols};",
        f"const long long nb = ({cols} + {COLUMNS - 1}) / {COLUMNS};",
    ]
    for line in shared:
        w.line(line)
    weight = 1 + _weight(x.program)

    def region(w: CodeWriter) -> None:
        w.line("long long lo, hi;")
        with (
            w.block("while (kn_next(kn_t, &lo, &hi))"),
            w.block("for (long long u = lo; u < hi; ++u)"),
        ):
            w.line(f"const long long j0 = (u % nb) * {COLUMNS};")
            w.line(f"const long long jn = {cols} - j0 < {COLUMNS} ? {cols} - j0 : {COLUMNS};")
            w.line("long long rem = u / nb;")
            for i in range(n - 2, -1, -1):
                w.line(f"const long long c{i} = rem % {odims[i]}; rem /= {odims[i]};")
            for k, (_, strides) in enumerate(ins):
                kept = [_term(f"c{i}", sis[k][i]) for i in range(n - 1)]
                lead = "j0" if strides[n - 1] == 1 else ""
                w.line(f"const long long bi{k} = {_sum(lead, kept)};")
            kept_o = [_term(f"c{i}", so[i]) for i in range(n - 1)]
            w.line(f"const long long bo = {_sum(_term('j0', so[n - 1]), kept_o)};")
            low = s.op is ReduceOp.MIN
            init = {
                ReduceOp.SUM: "0",
                ReduceOp.MEAN: "0",
                ReduceOp.PROD: "1",
                ReduceOp.MIN: exprs.extreme(xdt, acc, True),
                ReduceOp.MAX: exprs.extreme(xdt, acc, False),
            }[s.op]
            w.line(f"{acc} a[{COLUMNS}];")
            w.line(f"int nan[{COLUMNS}];")
            with w.block(f"for (long long j = 0; j < {COLUMNS}; ++j)"):
                w.line(f"a[j] = {init}; nan[j] = 0;")
            opened = 0
            for i, d in enumerate(rdims):
                w.line(f"for (long long r{i} = 0; r{i} < {d}; ++r{i}) {{")
                w.level += 1
                opened += 1
            for k in range(len(ins)):
                terms = [_term(f"r{i}", sis[k][n - 1 + i]) for i in range(len(rdims))]
                w.line(f"const long long ro{k} = {_sum(f'bi{k}', terms)};")
            w.line("#pragma omp simd")
            with w.block("for (long long j = 0; j < jn; ++j)"):
                names = print_program(
                    w,
                    x.program,
                    lambda q: f"{ins[q][0]}[{_sum(f'ro{q}', [_term('j', str(ins[q][1][n - 1]))])}]",
                    lambda q: "0",
                )
                v = f"({acc}){names[x.program.roots[0]]}"
                match s.op:
                    case ReduceOp.SUM | ReduceOp.MEAN:
                        w.line(f"a[j] = a[j] + {v};")
                    case ReduceOp.PROD:
                        w.line(f"a[j] = a[j] * {v};")
                    case _:
                        w.line(f"const {acc} ev = {v};")
                        w.line("nan[j] |= ev != ev;")
                        w.line(f"a[j] = ev {'<' if low else '>'} a[j] ? ev : a[j];")
            for _ in range(opened):
                w.level -= 1
                w.line("}")
            with w.block("for (long long j = 0; j < jn; ++j)"):
                dst = f"{out}[{_sum('bo', [_term('j', so[n - 1])])}]"
                if s.op is ReduceOp.MEAN:
                    val = (
                        "a[j] / (" + acc + ")ncols"
                        if xdt.is_float
                        else f"(ncols ? a[j] / ({acc})ncols : 0)"
                    )
                elif s.op in (ReduceOp.MIN, ReduceOp.MAX) and xdt.is_float:
                    val = f"nan[j] ? ({acc})NAN : a[j]"
                else:
                    val = "a[j]"
                w.line(f"{dst} = {exprs.store(s.out.dtype, val)};")
            w.line("(void)nan;")

    _parallel(w, a, shared, "rows * nb", f"rows * {cols} * ncols * {weight}", region)
    return _call("reduce_cols", a, w)


_COLUMN_OPS = (ReduceOp.SUM, ReduceOp.MEAN, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX)


def _reduce(s: st.Reduce) -> CCall:
    x = s.x
    r = _Rows(x, s.out.rank, s.out)
    xdt = x.dtype
    acc = exprs.acc_ctype(xdt) if xdt.is_float else exprs.compute_ctype(xdt)
    if xdt is DType.BOOL or (xdt.is_int and xdt.size < 4):
        acc = "int" if xdt.is_signed or xdt is DType.BOOL else "unsigned int"
    r.acc = acc
    if _columnar(s):
        return _reduce_columns(s, acc)
    w = r.w
    r.open()
    dst = r.out_ref(None)
    store = lambda v: w.line(f"{dst} = {exprs.store(s.out.dtype, v)};")  # noqa: E731
    match s.op:
        case ReduceOp.SUM | ReduceOp.MEAN | ReduceOp.PROD:
            sym = "*" if s.op is ReduceOp.PROD else "+"
            w.line(f"{acc} a = {'1' if s.op is ReduceOp.PROD else '0'};")
            r.loop(
                "a",
                lambda w, v, _: w.line(f"a = a {sym} {v};"),
                f"#pragma omp simd reduction({sym} : a)",
            )
            if s.op is ReduceOp.MEAN:
                store(f"a / ({acc})ncols" if xdt.is_float else f"(ncols ? a / ({acc})ncols : 0)")
            else:
                store("a")
        case ReduceOp.MIN | ReduceOp.MAX:
            low = s.op is ReduceOp.MIN
            cmp, red = ("<", "min") if low else (">", "max")
            w.line(f"{acc} a = {exprs.extreme(xdt, acc, low)};")
            w.line("int nan = 0;")

            def ext(w: CodeWriter, v: str, _: str) -> None:
                w.line(f"const {acc} ev = {v};")
                w.line("nan |= ev != ev;")
                w.line(f"a = ev {cmp} a ? ev : a;")

            r.loop("a", ext, f"#pragma omp simd reduction({red} : a) reduction(| : nan)")
            store(f"nan ? ({acc})NAN : a" if xdt.is_float else "a")
        case ReduceOp.ARGMIN | ReduceOp.ARGMAX:
            low = s.op is ReduceOp.ARGMIN
            cmp = "<" if low else ">"
            w.line(f"{acc} a = {exprs.extreme(xdt, acc, low)};")
            w.line("long long ai = -1;")

            def arg(w: CodeWriter, v: str, j: str) -> None:
                w.line(f"const {acc} ev = {v};")
                with w.block(f"if (a == a && (ev != ev || ev {cmp} a))"):
                    w.line(f"a = ev; ai = {j};")

            r.loop("a", arg)
            w.line(f"{dst} = ai < 0 ? 0 : ai;")
        case _:
            assert_never(s.op)
    return r.finish("reduce", 1 + _weight(x.program))


# -- attention ----------------------------------------------------------------------------------------
def _attention(s: st.Attention) -> CCall:
    """Per (batch, head): k and v transposed once into per-thread scratch (kt [d, n], vt [dv, n]),
    so every inner loop runs along the keys, contiguous and vectorizable whatever d and dv are;
    then per query row: scores, max, exponentials and their sum, one dot per output column."""
    a = _Args()
    b1n, b2n, m, d = s.q.shape
    n, dv = s.k.shape[2], s.v.shape[3]
    dt = s.q.dtype
    acc = "double" if dt is DType.F64 else "float"
    e = "exp" if acc == "double" else "expf"
    a.int_("batch", b1n * b2n)
    a.int_("heads", b2n)
    a.int_("m", m)
    a.int_("n", n)
    a.int_("d", d)
    a.int_("dv", dv)
    a.float_("scale", s.scale, acc)
    q, sq = a.ptr("q", s.q), a.strides("sq", s.q.strides)
    k, sk = a.ptr("k", s.k), a.strides("sk", s.k.strides)
    v, sv = a.ptr("v", s.v), a.strides("sv", s.v.strides)
    out, so = a.ptr("out", s.out, const=False), a.strides("so", s.out.strides)

    def at(sts: Sequence[str], *coords: str) -> str:
        return _sum("", [_term(c, t) for c, t in zip(coords, sts, strict=False)])

    w = CodeWriter(1)
    shared = ["const long long rows = batch * m;"]
    w.line(shared[0])

    def region(w: CodeWriter) -> None:
        w.line(f"{acc}* kt = ({acc}*)malloc(sizeof({acc}) * (size_t)((d + dv + 1) * n + 1));")
        w.line(f"{acc}* vt = kt + d * n;")
        w.line(f"{acc}* sc = vt + dv * n;")
        w.line("long long lo, hi, cur = -1;")
        with (
            w.block("while (kn_next(kn_t, &lo, &hi))"),
            w.block("for (long long row = lo; row < hi; ++row)"),
        ):
            w.line("const long long b = row / m, i = row % m, b1 = b / heads, b2 = b % heads;")
            with w.block("if (b != cur)"):
                w.line("cur = b;")
                with w.block("for (long long j = 0; j < n; ++j)"):
                    w.line(f"const long long kb = {at(sk, 'b1', 'b2', 'j')};")
                    w.line(f"const long long vb = {at(sv, 'b1', 'b2', 'j')};")
                    kl = exprs.load(dt, f"{k}[{_sum('kb', [_term('t', sk[3])])}]")
                    vl = exprs.load(dt, f"{v}[{_sum('vb', [_term('c', sv[3])])}]")
                    w.line(f"for (long long t = 0; t < d; ++t) kt[t * n + j] = ({acc}){kl};")
                    w.line(f"for (long long c = 0; c < dv; ++c) vt[c * n + j] = ({acc}){vl};")
            w.line(f"const long long qb = {at(sq, 'b1', 'b2', 'i')};")
            if s.causal:
                w.line("long long jend = i + (n - m) + 1;")
                w.line("jend = jend < 0 ? 0 : (jend > n ? n : jend);")
            else:
                w.line("const long long jend = n;")
            w.line("for (long long j = 0; j < jend; ++j) sc[j] = 0;")
            with w.block("for (long long t = 0; t < d; ++t)"):
                ql = exprs.load(dt, f"{q}[{_sum('qb', [_term('t', sq[3])])}]")
                w.line(f"const {acc} qt = ({acc}){ql};")
                w.line(f"const {acc}* restrict kr = kt + t * n;")
                w.line("#pragma omp simd")
                w.line("for (long long j = 0; j < jend; ++j) sc[j] += qt * kr[j];")
            w.line(f"{acc} mx = -KN_INF;")
            if s.mask is not None:
                mask, sm = a.ptr("mask", s.mask), a.strides("sm", s.mask.strides)
                w.line(f"const long long mb = {at(sm, 'b1', 'b2', 'i')};")
                ml = exprs.load(s.mask.dtype, f"{mask}[{_sum('mb', [_term('j', sm[3])])}]")
                masked = f" + ({acc}){ml}"
            else:
                masked = ""
            w.line("#pragma omp simd reduction(max : mx)")
            with w.block("for (long long j = 0; j < jend; ++j)"):
                w.line(f"const {acc} sj = sc[j] * scale{masked};")
                w.line("sc[j] = sj;")
                w.line("mx = sj > mx ? sj : mx;")
            w.line("if (!isfinite(mx)) mx = 0;  // as the reference: a fully masked row gives NaN")
            w.line(f"{acc} l = 0;")
            w.line("#pragma omp simd reduction(+ : l)")
            with w.block("for (long long j = 0; j < jend; ++j)"):
                w.line(f"const {acc} pj = {e}(sc[j] - mx);")
                w.line("sc[j] = pj;")
                w.line("l += pj;")
            w.line(f"const long long ob = {at(so, 'b1', 'b2', 'i')};")
            with w.block("for (long long c = 0; c < dv; ++c)"):
                w.line(f"const {acc}* restrict vr = vt + c * n;")
                w.line(f"{acc} o = 0;")
                w.line("#pragma omp simd reduction(+ : o)")
                w.line("for (long long j = 0; j < jend; ++j) o += sc[j] * vr[j];")
                w.line(
                    f"{out}[{_sum('ob', [_term('c', so[3])])}] = {exprs.store(s.out.dtype, 'o / l')};"
                )
        w.line("free(kt);")

    _parallel(w, a, shared, "rows", "rows * n * (d + dv)", region)
    return _call("attention", a, w)


# -- plans --------------------------------------------------------------------------------------------
def step_call(step: st.Step) -> CCall | None:
    """The C call of a step, or None for the library steps (GEMMs and convolutions)."""
    match step:
        case st.Elementwise():
            return _elementwise(step)
        case st.Copy():
            return _copy(step)
        case st.Gather():
            return _gather(step)
        case st.Softmax():
            return _softmax(step)
        case st.Layernorm():
            return _layernorm(step)
        case st.Reduce():
            return _reduce(step)
        case st.Attention():
            return _attention(step)
        case st.MatMul() | st.Conv():
            return None
        case _:
            assert_never(step)


def library_sources(kernels: Sequence[CKernel], prelude: str, parts: int = 1) -> list[str]:
    """Translation units of one shared library (compiled in parallel, linked together): the
    kernels split over `parts` units, then the main one with a table of them and the step loop
    `kn_run(base, n, kid, p, f)`: kernel `kid[k]` with arguments `p[k]`, `f[k]` for each step k
    in order (kid -1: a oneDNN primitive, see the C comment); returns 0, or k + 1 for the first
    step that failed. `kn_bind_pool` binds the library to the process's thread pool (`pool.c`,
    `build.pool`); until it is bound every step runs on the calling thread."""
    head = [
        f"#define KN_PAR_WORK {PAR_WORK}",
        prelude,
        "#include <stdlib.h>",
        '#define KN_KERNEL __attribute__((visibility("hidden")))',
    ]
    parts = max(1, min(parts, len(kernels)))
    units = ["\n".join([*head, *(k.source for k in kernels[i::parts])]) for i in range(parts)]
    sig = "(char* restrict, const long long* restrict, const double* restrict)"
    lines = [*head, *(f"KN_KERNEL int {k.name}{sig};" for k in kernels)]
    lines.append(f"typedef int (*kn_fn){sig};")
    table = ", ".join(k.name for k in kernels) or "0"
    lines.append(f"static const kn_fn kn_kernels[] = {{{table}}};")
    lines.append(
        """
/* oneDNN primitives run from the same loop: kernel id -1, p[k] = {primitive, stream, nargs,
   args}, called through dnnl_primitive_execute (set once by kn_set_dnnl); a status other than
   success stops the loop and is kept for kn_last_status. */
typedef int (*kn_dnnl_fn)(const void*, void*, int, const void*);
static kn_dnnl_fn kn_dnnl_execute = 0;
static __thread int kn_status = 0;

void kn_set_dnnl(void* execute) { kn_dnnl_execute = (kn_dnnl_fn)execute; }
int kn_last_status(void) { return kn_status; }

/* The thread pool's entry points (pool.c): kn_parallel runs regions through kn_run_pool; the
   step loop parks the pool's spinning workers before a oneDNN primitive, whose OpenMP team
   needs the cores. */
__attribute__((visibility("hidden"))) void (*kn_run_pool)(
    kn_body, char*, const long long*, const double*, long long, long long) = 0;
__attribute__((visibility("hidden"))) int (*kn_next_chunk)(kn_task*, long long*, long long*) = 0;
static void (*kn_park)(void) = 0;
static void (*kn_pool_set_threads)(int) = 0;

void kn_bind_pool(void* run, void* next, void* park, void* threads) {
    kn_next_chunk = (int (*)(kn_task*, long long*, long long*))next;
    kn_park = (void (*)(void))park;
    kn_pool_set_threads = (void (*)(int))threads;
    kn_run_pool = (void (*)(kn_body, char*, const long long*, const double*, long long,
                            long long))run;
}

int kn_run(char* base, int n, const int* kid, const long long* const* p, const double* const* f) {
    kn_status = 0;
    for (int k = 0; k < n; ++k) {
        if (kid[k] < 0) {
            const long long* q = p[k];
            if (kn_park) kn_park();
            int st = kn_dnnl_execute((const void*)q[0], (void*)q[1], (int)q[2], (const void*)q[3]);
            if (st) { kn_status = st; return k + 1; }
        } else if (kn_kernels[kid[k]](base, p[k], f[k])) {
            return k + 1;
        }
    }
    return 0;
}

int kn_one(char* base, int kid, const long long* p, const double* f) {
    return kn_kernels[kid](base, p, f);
}

/* Threads for the steps this calling thread runs: the pool's and OpenMP's (oneDNN's team). */
void kn_set_threads(int n) {
    if (kn_pool_set_threads) kn_pool_set_threads(n);
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
}

int kn_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
"""
    )
    return [*units, "\n".join(lines)] if kernels else ["\n".join(lines)]
