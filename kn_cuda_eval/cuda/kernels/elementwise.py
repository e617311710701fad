"""Generators for the element-parallel kernels: fused elementwise programs, copies and gathers."""

from __future__ import annotations

from collections.abc import Sequence

from kn_cuda_eval.codegen import exprs
from kn_cuda_eval.codegen.printer import print_program
from kn_cuda_eval.codegen.template import CodeWriter
from kn_cuda_eval.cuda.kernels.launch import (
    BLOCK,
    KernelLaunch,
    Layout,
    Params,
    blocks_for,
    classify,
    decompose,
    make_kernel,
    needs_64bit,
    offset_expr,
)
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.program import Load, Program
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType

__all__ = ["copy_launch", "elementwise_launch", "gather_launch"]


def _launch(
    kernel_kind: str, tpl: str, n: int, p: Params, body: CodeWriter, wide: bool
) -> KernelLaunch:
    kernel = make_kernel(kernel_kind, tpl, {"PARAMS": p.signature(), "BODY": str(body)}, wide)
    return KernelLaunch(kernel, (blocks_for(n), 1, 1), (BLOCK, 1, 1), 0, tuple(p.args))


class _Addresser:
    """Offsets of views over the loop index `i`, by layout class."""

    def __init__(
        self, shape: Sequence[int], views: Sequence[StridedView], p: Params, w: CodeWriter
    ) -> None:
        self.layouts = [classify(v) for v in views]
        self.coords: list[str] = []
        self.dims: list[str] = []
        if Layout.STRIDED in self.layouts:
            self.dims = ["n"] + [p.idx(f"d{a}", d) for a, d in enumerate(shape) if a > 0]
        self.shape = shape
        self.w = w

    def decompose(self) -> None:
        if self.dims:
            self.coords = decompose(self.w, "i", self.dims, "c")

    def offset(self, k: int, strides: Sequence[str]) -> str:
        match self.layouts[k]:
            case Layout.DENSE:
                return "i"
            case Layout.SCALAR:
                return "0"
            case Layout.STRIDED:
                return offset_expr(self.coords, strides)


def elementwise_launch(s: st.Elementwise) -> KernelLaunch:
    n = 1
    for d in s.shape:
        n *= d
    views = [*s.outputs, *s.inputs, *s.indices]
    wide = needs_64bit(n, views)
    p = Params(wide)
    p.idx("n", n)
    w = CodeWriter(2)
    ad = _Addresser(s.shape, views, p, w)
    outs: list[tuple[str, list[str]]] = []
    for k, v in enumerate(s.outputs):
        name = p.ptr(f"out{k}", v, const=False)
        outs.append(
            (name, p.strides(f"so{k}", v.strides) if ad.layouts[k] is Layout.STRIDED else [])
        )
    ins: list[tuple[str, list[str]]] = []
    base = len(s.outputs)
    for k, v in enumerate(s.inputs):
        name = p.ptr(f"in{k}", v)
        ins.append(
            (name, p.strides(f"si{k}", v.strides) if ad.layouts[base + k] is Layout.STRIDED else [])
        )
    idx: list[tuple[str, list[str]]] = []
    base += len(s.inputs)
    for k, v in enumerate(s.indices):
        name = p.idx(f"ix{k}", v.offset // 8)
        idx.append(
            (name, p.strides(f"sx{k}", v.strides) if ad.layouts[base + k] is Layout.STRIDED else [])
        )
    ad.decompose()
    nin = len(s.outputs)
    nix = nin + len(s.inputs)
    names = print_program(
        w,
        s.program,
        lambda a: f"{ins[a][0]}[{ad.offset(nin + a, ins[a][1])}]",
        lambda a: f"{idx[a][0]} + {ad.offset(nix + a, idx[a][1])}",
    )
    for k, (v, root) in enumerate(zip(s.outputs, s.program.roots, strict=True)):
        name, strides = outs[k]
        w.line(f"{name}[{ad.offset(k, strides)}] = {exprs.store(v.dtype, names[root])};")
    return _launch("ew", "elementwise", n, p, w, wide)


def copy_launch(s: st.Copy) -> KernelLaunch:
    """A copy is the one-load program, stored without conversion."""
    prog = Program((Load(0, s.src.dtype),), (0,))
    return elementwise_launch(st.Elementwise(s.dst.shape, (s.src,), (), (s.dst,), prog))


def gather_launch(s: st.Gather, status: StridedView) -> KernelLaunch:
    n = 1
    for d in s.out.shape:
        n *= d
    wide = needs_64bit(n, [s.x, s.out, s.indices])
    p = Params(wide)
    p.idx("n", n)
    w = CodeWriter(2)
    dims = ["n"] + [p.idx(f"d{a}", d) for a, d in enumerate(s.out.shape) if a > 0]
    out = p.ptr("out", s.out, const=False)
    so = p.strides("so", s.out.strides)
    x = p.ptr("x", s.x)
    sx = p.strides("sx", s.x.strides)
    ind = p.ptr("indices", s.indices)
    si = p.idx("si", s.indices.strides[0])
    axis_n = p.idx("axis_size", s.x.shape[s.axis])
    st_ptr = p.raw_ptr("status", "unsigned int", status.offset)
    coords = decompose(w, "i", dims, "c")
    w.line(f"const long long j = (long long){ind}[{coords[s.axis]} * {si}];")
    out_off = offset_expr(coords, so)
    with w.block(f"if (j < 0 || j >= (long long){axis_n})"):
        w.line(f"atomicOr({st_ptr}, 1u);")
        zero = (
            "__float2half(0.0f)"
            if s.out.dtype is DType.F16
            else f"({exprs.storage_ctype(s.out.dtype)})0"
        )
        w.line(f"{out}[{out_off}] = {zero};")
        w.line("continue;")
    x_coords = [("(kn_idx)j" if a == s.axis else c) for a, c in enumerate(coords)]
    w.line(f"{out}[{out_off}] = {x}[{offset_expr(x_coords, sx)}];")
    return _launch("gather", "gather", n, p, w, wide)
