"""The C kernel of a reduction down columns (`columnar`): the reduction of `codegen/rows.py`,
whose fold and result the row kernels spell alike (`folds.py`), with `COLUMNS` outputs
accumulated side by side in a vectorized loop, so that a channels-last tensor averaged over H and
W is read once, contiguously, instead of at a stride of C per output."""

from __future__ import annotations

from kn_cuda_eval.codegen import exprs, rows
from kn_cuda_eval.codegen.printer import print_program
from kn_cuda_eval.codegen.template import CodeWriter
from kn_cuda_eval.cpu.csource.folds import fold_result, print_fold
from kn_cuda_eval.cpu.csource.kernel import (
    Args,
    CCall,
    call,
    each_unit,
    offset_sum,
    parallel,
    program_weight,
    term,
)
from kn_cuda_eval.planning import steps as st
from kn_graph.ops import ReduceOp

__all__ = ["COLUMNS", "columnar", "reduce_columns_call"]

COLUMNS = 16
"""Outputs one task of a column reduction accumulates side by side (a vector register of f32)."""

_COLUMN_OPS = (ReduceOp.SUM, ReduceOp.MEAN, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX)


def columnar(s: st.Reduce) -> bool:
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


class _Columns:
    """The parameters of a column kernel: the kept axes `od*` (the last one, `cols`, the
    columns), the reduced axes `rd*`, each input's strides but along the columns (which are
    0 or 1, literals), the output's."""

    def __init__(self, s: st.Reduce) -> None:
        x, n = s.x, s.out.rank
        self.s, self.n = s, n
        a = self.a = Args()
        self.odims = [a.int_(f"od{i}", d) for i, d in enumerate(x.shape[:n])]
        self.rdims = [a.int_(f"rd{i}", d) for i, d in enumerate(x.shape[n:])]
        self.ins = [(a.ptr(f"in{k}", v), v.strides) for k, v in enumerate(x.inputs)]
        self.sis = [
            [a.int_(f"si{k}_{i}", t) for i, t in enumerate(v.strides) if i != n - 1]
            for k, v in enumerate(x.inputs)
        ]
        self.out = a.ptr("out", s.out, const=False)
        self.so = a.strides("so", s.out.strides, inner=False)
        self.cols = self.odims[-1]

    def bases(self, w: CodeWriter) -> None:
        """The task `u`'s columns [j0, j0 + jn) and its bases: `bi{k}` per input, `bo`."""
        n, so = self.n, self.so
        w.line(f"const long long j0 = (u % nb) * {COLUMNS};")
        w.line(f"const long long jn = {self.cols} - j0 < {COLUMNS} ? {self.cols} - j0 : {COLUMNS};")
        w.line("long long rem = u / nb;")
        for i in range(n - 2, -1, -1):
            w.line(f"const long long c{i} = rem % {self.odims[i]}; rem /= {self.odims[i]};")
        for k, (_, strides) in enumerate(self.ins):
            kept = [term(f"c{i}", self.sis[k][i]) for i in range(n - 1)]
            lead = "j0" if strides[n - 1] == 1 else ""
            w.line(f"const long long bi{k} = {offset_sum(lead, kept)};")
        kept_o = [term(f"c{i}", so[i]) for i in range(n - 1)]
        w.line(f"const long long bo = {offset_sum(term('j0', so[n - 1]), kept_o)};")

    def accumulate(self, w: CodeWriter, k: rows.RowKernel) -> None:
        """The accumulators `a[j]` (and NaN flags `nan[j]`) over every reduced coordinate."""
        p, n, x = k.last, self.n, self.s.x
        w.line(f"{k.acc} a[{COLUMNS}];")
        if p.nan:
            w.line(f"int nan[{COLUMNS}];")
        with w.block(f"for (long long j = 0; j < {COLUMNS}; ++j)"):
            w.line(f"a[j] = {p.identity};{' nan[j] = 0;' if p.nan else ''}")
        for i, d in enumerate(self.rdims):
            w.line(f"for (long long r{i} = 0; r{i} < {d}; ++r{i}) {{")
            w.level += 1
        for q in range(len(self.ins)):
            terms = [term(f"r{i}", self.sis[q][n - 1 + i]) for i in range(len(self.rdims))]
            w.line(f"const long long ro{q} = {offset_sum(f'bi{q}', terms)};")
        w.line("#pragma omp simd")
        with w.block("for (long long j = 0; j < jn; ++j)"):
            names = print_program(
                w,
                x.program,
                lambda q: (
                    f"{self.ins[q][0]}[{offset_sum(f'ro{q}', [term('j', str(self.ins[q][1][n - 1]))])}]"
                ),
                lambda q: "0",
                const_ref=self.a.const,
            )
            v = p.value.print(w, k.acc, f"({k.acc}){names[x.program.roots[0]]}")
            print_fold(w, p, k.acc, v, "a[j]", "nan[j]", "j")
        for _ in self.rdims:
            w.level -= 1
            w.line("}")

    def store(self, w: CodeWriter, k: rows.RowKernel) -> None:
        """The task's `jn` outputs."""
        assert isinstance(k.store, rows.StoreRow)
        with w.block("for (long long j = 0; j < jn; ++j)"):
            dst = f"{self.out}[{offset_sum('bo', [term('j', self.so[self.n - 1])])}]"
            value = k.store.of(fold_result(k.last, k.acc, "a[j]", "nan[j]"))
            w.line(f"{dst} = {exprs.store(self.s.out.dtype, value)};")


def reduce_columns_call(s: st.Reduce) -> CCall:
    """A reduction down columns (see `columnar`): each task takes up to `COLUMNS` consecutive
    outputs of one row of the kept axes and walks the reduced coordinates once, accumulating
    them side by side in a vectorized inner loop."""
    k = rows.reduce(s.op, s.x.dtype)
    c = _Columns(s)
    w = CodeWriter(1)
    shared = [
        f"const long long rows = {' * '.join(c.odims[:-1]) or '1'}, ncols = {' * '.join(c.rdims)};",
        f"const long long nb = ({c.cols} + {COLUMNS - 1}) / {COLUMNS};",
    ]
    for line in shared:
        w.line(line)

    def region(w: CodeWriter) -> None:
        with each_unit(w, "u"):
            c.bases(w)
            c.accumulate(w, k)
            c.store(w, k)

    weight = 1 + program_weight(s.x.program)
    parallel(w, c.a, shared, "rows * nb", f"rows * {c.cols} * ncols * {weight}", region)
    return call("reduce_cols", c.a, w)
