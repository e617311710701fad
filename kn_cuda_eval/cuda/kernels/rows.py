"""Generators for the row kernels — softmax, layernorm and reductions: a group of threads per
row (a warp, or the whole block for long rows), with the row's input computed by its fused
prologue program wherever it is read. What each kernel computes is the device-neutral
description of `codegen/rows.py`, which the C backend prints too; this module prints it into the
warp/block-parallel template `templates/row.cu`."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import assert_never

from kn_cuda_eval.codegen import exprs, rows
from kn_cuda_eval.codegen.printer import print_program
from kn_cuda_eval.codegen.template import CodeWriter
from kn_cuda_eval.cuda.kernels.launch import (
    BLOCK,
    KernelLaunch,
    Params,
    blocks_for,
    decompose,
    make_kernel,
    needs_64bit,
    offset_expr,
)
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType

__all__ = ["layernorm_launch", "reduce_launch", "row_threads", "softmax_launch"]

LONG_ROW = 2048


def row_threads(ncols: int) -> int:
    """A warp per row, the whole block (256 threads) for rows of LONG_ROW elements or more."""
    return 256 if ncols >= LONG_ROW else 32


class _Row:
    """Parameters, outer offsets and the element reader of one row kernel."""

    def __init__(self, x: st.Expr, n_outer: int, wide: bool) -> None:
        self.x = x
        self.n_outer = n_outer
        self.outer = x.shape[:n_outer]
        self.rowdims = x.shape[n_outer:]
        self.rows = 1
        for d in self.outer:
            self.rows *= d
        self.ncols = 1
        for d in self.rowdims:
            self.ncols *= d
        self.p = Params(wide)
        self.w = CodeWriter(2)  # inside the kernel's loop over row groups
        p = self.p
        p.idx("rows", self.rows)
        p.idx("ncols", self.ncols)
        self.odims = (
            ["rows"] + [p.idx(f"od{a}", d) for a, d in enumerate(self.outer) if a > 0]
            if self.outer
            else []
        )
        self.rdims = ["ncols"] + [p.idx(f"rd{a}", d) for a, d in enumerate(self.rowdims) if a > 0]
        self.ins = []
        for k, v in enumerate(x.inputs):
            self.ins.append((p.ptr(f"in{k}", v), p.strides(f"si{k}", v.strides)))
        self.idx = []
        for k, v in enumerate(x.indices):
            self.idx.append((p.idx(f"ix{k}", v.offset // 8), p.strides(f"sx{k}", v.strides)))

    def outer_offsets(self) -> None:
        """Per-row base offsets of every operand (computed once per row)."""
        w = self.w
        w.line("const kn_idx orow = active ? row : 0;")
        coords = decompose(w, "orow", self.odims, "o")
        n = self.n_outer
        for k, (_, s) in enumerate(self.ins):
            w.line(f"const kn_idx bi{k} = {offset_expr(coords, s[:n])};")
        for k, (name, s) in enumerate(self.idx):
            w.line(f"const kn_idx bx{k} = {name} + {offset_expr(coords, s[:n])};")
        self.ocoords = coords

    def element(self, w: CodeWriter, j: str, prefix: str) -> str:
        """Code computing the row's element j in the compute type; returns its name."""
        coords = decompose(w, j, self.rdims, f"{prefix}r")
        n = self.n_outer
        names = print_program(
            w,
            self.x.program,
            lambda a: f"{self.ins[a][0]}[bi{a} + {offset_expr(coords, self.ins[a][1][n:])}]",
            lambda a: f"bx{a} + {offset_expr(coords, self.idx[a][1][n:])}",
            prefix=f"{prefix}v",
        )
        return names[self.x.program.roots[0]]

    def loop(self, body: Callable[[CodeWriter, str], None], prefix: str) -> None:
        w = self.w
        with w.block(
            f"if (active) for (kn_idx {prefix}j = lane; {prefix}j < ncols; {prefix}j += TPR)"
        ):
            body(w, f"{prefix}j")

    def launch(self, kind: str, tpr: int, wide: bool) -> KernelLaunch:
        kernel = make_kernel(
            kind, "row", {"PARAMS": self.p.signature(), "BODY": str(self.w), "TPR": tpr}, wide
        )
        rpb = BLOCK // tpr
        return KernelLaunch(
            kernel, (blocks_for(self.rows, rpb), 1, 1), (BLOCK, 1, 1), 0, tuple(self.p.args)
        )


def _out_ref(r: _Row, out: str, so: list[str], j: str | None) -> str:
    coords = r.ocoords
    off = offset_expr(coords, so[: len(coords)])
    if j is not None:
        off += f" + {j} * {so[-1]}"
    return f"{out}[{off}]"


def _launch(x: st.Expr, out_view: StridedView, n_outer: int, k: rows.RowKernel) -> KernelLaunch:
    """The row kernel `k` over the rows of x (its leading `n_outer` axes) into `out_view`."""
    wide = needs_64bit(math.prod(x.shape), [*x.inputs, out_view])
    r = _Row(x, n_outer, wide)
    out = r.p.ptr("out", out_view, const=False)
    so = r.p.strides("so", out_view.strides)
    r.outer_offsets()
    prefixes = iter("abcdefgh")
    for step in k.steps:
        match step:
            case rows.Pass():
                _fold(r, k.acc, step, next(prefixes))
            case rows.Scalar():
                r.w.line(k.scalar_line(step))
            case _:
                assert_never(step)
    store = k.store
    match store:
        case rows.StoreEach():
            prefix = next(prefixes)

            def write(w: CodeWriter, j: str) -> None:
                v = store.value.print(w, k.acc, f"({k.acc}){r.element(w, j, prefix)}")
                value = exprs.store(out_view.dtype, store.scaled(v))
                w.line(f"{_out_ref(r, out, so, j)} = {value};")

            r.loop(write, prefix)
        case rows.StoreRow():
            last = k.last
            result = f"ai == {_NO_INDEX} ? 0LL : ai" if last.fold.is_arg else last.acc
            with r.w.block("if (active && lane == 0)"):
                value = exprs.store(out_view.dtype, store.of(result))
                r.w.line(f"{_out_ref(r, out, so, None)} = {value};")
        case _:
            assert_never(store)
    return r.launch(k.kind, row_threads(r.ncols), wide)


_COMBINE = {
    rows.Fold.SUM: "KnAdd",
    rows.Fold.PROD: "KnMul",
    rows.Fold.MAX: "KnMax",
    rows.Fold.MIN: "KnMin",
}
"""The group combine of each fold (`templates/row.cu`); the arg folds combine with `kn_group_arg`."""
_NO_INDEX = "9223372036854775807LL"
"""An arg pass's index before any element won (INT64_MAX: it loses every tie)."""


def _fold(r: _Row, acc: str, p: rows.Pass, prefix: str) -> None:
    """A pass: each lane folds its strided share of the row, then the group combines them
    (`kn_group_reduce`, or `kn_group_arg` for an index), every thread of the group joining."""
    w, a = r.w, p.acc
    greater = "false" if p.fold.low else "true"
    w.line(f"{acc} {a} = {p.identity};")
    if p.fold.is_arg:
        w.line(f"long long ai = {_NO_INDEX};")

    def body(w: CodeWriter, j: str) -> None:
        v = p.value.print(w, acc, f"({acc}){r.element(w, j, prefix)}")
        match p.fold:
            case rows.Fold.SUM:
                w.line(f"{a} += {v};")
            case rows.Fold.PROD:
                w.line(f"{a} *= {v};")
            case rows.Fold.MAX | rows.Fold.MIN:
                w.line(f"{a} = kn_f{p.fold.value}({a}, {v});")
            case rows.Fold.ARGMAX | rows.Fold.ARGMIN:
                with w.block(f"if (kn_arg_better({v}, (long long){j}, {a}, ai, {greater}))"):
                    w.line(f"{a} = {v}; ai = (long long){j};")
            case _:
                assert_never(p.fold)

    r.loop(body, prefix)
    if p.fold.is_arg:
        w.line(f"kn_group_arg({a}, ai, {greater});")
    else:
        w.line(f"{a} = kn_group_reduce({a}, {_COMBINE[p.fold]}());")


def softmax_launch(s: st.Softmax) -> KernelLaunch:
    return _launch(s.x, s.out, len(s.x.shape) - 1, rows.softmax(s.x.dtype))


def layernorm_launch(s: st.Layernorm) -> KernelLaunch:
    eps = exprs.literal(s.eps, DType.F64 if s.x.dtype is DType.F64 else DType.F32)
    return _launch(s.x, s.out, len(s.x.shape) - 1, rows.layernorm(s.x.dtype, eps))


def reduce_launch(s: st.Reduce) -> KernelLaunch:
    return _launch(s.x, s.out, s.out.rank, rows.reduce(s.op, s.x.dtype))
