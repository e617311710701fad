"""The C spelling of a row pass's fold (`codegen/rows.py`), shared by the row kernels
(`rows.py`: one row per iteration, the fold under `#pragma omp simd reduction(...)`) and the
column kernel (`columns.py`: `COLUMNS` outputs side by side, accumulators `a[j]`).

MAX and MIN fold with the compare-select `v > a ? v : a`, the form `omp simd reduction(max)`
vectorizes; it drops NaN, so a pass whose result must be NaN when any value is (`Pass.nan`) ORs
a flag beside it (`nan |= v != v`) and its result is NaN when the flag is set. ARGMAX and ARGMIN
run on one thread in index order: a later element never wins a tie, so the test is
`a == a && (v != v || v > a)` (a NaN wins and then keeps its place), the index starting at -1.
"""

from __future__ import annotations

from typing import assert_never

from kn_cuda_eval.codegen.rows import Fold, Pass
from kn_cuda_eval.codegen.template import CodeWriter

__all__ = ["fold_pragma", "fold_result", "print_fold"]


def print_fold(w: CodeWriter, p: Pass, acc: str, v: str, a: str, nan: str, j: str) -> None:
    """Fold the value `v` (of element `j`) into the accumulator `a` (its NaN flag `nan`, its
    index `ai`), whose type is `acc`."""
    match p.fold:
        case Fold.SUM:
            w.line(f"{a} += {v};")
        case Fold.PROD:
            w.line(f"{a} *= {v};")
        case Fold.MAX | Fold.MIN:
            w.line(f"const {acc} ev = {v};")
            if p.nan:
                w.line(f"{nan} |= ev != ev;")
            w.line(f"{a} = ev {'<' if p.fold.low else '>'} {a} ? ev : {a};")
        case Fold.ARGMAX | Fold.ARGMIN:
            w.line(f"const {acc} ev = {v};")
            with w.block(f"if ({a} == {a} && (ev != ev || ev {'<' if p.fold.low else '>'} {a}))"):
                w.line(f"{a} = ev; ai = {j};")
        case _:
            assert_never(p.fold)


def fold_pragma(p: Pass) -> str:
    """The OpenMP directive of a row pass's loop (none for the arg folds: sequential)."""
    match p.fold:
        case Fold.SUM | Fold.PROD:
            op = "+" if p.fold is Fold.SUM else "*"
            return f"#pragma omp simd reduction({op} : {p.acc})"
        case Fold.MAX | Fold.MIN:
            flag = " reduction(| : nan)" if p.nan else ""
            return f"#pragma omp simd reduction({p.fold.value} : {p.acc}){flag}"
        case Fold.ARGMAX | Fold.ARGMIN:
            return ""
        case _:
            assert_never(p.fold)


def fold_result(p: Pass, acc: str, a: str, nan: str) -> str:
    """The pass's result given its accumulator `a` and NaN flag `nan`: the index for an arg
    fold (0 when no element won), NaN when the flag is set."""
    if p.fold.is_arg:
        return "ai < 0 ? 0 : ai"
    return f"{nan} ? ({acc})NAN : {a}" if p.nan else a
