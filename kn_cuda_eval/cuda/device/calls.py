"""The binding layer: `bind(plan, settings) -> LaunchList` turns a plan's steps into the exact
device calls the executor makes — generated-kernel launches (grid, block, arguments typed as the
kernel's C parameters), cuBLAS GEMM argument tuples and cuDNN convolution specs — over one
allocation laid out as [plan arena | output staging | zeros | cuBLAS workspace | cuDNN workspace].

Pure Python: no CuPy, no GPU. Everything here is checked on the CPU (argument types against the
generated C signatures, GEMM and convolution arguments by re-interpreting them against the
emulator); the device layer (`executor.py`) only adds the arena's base address and calls.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import assert_never

import numpy as np

from kn_cuda_eval.cuda.cudnn.descriptors import ConvGeometry
from kn_cuda_eval.cuda.cudnn.lib import ActivationMode, ConvFwdAlgo, MathType
from kn_cuda_eval.cuda.device.settings import ExecutorSettings
from kn_cuda_eval.cuda.kernels.dispatch import distinct_kernels, launch_for
from kn_cuda_eval.cuda.kernels.launch import Arg, FloatArg, IntArg, Kernel, KernelLaunch, PtrArg
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.memory import align
from kn_cuda_eval.planning.plan import Plan
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType
from kn_graph.errors import PlanError

__all__ = [
    "CUBLAS_COMPUTE_32F",
    "CUBLAS_COMPUTE_32F_FAST_TF32",
    "CUBLAS_COMPUTE_64F",
    "CUBLAS_GEMM_DEFAULT",
    "CUBLAS_OP_N",
    "CUBLAS_OP_T",
    "CUDA_R_16F",
    "CUDA_R_32F",
    "CUDA_R_64F",
    "CParam",
    "Call",
    "ConvCall",
    "GemmCall",
    "KernelCall",
    "LaunchList",
    "Layout",
    "OutputSpec",
    "bind",
    "c_parameters",
    "check_kernel_call",
    "pack_args",
]

# Library enum values (cublas_api.h, library_types.h); the tests compare them with CuPy's.
CUBLAS_OP_N = 0
CUBLAS_OP_T = 1
CUDA_R_32F = 0
CUDA_R_64F = 1
CUDA_R_16F = 2
CUBLAS_COMPUTE_32F = 68
CUBLAS_COMPUTE_64F = 70
CUBLAS_COMPUTE_32F_FAST_TF32 = 77
CUBLAS_GEMM_DEFAULT = -1

_INT32_MAX = 2**31 - 1


# -- generated kernels -------------------------------------------------------------------------
def pack_args(args: Sequence[Arg], base: int) -> tuple[np.generic, ...]:
    """Launch arguments as the kernel's C parameters want them: pointers as uint64 (arena base +
    offset), `kn_idx` as int32 or int64, floats as float32 or float64."""
    out: list[np.generic] = []
    for a in args:
        match a:
            case PtrArg(offset):
                out.append(np.uint64(base + offset))
            case IntArg(value, bits):
                out.append(np.int32(value) if bits == 32 else np.int64(value))
            case FloatArg(value, bits):
                out.append(np.float32(value) if bits == 32 else np.float64(value))
            case _:
                assert_never(a)
    return tuple(out)


@dataclass(frozen=True, slots=True)
class CParam:
    """One parameter of a generated kernel's C signature."""

    ctype: str
    name: str
    pointer: bool

    def numpy_type(self, idx_ctype: str) -> np.dtype:
        """The NumPy scalar type a launch must pass for this parameter."""
        if self.pointer:
            return np.dtype(np.uint64)
        ctype = idx_ctype if self.ctype == "kn_idx" else self.ctype
        try:
            return np.dtype(_C_SCALARS[ctype])
        except KeyError:
            raise PlanError(
                f"kernel parameter '{self.name}' has unknown C type '{ctype}'"
            ) from None


_C_SCALARS = {
    "int": np.int32,
    "long long": np.int64,
    "unsigned int": np.uint32,
    "unsigned long long": np.uint64,
    "float": np.float32,
    "double": np.float64,
}
_SIGNATURE = re.compile(
    r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(([^)]*)\)'
)
_IDX = re.compile(r"typedef ([a-z ]+) kn_idx;")


@functools.lru_cache(maxsize=4096)
def c_parameters(source: str) -> tuple[str, str, tuple[CParam, ...]]:
    """(kernel name, the C type of `kn_idx`, the parameters) parsed from a generated source."""
    m = _SIGNATURE.search(source)
    idx = _IDX.search(source)
    if m is None or idx is None:
        raise PlanError("generated kernel source has no recognisable signature")
    params: list[CParam] = []
    for raw in m.group(2).split(","):
        decl = " ".join(raw.replace("__restrict__", " ").split())
        if not decl:
            continue
        pointer = "*" in decl
        decl = decl.replace("*", " ")
        words = [w for w in decl.split() if w != "const"]
        params.append(CParam(" ".join(words[:-1]), words[-1], pointer))
    return m.group(1), idx.group(1).strip(), tuple(params)


@dataclass(frozen=True, slots=True)
class KernelCall:
    """A generated kernel launch. `op` is what it computes: the plan's step, or for `step == -1`
    the executor's own copy of a strided output into the staging region."""

    step: int
    op: st.Step
    launch: KernelLaunch

    @property
    def kind(self) -> str:
        return "output-copy" if self.step < 0 else _kind(self.op)

    @property
    def name(self) -> str:
        return self.launch.kernel.name

    def packed(self, base: int) -> tuple[np.generic, ...]:
        return pack_args(self.launch.args, base)

    def describe(self) -> str:
        g, b = self.launch.grid, self.launch.block
        return f"{self.name} <<<{g[0]}, {b[0]}>>>"


def check_kernel_call(call: KernelCall) -> None:
    """Raise PlanError unless the call's arguments match the kernel's C parameters one for one
    (count and NumPy type) — a mismatch would read garbage on the device, silently."""
    name, idx, params = c_parameters(call.launch.kernel.source)
    packed = call.packed(0)
    where = f"step {call.step} ({call.kind}) kernel {call.name}"
    if name != call.name:
        raise PlanError(f"{where}: source defines '{name}'")
    if len(params) != len(packed):
        raise PlanError(f"{where}: {len(packed)} arguments for {len(params)} parameters")
    for k, (p, a) in enumerate(zip(params, packed, strict=True)):
        want = p.numpy_type(idx)
        if a.dtype != want:
            raise PlanError(
                f"{where}: argument {k} ('{p.name}', {p.ctype}{'*' if p.pointer else ''}) is "
                f"{a.dtype}, the kernel wants {want}"
            )
        if isinstance(call.launch.args[k], PtrArg) != p.pointer:
            raise PlanError(f"{where}: argument {k} ('{p.name}') pointer/value mismatch")
    for dim in (*call.launch.grid, *call.launch.block):
        if not 1 <= dim <= _INT32_MAX:
            raise PlanError(f"{where}: launch dimension {dim} out of range")


# -- cuBLAS ------------------------------------------------------------------------------------
_BLAS_TYPES = {DType.F32: CUDA_R_32F, DType.F64: CUDA_R_64F, DType.F16: CUDA_R_16F}


@dataclass(frozen=True, slots=True)
class GemmCall:
    """A cuBLAS GEMM in the library's column-major terms; offsets are arena bytes. Batch 1 is
    `cublasGemmEx`, otherwise `cublasGemmStridedBatchedEx` (strides in elements)."""

    step: int
    op: st.MatMul
    transa: int
    transb: int
    m: int
    n: int
    k: int
    alpha: float
    beta: float
    a: int
    lda: int
    stride_a: int
    b: int
    ldb: int
    stride_b: int
    c: int
    ldc: int
    stride_c: int
    batch: int
    data_type: int
    compute_type: int
    scalar: np.dtype
    """alpha and beta are host values of this type (the compute type's scale type)."""

    kind = "matmul"

    @property
    def function(self) -> str:
        """The cuBLAS C function (`kn_cuda_eval.cuda.device.cublas.PROTOTYPES`)."""
        return "cublasGemmEx" if self.batch == 1 else "cublasGemmStridedBatchedEx"

    def arguments(self, handle: int, base: int, alpha_ptr: int, beta_ptr: int) -> tuple[int, ...]:
        """The arguments of the C function `function`, in cublas_api.h's order."""
        a, b, c, t = base + self.a, base + self.b, base + self.c, self.data_type
        head = (handle, self.transa, self.transb, self.m, self.n, self.k, alpha_ptr)
        if self.batch == 1:
            return (
                *head,
                a, t, self.lda,
                b, t, self.ldb,
                beta_ptr,
                c, t, self.ldc,
                self.compute_type, CUBLAS_GEMM_DEFAULT,
            )  # fmt: skip
        return (
            *head,
            a, t, self.lda, self.stride_a,
            b, t, self.ldb, self.stride_b,
            beta_ptr,
            c, t, self.ldc, self.stride_c,
            self.batch, self.compute_type, CUBLAS_GEMM_DEFAULT,
        )  # fmt: skip

    def describe(self) -> str:
        ta = "T" if self.transa == CUBLAS_OP_T else "N"
        tb = "T" if self.transb == CUBLAS_OP_T else "N"
        ct = {
            CUBLAS_COMPUTE_32F: "f32",
            CUBLAS_COMPUTE_32F_FAST_TF32: "tf32",
            CUBLAS_COMPUTE_64F: "f64",
        }[self.compute_type]
        return f"{self.function} {ta}{tb} m={self.m} n={self.n} k={self.k} batch={self.batch} {ct}"


def _gemm_call(k: int, s: st.MatMul, tf32: bool) -> GemmCall:
    dt = s.dtype
    if dt not in _BLAS_TYPES or s.a.dtype is not dt or s.b.dtype is not dt:
        raise PlanError(f"step {k}: cuBLAS GEMM on {s.a.dtype}x{s.b.dtype}->{dt}")
    scalar: np.dtype = np.dtype(np.float64 if dt is DType.F64 else np.float32)
    if dt is DType.F64:
        compute = CUBLAS_COMPUTE_64F
    elif dt is DType.F32 and tf32:
        compute = CUBLAS_COMPUTE_32F_FAST_TF32
    else:  # f32 exact; f16 stored, accumulated in f32
        compute = CUBLAS_COMPUTE_32F
    for name, v in (("m", s.m), ("n", s.n), ("k", s.k), ("batch", s.batch)):
        if not 0 < v <= _INT32_MAX:
            raise PlanError(f"step {k} ({s.describe()}): {name}={v} does not fit cuBLAS's int")
    for name, v in (("lda", s.lda), ("ldb", s.ldb), ("ldc", s.ldc)):
        if not 0 < v <= _INT32_MAX:
            raise PlanError(f"step {k} ({s.describe()}): {name}={v} does not fit cuBLAS's int")
    return GemmCall(
        step=k,
        op=s,
        transa=CUBLAS_OP_T if s.transa else CUBLAS_OP_N,
        transb=CUBLAS_OP_T if s.transb else CUBLAS_OP_N,
        m=s.m,
        n=s.n,
        k=s.k,
        alpha=s.alpha,
        beta=s.beta,
        a=s.a.offset,
        lda=s.lda,
        stride_a=s.stride_a,
        b=s.b.offset,
        ldb=s.ldb,
        stride_b=s.stride_b,
        c=s.c.offset,
        ldc=s.ldc,
        stride_c=s.stride_c,
        batch=s.batch,
        data_type=_BLAS_TYPES[dt],
        compute_type=compute,
        scalar=scalar,
    )


# -- cuDNN -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ConvCall:
    """`cudnnConvolutionBiasActivationForward`: y = act(conv(x, w) + alpha2·z + bias). Without a
    residual, z is y with alpha2 = 0; without a bias, the zeros region. Offsets are arena bytes;
    dims and strides are cuDNN's (rank ≥ 4: a 1-d convolution has a height of 1)."""

    step: int
    op: st.Conv
    geometry: ConvGeometry
    x: int
    w: int
    y: int
    z: int
    z_strides: tuple[int, ...]
    alpha2: float
    bias: int
    bias_dims: tuple[int, ...]
    bias_strides: tuple[int, ...]
    activation: ActivationMode
    math: MathType
    algo: ConvFwdAlgo | None
    """A required algorithm (IDENTITY activation needs IMPLICIT_PRECOMP_GEMM), or None: the
    device layer picks one with cuDNN's heuristics."""

    kind = "conv"

    def describe(self) -> str:
        g = self.geometry
        act = "relu" if self.activation is ActivationMode.RELU else "identity"
        res = " +z" if self.alpha2 else ""
        return (
            f"cudnnConvolutionBiasActivationForward x={list(g.x_dims)} w={list(g.w_dims)} "
            f"g={g.groups} {act}{res} math={self.math.name.lower()}"
        )


def _lift(dims: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of a 3-d (1-d conv) tensor lifted to 4-d with a height of 1."""
    if len(dims) != 3:
        return strides
    return (*strides[:2], strides[2] * dims[2], strides[2])


def _conv_call(k: int, s: st.Conv, zeros: int, tf32: bool) -> ConvCall:
    dt = s.out.dtype
    if dt not in (DType.F32, DType.F16, DType.F64):
        raise PlanError(f"step {k}: cuDNN convolutions take f32, f16 or f64, not {dt}")
    for name, v in (("x", s.x), ("w", s.w), ("out", s.out), ("residual", s.residual)):
        if v is not None and any(x < 0 for x in v.strides):
            raise PlanError(f"step {k} ({s.describe()}): {name} has negative strides")
    if not s.w.is_dense():
        raise PlanError(f"step {k} ({s.describe()}): cuDNN filters must be dense")
    geo = ConvGeometry.of(s)
    nd = len(geo.y_dims)
    kout = s.out.shape[1]
    bias_dims = (1, kout) + (1,) * (nd - 2)
    bias_strides = (kout, 1) + (1,) * (nd - 2)
    if s.bias is not None:
        if s.bias.shape != (kout,) or s.bias.strides != (1,):
            raise PlanError(f"step {k} ({s.describe()}): the bias must be a dense [{kout}] vector")
        bias = s.bias.offset
    else:
        bias = zeros
    if s.residual is not None:
        z, z_strides, alpha2 = s.residual.offset, _lift(s.out.shape, s.residual.strides), 1.0
    else:
        z, z_strides, alpha2 = s.out.offset, geo.y_strides, 0.0
    if dt is DType.F32:
        math = MathType.TENSOR_OP if tf32 else MathType.FMA
    elif dt is DType.F16:
        math = MathType.TENSOR_OP
    else:
        math = MathType.FMA
    act = ActivationMode.RELU if s.relu else ActivationMode.IDENTITY
    algo = None if s.relu else ConvFwdAlgo.IMPLICIT_PRECOMP_GEMM
    return ConvCall(
        step=k,
        op=s,
        geometry=geo,
        x=s.x.offset,
        w=s.w.offset,
        y=s.out.offset,
        z=z,
        z_strides=z_strides,
        alpha2=alpha2,
        bias=bias,
        bias_dims=bias_dims,
        bias_strides=bias_strides,
        activation=act,
        math=math,
        algo=algo,
    )


# -- the whole list ------------------------------------------------------------------------------
Call = KernelCall | GemmCall | ConvCall


def _kind(s: st.Step) -> str:
    return type(s).__name__.lower()


@dataclass(frozen=True, slots=True)
class Layout:
    """The executor's one allocation. The plan's arena comes first (its offsets stay valid); the
    cuDNN workspace is last because only the device knows its size."""

    plan_size: int
    staging: int
    staging_size: int
    zeros: int
    zeros_size: int
    cublas_workspace: int
    cublas_workspace_size: int
    conv_workspace: int

    def total(self, conv_workspace_size: int) -> int:
        return self.conv_workspace + align(conv_workspace_size)


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """Where output `name` is read from after a run: a dense region (the plan's own view when
    it is dense, else its copy in the staging region)."""

    name: str
    shape: tuple[int, ...]
    dtype: DType
    offset: int

    @property
    def nbytes(self) -> int:
        n = self.dtype.size
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True, slots=True, eq=False)
class LaunchList:
    """Everything the device layer executes, in order, plus where inputs go and outputs come
    from. Offsets are bytes from the allocation's base."""

    plan: Plan
    calls: tuple[Call, ...]
    kernels: tuple[Kernel, ...]
    layout: Layout
    inputs: tuple[StridedView, ...]
    outputs: tuple[OutputSpec, ...]
    status: int

    @property
    def has_gemm(self) -> bool:
        return any(isinstance(c, GemmCall) for c in self.calls)

    @property
    def has_conv(self) -> bool:
        return any(isinstance(c, ConvCall) for c in self.calls)

    def __str__(self) -> str:
        lay = self.layout
        lines = [
            f"launch list: {len(self.calls)} calls, {len(self.kernels)} distinct kernels; "
            f"plan arena {lay.plan_size} B, staging {lay.staging_size} B, zeros {lay.zeros_size} B, "
            f"cuBLAS workspace {lay.cublas_workspace_size} B, cuDNN workspace at {lay.conv_workspace}"
        ]
        for c in self.calls:
            lines.append(f"  {c.step:>4}  {c.kind:<11} {c.describe()}")
        return "\n".join(lines)


def _writes_nothing(s: st.Step) -> bool:
    return all(v.numel == 0 for v in s.writes())


def bind(plan: Plan, settings: ExecutorSettings | None = None) -> LaunchList:
    """The launch list of `plan`: one call per step that writes something (steps with empty
    outputs are dropped), then copies of strided outputs into the staging region. Raises
    PlanError for anything the libraries or kernels could not take."""
    sets = settings if settings is not None else ExecutorSettings()
    pos = align(plan.arena_size)
    outputs: list[OutputSpec] = []
    copies: list[st.Copy] = []
    staging = pos
    for name, v in zip(plan.output_names, plan.outputs, strict=True):
        if v.numel == 0 or v.is_dense():
            outputs.append(OutputSpec(name, v.shape, v.dtype, v.offset))
            continue
        dst = StridedView.dense(pos, v.shape, v.dtype)
        copies.append(st.Copy(v, dst))
        outputs.append(OutputSpec(name, v.shape, v.dtype, pos))
        pos = align(pos + v.nbytes)
    staging_size = pos - staging
    convs = [s for s in plan.steps if isinstance(s, st.Conv) and s.bias is None]
    zeros_size = align(max((s.out.shape[1] * s.out.itemsize for s in convs), default=0))
    zeros = pos
    pos += zeros_size
    has_gemm = any(isinstance(s, st.MatMul) for s in plan.steps)
    ws_size = align(sets.cublas_workspace) if has_gemm else 0
    layout = Layout(
        plan_size=plan.arena_size,
        staging=staging,
        staging_size=staging_size,
        zeros=zeros,
        zeros_size=zeros_size,
        cublas_workspace=pos,
        cublas_workspace_size=ws_size,
        conv_workspace=pos + ws_size,
    )
    calls: list[Call] = []
    for k, s in enumerate(plan.steps):
        if _writes_nothing(s):
            continue
        match s:
            case st.MatMul():
                calls.append(_gemm_call(k, s, sets.tf32))
            case st.Conv():
                calls.append(_conv_call(k, s, zeros, sets.tf32))
            case _:
                launch = launch_for(s, plan.status)
                assert launch is not None, s
                calls.append(KernelCall(k, s, launch))
    for c in copies:
        launch = launch_for(c, plan.status)
        assert launch is not None
        calls.append(KernelCall(-1, c, launch))
    for call in calls:
        if isinstance(call, KernelCall):
            check_kernel_call(call)
    kernels = tuple(distinct_kernels(c.launch for c in calls if isinstance(c, KernelCall)))
    return LaunchList(
        plan=plan,
        calls=tuple(calls),
        kernels=kernels,
        layout=layout,
        inputs=plan.inputs,
        outputs=tuple(outputs),
        status=plan.status.offset,
    )
