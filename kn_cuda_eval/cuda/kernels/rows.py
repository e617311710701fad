"""Generators for the row kernels — softmax, layernorm and reductions: a group of threads per
row (a warp, or the whole block for long rows), with the row's input computed by its fused
prologue program wherever it is read."""

from __future__ import annotations

from collections.abc import Callable

from kn_cuda_eval.codegen import exprs
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
from kn_graph.dtype import DType
from kn_graph.ops import ReduceOp

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


def _softmax_like(s: st.Softmax | st.Layernorm, kind: str) -> KernelLaunch:
    x = s.x
    n_outer = len(x.shape) - 1
    wide = needs_64bit(_numel(x.shape), [*x.inputs, s.out])
    r = _Row(x, n_outer, wide)
    out = r.p.ptr("out", s.out, const=False)
    so = r.p.strides("so", s.out.strides)
    acc = exprs.acc_ctype(x.dtype)
    f = "" if acc == "double" else "f"
    tpr = row_threads(r.ncols)
    w = r.w
    r.outer_offsets()
    if isinstance(s, st.Softmax):
        w.line(f"{acc} mx = -KN_INF;")
        r.loop(lambda w, j: w.line(f"mx = kn_fmax(mx, ({acc}){r.element(w, j, 'a')});"), "a")
        w.line("mx = kn_group_reduce(mx, KnMax());")
        w.line(
            "if (!isfinite(mx)) mx = 0;  // as the reference: a row of -inf gives NaN, not a crash"
        )
        w.line(f"{acc} sum = 0;")
        r.loop(lambda w, j: w.line(f"sum += exp{f}(({acc}){r.element(w, j, 'b')} - mx);"), "b")
        w.line("sum = kn_group_reduce(sum, KnAdd());")

        def write_softmax(w: CodeWriter, j: str) -> None:
            e = r.element(w, j, "c")
            value = exprs.store(s.out.dtype, f"exp{f}(({acc}){e} - mx) / sum")
            w.line(f"{_out_ref(r, out, so, j)} = {value};")

        r.loop(write_softmax, "c")
    else:
        eps = exprs.literal(s.eps, DType.F64 if acc == "double" else DType.F32)
        w.line(f"{acc} sum = 0;")
        r.loop(lambda w, j: w.line(f"sum += ({acc}){r.element(w, j, 'a')};"), "a")
        w.line(f"const {acc} mean = kn_group_reduce(sum, KnAdd()) / ({acc})ncols;")
        w.line(f"{acc} sq = 0;")

        def var_body(w: CodeWriter, j: str) -> None:
            w.line(f"const {acc} d = ({acc}){r.element(w, j, 'b')} - mean;")
            w.line("sq += d * d;")

        r.loop(var_body, "b")
        w.line(f"const {acc} den = sqrt{f}(kn_group_reduce(sq, KnAdd()) / ({acc})ncols + {eps});")

        def write_norm(w: CodeWriter, j: str) -> None:
            e = r.element(w, j, "c")
            value = exprs.store(s.out.dtype, f"(({acc}){e} - mean) / den")
            w.line(f"{_out_ref(r, out, so, j)} = {value};")

        r.loop(write_norm, "c")
    return r.launch(kind, tpr, wide)


def softmax_launch(s: st.Softmax) -> KernelLaunch:
    return _softmax_like(s, "softmax")


def layernorm_launch(s: st.Layernorm) -> KernelLaunch:
    return _softmax_like(s, "layernorm")


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


_IDENTITY = {ReduceOp.SUM: "0", ReduceOp.MEAN: "0", ReduceOp.PROD: "1"}


def reduce_launch(s: st.Reduce) -> KernelLaunch:
    x = s.x
    n_outer = s.out.rank
    wide = needs_64bit(_numel(x.shape), [*x.inputs, s.out])
    r = _Row(x, n_outer, wide)
    out = r.p.ptr("out", s.out, const=False)
    so = r.p.strides("so", s.out.strides)
    tpr = row_threads(r.ncols)
    w = r.w
    r.outer_offsets()
    xdt = x.dtype
    acc = exprs.acc_ctype(xdt) if xdt.is_float else exprs.compute_ctype(xdt)
    if xdt is DType.BOOL or (xdt.is_int and xdt.size < 4):  # shuffles move 32 bits at least
        acc = "int" if xdt.is_signed or xdt is DType.BOOL else "unsigned int"
    dst = _out_ref(r, out, so, None)
    match s.op:
        case ReduceOp.SUM | ReduceOp.MEAN | ReduceOp.PROD:
            fn = "KnMul" if s.op is ReduceOp.PROD else "KnAdd"
            w.line(f"{acc} a = {_IDENTITY[s.op]};")
            sym = "*" if s.op is ReduceOp.PROD else "+"
            r.loop(lambda w, j: w.line(f"a = a {sym} ({acc}){r.element(w, j, 'a')};"), "a")
            w.line(f"a = kn_group_reduce(a, {fn}());")
            val = f"a / ({acc})ncols" if s.op is ReduceOp.MEAN else "a"
            with w.block("if (active && lane == 0)"):
                w.line(f"{dst} = {exprs.store(s.out.dtype, val)};")
        case ReduceOp.MIN | ReduceOp.MAX:
            hi = s.op is ReduceOp.MIN
            init = exprs.extreme(xdt, acc, hi)
            fn = "KnMin" if hi else "KnMax"
            w.line(f"{acc} a = {init};")
            r.loop(lambda w, j: w.line(f"a = {fn}()(a, ({acc}){r.element(w, j, 'a')});"), "a")
            w.line(f"a = kn_group_reduce(a, {fn}());")
            with w.block("if (active && lane == 0)"):
                w.line(f"{dst} = {exprs.store(s.out.dtype, 'a')};")
        case ReduceOp.ARGMIN | ReduceOp.ARGMAX:
            greater = "true" if s.op is ReduceOp.ARGMAX else "false"
            init = exprs.extreme(xdt, acc, s.op is ReduceOp.ARGMIN)
            w.line(f"{acc} a = {init};")
            w.line("long long ai = 9223372036854775807LL;")

            def arg_body(w: CodeWriter, j: str) -> None:
                e = r.element(w, j, "a")
                with w.block(f"if (kn_arg_better(({acc}){e}, (long long){j}, a, ai, {greater}))"):
                    w.line(f"a = ({acc}){e}; ai = (long long){j};")

            r.loop(arg_body, "a")
            w.line(f"kn_group_arg(a, ai, {greater});")
            with w.block("if (active && lane == 0)"):
                w.line(f"{dst} = ai == 9223372036854775807LL ? 0LL : ai;")
    return r.launch("reduce", tpr, wide)
