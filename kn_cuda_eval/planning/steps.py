"""The steps of a plan: frozen descriptions over arena views that both the kernel generator
(→ CUDA C, cuBLAS and cuDNN arguments) and the emulator (→ NumPy) consume.

Every step lists the views it reads and writes, which is all that liveness, validation and
printing need; none of them refers back to the graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from kn_cuda_eval.planning.program import Load, Program
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType
from kn_graph.ops import ReduceOp

__all__ = [
    "ATTENTION_MAX_DV",
    "Attention",
    "BlockQuantMatMul",
    "Conv",
    "Copy",
    "Elementwise",
    "Expr",
    "Gather",
    "IntConv",
    "IntMatMul",
    "Layernorm",
    "MatMul",
    "Reduce",
    "Softmax",
    "Step",
    "map_views",
]


def _fmt(v: StridedView) -> str:
    return repr(v)


@dataclass(frozen=True, slots=True)
class Expr:
    """An elementwise expression read at every coordinate of `shape`: a row kernel's input with
    its producer fused in (a scale, a mask, a residual add, a cast) instead of materialised.
    Views are as in `Elementwise`."""

    shape: tuple[int, ...]
    inputs: tuple[StridedView, ...]
    indices: tuple[StridedView, ...]
    program: Program

    @staticmethod
    def of_view(view: StridedView) -> Expr:
        """The expression that reads `view` (one load)."""
        return Expr(view.shape, (view,), (), Program((Load(0, view.dtype),), (0,)))

    @property
    def dtype(self) -> DType:
        return self.program.instrs[self.program.roots[0]].dtype

    def describe(self) -> str:
        if len(self.program.instrs) == 1 and len(self.inputs) == 1 and not self.indices:
            return _fmt(self.inputs[0])
        ins = " ".join(f"ld{i}={_fmt(v)}" for i, v in enumerate(self.inputs))
        idx = " ".join(f"idx{i}={_fmt(v)}" for i, v in enumerate(self.indices))
        return f"[{self.program.format()} {ins} {idx}]".replace(" ]", "]")


@dataclass(frozen=True, slots=True)
class Elementwise:
    """One generated kernel over `shape` (already coalesced): every input, index and output
    view has this shape; output k stores program value `program.roots[k]`. Index views live in
    a virtual i64 space at address 0: their value at a coordinate is the element address."""

    shape: tuple[int, ...]
    inputs: tuple[StridedView, ...]
    indices: tuple[StridedView, ...]
    outputs: tuple[StridedView, ...]
    program: Program

    def reads(self) -> tuple[StridedView, ...]:
        return self.inputs

    def writes(self) -> tuple[StridedView, ...]:
        return self.outputs

    def describe(self) -> str:
        outs = ", ".join(_fmt(o) for o in self.outputs)
        exprs = ", ".join(self.program.format(r) for r in self.program.roots)
        ins = " ".join(f"ld{i}={_fmt(v)}" for i, v in enumerate(self.inputs))
        idx = " ".join(f"idx{i}={_fmt(v)}" for i, v in enumerate(self.indices))
        return f"elementwise {outs} = {exprs}  {ins} {idx}".rstrip()


@dataclass(frozen=True, slots=True)
class Copy:
    """dst[...] = src[...] on equal (coalesced) shapes: a layout change no view can express."""

    src: StridedView
    dst: StridedView

    def reads(self) -> tuple[StridedView, ...]:
        return (self.src,)

    def writes(self) -> tuple[StridedView, ...]:
        return (self.dst,)

    def describe(self) -> str:
        return f"copy        {_fmt(self.dst)} <- {_fmt(self.src)}"


@dataclass(frozen=True, slots=True)
class MatMul:
    """cuBLAS `gemmStridedBatchedEx` in its own column-major terms: for each batch p,
    C_p (mxn, ldc) = alpha·op(A_p)·op(B_p) + beta·C_p. Each operand view is the matrix *as
    stored*: [batch, columns, rows] with strides (batch stride, leading dimension, 1). A row-major
    product is planned as Cᵀ = Bᵀ·Aᵀ, so the graph's right operand is cuBLAS's A."""

    a: StridedView
    b: StridedView
    c: StridedView
    transa: bool
    transb: bool
    m: int
    n: int
    k: int
    batch: int
    alpha: float = 1.0
    beta: float = 0.0

    @property
    def lda(self) -> int:
        return self.a.strides[1]

    @property
    def ldb(self) -> int:
        return self.b.strides[1]

    @property
    def ldc(self) -> int:
        return self.c.strides[1]

    @property
    def stride_a(self) -> int:
        return self.a.strides[0]

    @property
    def stride_b(self) -> int:
        return self.b.strides[0]

    @property
    def stride_c(self) -> int:
        return self.c.strides[0]

    @property
    def dtype(self) -> DType:
        return self.c.dtype

    def reads(self) -> tuple[StridedView, ...]:
        return (self.a, self.b, self.c) if self.beta != 0 else (self.a, self.b)

    def writes(self) -> tuple[StridedView, ...]:
        return (self.c,)

    def describe(self) -> str:
        ta, tb = "T" if self.transa else "N", "T" if self.transb else "N"
        s = (
            f"matmul      gemm {ta}{tb} m={self.m} n={self.n} k={self.k} batch={self.batch} "
            f"A@{self.a.offset} lda={self.lda} sA={self.stride_a} "
            f"B@{self.b.offset} ldb={self.ldb} sB={self.stride_b} "
            f"C@{self.c.offset} ldc={self.ldc} sC={self.stride_c} {self.dtype}"
        )
        if self.alpha != 1.0 or self.beta != 0.0:
            s += f" alpha={self.alpha:g} beta={self.beta:g}"
        return s


@dataclass(frozen=True, slots=True)
class Conv:
    """cuDNN: out = relu?(conv(x, w) + bias + residual), dense NC(D)(H)W tensors, N-d, groups."""

    x: StridedView
    w: StridedView
    bias: StridedView | None
    residual: StridedView | None
    out: StridedView
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    relu: bool

    def reads(self) -> tuple[StridedView, ...]:
        return tuple(v for v in (self.x, self.w, self.bias, self.residual) if v is not None)

    def writes(self) -> tuple[StridedView, ...]:
        return (self.out,)

    def describe(self) -> str:
        extra = ""
        if self.bias is not None:
            extra += f" +bias@{self.bias.offset}"
        if self.residual is not None:
            extra += f" +res@{self.residual.offset}"
        if self.relu:
            extra += " relu"
        geo = (
            f"s={list(self.stride)} p={list(self.padding)} d={list(self.dilation)} g={self.groups}"
        )
        return f"conv        {_fmt(self.out)} = conv({_fmt(self.x)}, {_fmt(self.w)}) {geo}{extra}"


@dataclass(frozen=True, slots=True)
class IntMatMul:
    """out [batch, m, n] (int32, dense) = Σ_k (a - a_zero)·(b - b_zero), in row-major terms:
    a [batch, m, k] and b [batch, k, n] are 8-bit (u8 or i8, each its own), a_zero
    [batch, m, 1] and b_zero [batch, 1, n] have their operand's dtype (a per-tensor zero point
    is a view with zero strides). Sums past int32 wrap. Planned only with
    `PlanSettings.integer_steps` (the CPU backend's oneDNN int8 matmul)."""

    a: StridedView
    b: StridedView
    a_zero: StridedView
    b_zero: StridedView
    out: StridedView

    def reads(self) -> tuple[StridedView, ...]:
        return (self.a, self.b, self.a_zero, self.b_zero)

    def writes(self) -> tuple[StridedView, ...]:
        return (self.out,)

    def describe(self) -> str:
        return (
            f"int_matmul  {_fmt(self.out)} = ({_fmt(self.a)} - {_fmt(self.a_zero)}) @ "
            f"({_fmt(self.b)} - {_fmt(self.b_zero)})"
        )


@dataclass(frozen=True, slots=True)
class BlockQuantMatMul:
    """out [m, n] = a [m, k] @ Wᵀ, W [n, k] block-quantized (`kn_graph.ops.BlockQuantMatMul`):
    `packed` u8 [n, blocks, block · bits / 8], `scales` and `zeros` f32 [n, blocks], all dense;
    a and out dense rows of a float type; `scratch` u8, the kernel's working memory
    (`intplan.block_scratch`). Planned only with `PlanSettings.block_quant_steps`."""

    a: StridedView
    packed: StridedView
    scales: StridedView
    zeros: StridedView
    out: StridedView
    scratch: StridedView
    bits: int
    block: int

    def reads(self) -> tuple[StridedView, ...]:
        return (self.a, self.packed, self.scales, self.zeros)

    def writes(self) -> tuple[StridedView, ...]:
        return (self.out, self.scratch)

    def describe(self) -> str:
        return (
            f"block_quant {_fmt(self.out)} = {_fmt(self.a)} @ dequant({_fmt(self.packed)}, "
            f"{_fmt(self.scales)}, {_fmt(self.zeros)})ᵀ bits={self.bits} block={self.block}"
        )


@dataclass(frozen=True, slots=True)
class IntConv:
    """out (int32) = conv(x - x_zero, w - w_zero[K]) over dense NC(D)(H)W x and w [K, C/g, *k]
    (8-bit, u8 or i8), x_zero a scalar view of x's dtype, w_zero [K] of w's; padding is zero
    after the shift. Planned only with `PlanSettings.integer_steps`."""

    x: StridedView
    w: StridedView
    x_zero: StridedView
    w_zero: StridedView
    out: StridedView
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int

    def reads(self) -> tuple[StridedView, ...]:
        return (self.x, self.w, self.x_zero, self.w_zero)

    def writes(self) -> tuple[StridedView, ...]:
        return (self.out,)

    def describe(self) -> str:
        geo = (
            f"s={list(self.stride)} p={list(self.padding)} d={list(self.dilation)} g={self.groups}"
        )
        return (
            f"int_conv    {_fmt(self.out)} = conv({_fmt(self.x)} - {_fmt(self.x_zero)}, "
            f"{_fmt(self.w)} - {_fmt(self.w_zero)}) {geo}"
        )


@dataclass(frozen=True, slots=True)
class Reduce:
    """out[o] = op over the trailing `x.rank - out.rank` axes of x[o, r]."""

    x: Expr
    out: StridedView
    op: ReduceOp

    @property
    def reduced_rank(self) -> int:
        return len(self.x.shape) - self.out.rank

    def reads(self) -> tuple[StridedView, ...]:
        return self.x.inputs

    def writes(self) -> tuple[StridedView, ...]:
        return (self.out,)

    def describe(self) -> str:
        return f"reduce      {_fmt(self.out)} = {self.op.value}({self.x.describe()}) over last {self.reduced_rank}"


@dataclass(frozen=True, slots=True)
class Softmax:
    """Softmax along the last axis (x and out have the same shape). A scale, an additive mask
    or a causal select come in through the expression x."""

    x: Expr
    out: StridedView

    def reads(self) -> tuple[StridedView, ...]:
        return self.x.inputs

    def writes(self) -> tuple[StridedView, ...]:
        return (self.out,)

    def describe(self) -> str:
        return f"softmax     {_fmt(self.out)} = softmax({self.x.describe()})"


@dataclass(frozen=True, slots=True)
class Layernorm:
    """Normalise the last axis without affine; a residual add comes in through x."""

    x: Expr
    out: StridedView
    eps: float

    def reads(self) -> tuple[StridedView, ...]:
        return self.x.inputs

    def writes(self) -> tuple[StridedView, ...]:
        return (self.out,)

    def describe(self) -> str:
        return f"layernorm   {_fmt(self.out)} = layernorm({self.x.describe()}) eps={self.eps:g}"


@dataclass(frozen=True, slots=True)
class Gather:
    """out[.., j, ..] = x[.., indices[j], ..] along `axis`; an index outside [0, n) sets the
    plan's status word and yields 0."""

    x: StridedView
    indices: StridedView
    out: StridedView
    axis: int

    def reads(self) -> tuple[StridedView, ...]:
        return (self.x, self.indices)

    def writes(self) -> tuple[StridedView, ...]:
        return (self.out,)

    def describe(self) -> str:
        return f"gather      {_fmt(self.out)} = take({_fmt(self.x)}, {_fmt(self.indices)}, axis={self.axis})"


ATTENTION_MAX_DV = 256
"""The widest value head (dv) an `Attention` step may have: every backend's fused attention keeps
a row of the output in per-lane accumulators; wider heads are planned decomposed (GEMMs and a
softmax)."""


@dataclass(frozen=True, slots=True)
class Attention:
    """Fused softmax(q·kᵀ·scale + mask [+ causal])·v on q [B1,B2,m,d], k [B1,B2,n,d],
    v [B1,B2,n,dv], mask [B1,B2,m,n] or None, out [B1,B2,m,dv]: the batch is split in two axes
    (batch, heads) so permuted or broadcast heads are read in place; any strides; online softmax,
    nothing materialised."""

    q: StridedView
    k: StridedView
    v: StridedView
    mask: StridedView | None
    out: StridedView
    scale: float
    causal: bool

    def reads(self) -> tuple[StridedView, ...]:
        base = (self.q, self.k, self.v)
        return base if self.mask is None else (*base, self.mask)

    def writes(self) -> tuple[StridedView, ...]:
        return (self.out,)

    def describe(self) -> str:
        extra = "" if self.mask is None else f" mask={_fmt(self.mask)}"
        if self.causal:
            extra += " causal"
        return (
            f"attention   {_fmt(self.out)} = attention(q={_fmt(self.q)}, k={_fmt(self.k)}, "
            f"v={_fmt(self.v)}) scale={self.scale:g}{extra}"
        )


Step = (
    Elementwise
    | Copy
    | MatMul
    | Conv
    | IntMatMul
    | IntConv
    | BlockQuantMatMul
    | Reduce
    | Softmax
    | Layernorm
    | Gather
    | Attention
)

_SKIP = frozenset({"indices"})  # Elementwise.indices are virtual, not arena views


def map_views(step: Step | Expr, f: Callable[[StridedView], StridedView]) -> Step | Expr:
    """The step with every arena view replaced by f(view) (the planner's final rebase)."""
    changes: dict[str, object] = {}
    for fld in dataclasses.fields(step):
        if fld.name in _SKIP and isinstance(step, Elementwise | Expr):
            continue
        val = getattr(step, fld.name)
        if isinstance(val, Expr):
            changes[fld.name] = map_views(val, f)  # type: ignore[arg-type]
        elif isinstance(val, StridedView):
            changes[fld.name] = f(val)
        elif isinstance(val, tuple) and val and isinstance(val[0], StridedView):
            changes[fld.name] = tuple(f(v) for v in val)
    return dataclasses.replace(step, **changes)  # type: ignore[arg-type]
