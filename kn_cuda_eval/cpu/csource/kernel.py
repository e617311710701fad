"""What every C kernel of the CPU backend shares: the signature
`int name(char* base, const long long* p, const double* f)` (sizes, strides and byte offsets in
`p`, scales and epsilons in `f`, declared at the top of the function by `Args`, so one compiled
function serves every step of the same structure), offsets as sums of coordinate·stride terms,
and the work split: the parallel part of a kernel is a region function of its own (`parallel`)
that the process's thread pool (`pool.c`) runs over chunks of units when the step is big enough
(`PAR_WORK`), the calling thread taking chunks too; `nest` is the odometer loop nest of the
element-parallel steps."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from kn_cuda_eval.codegen import exprs
from kn_cuda_eval.codegen.template import CodeWriter
from kn_cuda_eval.planning.program import Const, Program, Un
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType
from kn_graph.ops import UnaryOp

__all__ = [
    "HEAVY",
    "PAR_WORK",
    "Args",
    "CCall",
    "CKernel",
    "Term",
    "call",
    "nest",
    "offset_sum",
    "parallel",
    "program_weight",
    "stride_terms",
    "term",
]

PAR_WORK = 1 << 16
"""A step runs on several threads when its elements times its per-element weight pass this."""

HEAVY = frozenset(
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
"""Unary ops that cost about as much as a few memory accesses (libm calls or long polynomials):
they weigh in `program_weight` and make a value worth tabulating (`elementwise.hoisted`)."""


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


class Args:
    """Kernel parameters read from `p` / `f` at the top of the function, with their values."""

    def __init__(self) -> None:
        self.decls: list[str] = []
        self.ints: list[int] = []
        self.floats: list[float] = []
        self.regions: list[CodeWriter] = []  # parallel region functions (`parallel`)

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

    def const(self, c: Const) -> str | None:
        """An integer constant of a program as a parameter, or None (printed as a literal):
        sizes reach programs as constants (a symbol's value, `Graph.size_value`, a gather's
        axis length), and a literal made every sequence length a new kernel, so a new C
        library to compile (BERT at 100 and at 101 tokens). Floats and -2..2 stay literals
        (a float clamp's bounds decide its cast's code; 0, 1 and 2 simplify)."""
        v = c.value
        if not c.dtype.is_int or c.dtype is DType.BOOL or -2 <= int(v) <= 2:
            return None
        if not -(2**63) <= int(v) < 2**63:  # a u64 past i64: its literal
            return None
        return self.int_(f"kc{len(self.ints)}", int(v))

    def strides(self, prefix: str, strides: Sequence[int], inner: bool = True) -> list[str]:
        """Stride names; the innermost one (with `inner`) is specialised to a literal 0, 1 or 2,
        the stride classes that vectorize differently (2: a max pool's taps, read with
        shuffles instead of one load per element; P.808's pools 6-17 % faster)."""
        out = [self.int_(f"{prefix}_{a}", s) for a, s in enumerate(strides[:-1])]
        if strides:
            s = strides[-1]
            last = f"{prefix}_{len(strides) - 1}"
            out.append(str(s) if inner and s in (0, 1, 2) else self.int_(last, s))
        return out


def term(coord: str, stride: str) -> str:
    """One axis's offset term: nothing for stride 0, the coordinate for stride 1."""
    if stride == "0":
        return ""
    return coord if stride == "1" else f"{coord} * {stride}"


def offset_sum(base: str, terms: Sequence[str]) -> str:
    """`base` plus the non-empty `terms`, or 0."""
    parts = [t for t in (base, *terms) if t and t != "0"]
    return " + ".join(parts) if parts else "0"


Term = Callable[[str], str]
"""The offset contribution of one axis given its coordinate's C name."""


def stride_terms(strides: Sequence[str]) -> list[Term]:
    return [lambda c, s=s: term(c, s) for s in strides]


def program_weight(prog: Program) -> int:
    """The work of one element of `prog`, in units of `PAR_WORK`."""
    heavy = sum(isinstance(i, Un) and i.op in HEAVY for i in prog.instrs)
    return 1 + prog.cost + 8 * heavy


def parallel(
    w: CodeWriter,
    a: Args,
    shared: Sequence[str],
    units: str,
    work: str,
    region: Callable[[CodeWriter], None],
) -> None:
    """A parallel loop over `units` units of work: `region` (writing at the level of a function
    body) becomes a function of its own, `KN_REGION<i>` until `call` names it, that loops
    `while (kn_next(kn_t, &lo, &hi))` over the chunks [lo, hi) it is given; the kernel calls
    `kn_parallel`, which runs it on the pool's threads when `work` passes `PAR_WORK`, else once
    over every unit. `shared`: declarations both need, written in both."""
    r = CodeWriter(1)
    for line in shared:
        r.line(line)
    region(r)
    w.line(f"kn_parallel(KN_REGION{len(a.regions)}, base, p, f, {units}, {work});")
    a.regions.append(r)


@contextmanager
def each_unit(w: CodeWriter, var: str) -> Iterator[None]:
    """Inside a `parallel` region: the body runs for every unit `var` of every chunk [lo, hi)
    the region is given."""
    w.line("long long lo, hi;")
    with (
        w.block("while (kn_next(kn_t, &lo, &hi))"),
        w.block(f"for (long long {var} = lo; {var} < hi; ++{var})"),
    ):
        yield


def nest(
    w: CodeWriter,
    args: Args,
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
        body(w, [offset_sum(b, []) for b, _ in operands])
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
                    w.line(f"const long long o{k} = {offset_sum(base, outer_terms)};")
                    offs.append(offset_sum(f"o{k}", [terms[-1]("j")]))
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
            parallel(
                w, args, shared, "kn_rows * kn_split", f"kn_rows * kn_inner * {weight}", region
            )


_REGION = re.compile(r"\bKN_REGION(\d+)\b")


def _kernel(
    kind: str, a: Args, body: CodeWriter
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


def call(kind: str, a: Args, body: CodeWriter) -> CCall:
    """The kernel whose body is `body` (after the declarations of `a`) and its region functions,
    named by kind and by a hash of its source, called with `a`'s values."""
    k, ints, floats = _kernel(kind, a, body)
    return CCall(k, ints, floats)
