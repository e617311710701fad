"""C kernels of the row steps — softmax, layernorm and reductions along rows — printed from the
device-neutral description of `codegen/rows.py` that the CUDA generator prints too. Rows are
split over the thread pool; per row, each pass is a counted loop nest over the row's axes whose
innermost loop runs under `#pragma omp simd reduction(...)` (the fold's C spelling: `folds.py`),
the row's input computed by its fused program at every element.

One difference from the CUDA printing, for speed: when the output holds the accumulator type,
the last pass of a kernel whose stored value is the value that pass folds (softmax's exp) stores
that value as it folds it, and the store divides in place — one exp per element instead of two.
For an f16 output the stored exponential is rounded to f16 before the division (two roundings).

>>> from kn_cuda_eval.planning.program import Load, Program
>>> v = StridedView.dense(0, (4, 8), DType.F32)
>>> x = st.Expr((4, 8), (v,), (), Program((Load(0, DType.F32),), (0,)))
>>> call = softmax_call(st.Softmax(x, v.with_offset(128)))
>>> call.kernel.name.startswith("kn_softmax_"), call.ints
(True, (4, 8, 0, 8, 128, 8))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import assert_never

from kn_cuda_eval.codegen import exprs, rows
from kn_cuda_eval.codegen.printer import print_program
from kn_cuda_eval.codegen.template import CodeWriter
from kn_cuda_eval.cpu.csource.folds import fold_pragma, fold_result, print_fold
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
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType

__all__ = ["layernorm_call", "reduce_rows_call", "softmax_call"]


def _at(base: str, coords: Sequence[str], strides: Sequence[str]) -> str:
    return offset_sum(base, [term(c, t) for c, t in zip(coords, strides, strict=True)])


class _Rows:
    """A row kernel: rows over the leading `n_outer` axes of the expression x, in parallel; per
    row, loops over the remaining axes computing x's program at each element."""

    def __init__(self, x: st.Expr, n_outer: int, out: StridedView, acc: str) -> None:
        self.x = x
        self.n = n_outer
        a = self.a = Args()
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
        self.acc = acc
        self.w = CodeWriter(3)

    def open(self) -> None:
        """Row bases: `bi{k}`, `bx{k}`, `bo` (the caller opens the parallel loop)."""
        w = self.w
        w.line("long long rem = row;")
        for i in range(len(self.odims) - 1, -1, -1):
            w.line(f"const long long c{i} = rem % {self.odims[i]}; rem /= {self.odims[i]};")
        coords = [f"c{i}" for i in range(len(self.odims))]
        for k, (_, s) in enumerate(self.ins):
            w.line(f"const long long bi{k} = {_at('', coords, s[: self.n])};")
        for k, (name, s) in enumerate(self.idx):
            w.line(f"const long long bx{k} = {_at(name, coords, s[: self.n])};")
        w.line(f"const long long bo = {_at('', coords, self.so[: len(coords)])};")

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
            lambda a: f"{self.ins[a][0]}[{_at(f'bi{a}', coords, self.ins[a][1][n:])}]",
            lambda a: f"({_at(f'bx{a}', coords, self.idx[a][1][n:])})",
            prefix=f"{prefix}v",
            const_ref=self.a.const,
        )
        flat = coords[0] if coords else "0"
        for i in range(1, r):
            flat = f"({flat}) * {self.rdims[i]} + {coords[i]}"
        body(w, f"({self.acc}){names[self.x.program.roots[0]]}", flat)
        for _ in range(opened):
            w.level -= 1
            w.line("}")

    def out_ref(self, j: str | None) -> str:
        off = "bo" if j is None else offset_sum("bo", [term(j, self.so[-1])])
        return f"{self.out}[{off}]"

    def finish(self, kind: str, weight: int) -> CCall:
        rows = " * ".join(self.odims) if self.odims else "1"
        ncols = " * ".join(self.rdims) if self.rdims else "1"
        shared = [f"const long long rows = {rows}, ncols = {ncols};", "(void)ncols;"]
        top = CodeWriter(1)
        for line in shared:
            top.line(line)

        def region(w: CodeWriter) -> None:
            with each_unit(w, "row"):
                w.lines.extend(self.w.lines)

        parallel(top, self.a, shared, "rows", f"rows * ncols * {weight}", region)
        return call(kind, self.a, top)


def _print(r: _Rows, k: rows.RowKernel, out: DType, weight: int) -> CCall:
    """The kernel `k` over the rows of `r`, storing `out` values; `weight` is the work of one
    element (`PAR_WORK`)."""
    r.open()
    last = k.last
    direct = (
        isinstance(k.store, rows.StoreEach)
        and k.steps[-1] is last
        and k.store.value == last.value
        and k.store.scale == last.acc
        and exprs.compute_ctype(out) == k.acc
    )
    prefixes = iter("abcdefgh")
    for step in k.steps:
        match step:
            case rows.Pass():
                _pass(r, k.acc, step, next(prefixes), out if direct and step is last else None)
            case rows.Scalar():
                r.w.line(k.scalar_line(step))
            case _:
                assert_never(step)
    w, store = r.w, k.store
    match store:
        case rows.StoreEach() if direct:  # the values are stored: divide them in place
            with w.block(f"for (long long cj = 0; cj < {r.rdims[-1]}; ++cj)"):
                value = store.scaled(exprs.load(out, r.out_ref("cj")))
                w.line(f"{r.out_ref('cj')} = {exprs.store(out, value)};")
        case rows.StoreEach():

            def each(w: CodeWriter, x: str, j: str) -> None:
                value = store.scaled(store.value.print(w, k.acc, x))
                w.line(f"{r.out_ref(j)} = {exprs.store(out, value)};")

            r.loop(next(prefixes), each)
        case rows.StoreRow():
            value = store.of(fold_result(last, k.acc, last.acc, "nan"))
            w.line(f"{r.out_ref(None)} = {exprs.store(out, value)};")
        case _:
            assert_never(store)
    return r.finish(k.kind, weight)


def _pass(r: _Rows, acc: str, p: rows.Pass, prefix: str, keep: DType | None) -> None:
    """A pass over the row into `p.acc`; with `keep` (the output's dtype), each folded value is
    stored at its element too."""
    w = r.w
    w.line(f"{acc} {p.acc} = {p.identity};")
    if p.nan:
        w.line("int nan = 0;")
    if p.fold.is_arg:
        w.line("long long ai = -1;")

    def body(w: CodeWriter, x: str, j: str) -> None:
        v = p.value.print(w, acc, x)
        if keep is not None:
            w.line(f"const {acc} ev = {v};")
            w.line(f"{r.out_ref(j)} = {exprs.store(keep, 'ev')};")
            v = "ev"
        print_fold(w, p, acc, v, p.acc, "nan", j)

    r.loop(prefix, body, fold_pragma(p))


def softmax_call(s: st.Softmax) -> CCall:
    k = rows.softmax(s.x.dtype)
    return _print(_Rows(s.x, len(s.x.shape) - 1, s.out, k.acc), k, s.out.dtype, 12)


def layernorm_call(s: st.Layernorm) -> CCall:
    k = rows.layernorm(s.x.dtype, "eps")
    r = _Rows(s.x, len(s.x.shape) - 1, s.out, k.acc)
    r.a.float_("eps", s.eps, k.acc)  # a parameter: one kernel serves every epsilon
    return _print(r, k, s.out.dtype, 4)


def reduce_rows_call(s: st.Reduce) -> CCall:
    """A reduction along rows (the trailing axes of x); `columns.columnar` steps go to the
    column kernel instead."""
    k = rows.reduce(s.op, s.x.dtype)
    r = _Rows(s.x, s.out.rank, s.out, k.acc)
    return _print(r, k, s.out.dtype, 1 + program_weight(s.x.program))
