"""The binding layer on the CPU: launch lists of tiny graphs and of the whole fixture corpus are
checked against the generated kernels' C signatures, the arena layout, CuPy's cuBLAS signatures
and enum values, and (through the fake device) against the emulator."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from kn_cuda_eval import PlanSettings, plan
from kn_cuda_eval.cuda.cudnn.lib import ActivationMode, ConvFwdAlgo, MathType
from kn_cuda_eval.cuda.device import ExecutorSettings, bind
from kn_cuda_eval.cuda.device import calls as c
from kn_cuda_eval.cuda.kernels import IntArg, PtrArg
from kn_cuda_eval.planning.memory import ALIGN
from kn_graph import DType, Graph, Shape
from kn_graph.errors import PlanError
from tests.kn_cuda_eval.corpus import FIXTURES, fixture_plans

RNG = np.random.default_rng(5)


def _conv_graph(bias: bool, residual: bool, relu: bool, nd: int = 2) -> Graph:
    g = Graph()
    x = g.input(Shape.of(2, 4, *(9,) * nd), DType.F32, "x")
    w = g.constant(RNG.standard_normal((4, 4, *(3,) * nd)).astype(np.float32))
    y = g.conv(x, w, (1,) * nd, (1,) * nd, (1,) * nd, 1)
    if bias:
        y = g.add(y, g.constant(RNG.standard_normal((1, 4, *(1,) * nd)).astype(np.float32)))
    if residual:
        y = g.add(y, x)
    if relu:
        y = g.relu(y)
    g.add_output(y, "y")
    return g


def _mixed_graph() -> Graph:
    """A conv, a batched GEMM, a softmax and a strided (permuted) output."""
    g = _conv_graph(True, False, True)
    y = g.outputs[0]
    flat = g.view(y, Shape.of(2, 4, 81))
    g.add_output(g.softmax(g.matmul(flat, g.permute(flat, [0, 2, 1])), 2), "s")
    g.add_output(g.permute(y, [0, 2, 3, 1]), "t")
    return g


@pytest.mark.cuda  # needs CuPy's cuBLAS binding (libcublas), which CI does not install
def test_cuda_enum_values_match_cupy() -> None:
    try:
        from cupy.cuda import cublas, runtime
    except Exception as e:
        pytest.skip(f"CuPy's cuBLAS binding is not importable here: {e}")
    assert (c.CUBLAS_OP_N, c.CUBLAS_OP_T) == (cublas.CUBLAS_OP_N, cublas.CUBLAS_OP_T)
    assert c.CUBLAS_COMPUTE_32F == cublas.CUBLAS_COMPUTE_32F
    assert c.CUBLAS_COMPUTE_32F_FAST_TF32 == cublas.CUBLAS_COMPUTE_32F_FAST_TF32
    assert c.CUBLAS_COMPUTE_64F == cublas.CUBLAS_COMPUTE_64F
    assert c.CUBLAS_GEMM_DEFAULT == cublas.CUBLAS_GEMM_DEFAULT
    assert (c.CUDA_R_32F, c.CUDA_R_64F, c.CUDA_R_16F) == (
        runtime.CUDA_R_32F,
        runtime.CUDA_R_64F,
        runtime.CUDA_R_16F,
    )


@pytest.mark.cuda  # needs CuPy's cuBLAS binding
@pytest.mark.parametrize("batch", [1, 3])
def test_gemm_argument_tuples_follow_cupys_signatures(batch: int) -> None:
    """Argument count and order against the signature CuPy documents for each function: the
    call names the C function our ctypes binding declares (`cublasGemmEx`), whose CuPy wrapper
    (`gemmEx`) takes the same arguments in the same order, named as in cublas_api.h."""
    try:
        from cupy.cuda import cublas
    except Exception as e:
        pytest.skip(f"CuPy's cuBLAS binding is not importable here: {e}")
    from kn_cuda_eval.cuda.device.cublas import PROTOTYPES

    g = Graph()
    a = g.input(Shape.of(batch, 5, 7), DType.F32, "a")
    b = g.input(Shape.of(batch, 7, 3), DType.F32, "b")
    g.add_output(g.matmul(a, b), "c")
    (call,) = [x for x in bind(plan(g)).calls if isinstance(x, c.GemmCall)]
    assert call.function == ("cublasGemmEx" if batch == 1 else "cublasGemmStridedBatchedEx")
    wrapper = call.function.removeprefix("cublas")
    doc = getattr(cublas, wrapper[0].lower() + wrapper[1:]).__doc__
    names = [p.split()[-1] for p in re.search(r"\((.*)\)", doc).group(1).split(",")]
    args = call.arguments(11, 1 << 40, 22, 33)
    assert len(args) == len(names) == len(PROTOTYPES[call.function][1])
    by_name = dict(zip(names, args, strict=True))
    assert by_name["handle"] == 11 and by_name["alpha"] == 22 and by_name["beta"] == 33
    assert (by_name["m"], by_name["n"], by_name["k"]) == (call.m, call.n, call.k)
    assert by_name["computeType"] == c.CUBLAS_COMPUTE_32F
    assert by_name["C"] == (1 << 40) + call.c
    if batch > 1:
        assert by_name["batchCount"] == batch and by_name["strideC"] == call.stride_c


def test_c_parameters_are_parsed_from_the_source() -> None:
    lst = bind(plan(_mixed_graph()))
    softmax = next(x for x in lst.calls if isinstance(x, c.KernelCall) and x.kind == "softmax")
    name, idx, params = c.c_parameters(softmax.launch.kernel.source)
    assert name == softmax.name and idx == "int"
    assert params[0] == c.CParam("kn_idx", "rows", False)
    ptrs = [p for p in params if p.pointer]
    assert [p.name for p in ptrs] == ["in0", "out"] and ptrs[0].ctype == "float"
    packed = softmax.packed(1 << 36)
    assert [type(a) for a in packed] == [p.numpy_type(idx).type for p in params]


def test_mismatched_kernel_arguments_are_refused() -> None:
    lst = bind(plan(_mixed_graph()))
    k = next(x for x in lst.calls if isinstance(x, c.KernelCall))
    launch = k.launch
    wrong = [
        launch.args[:-1],  # one missing
        (*launch.args[:-1], PtrArg(0)),  # a pointer where an int goes
        tuple(IntArg(a.value, 64) if isinstance(a, IntArg) else a for a in launch.args),  # width
    ]
    for args in wrong:
        bad = dataclasses.replace(k, launch=dataclasses.replace(launch, args=args))
        with pytest.raises(PlanError, match=k.name):
            c.check_kernel_call(bad)


def test_layout_regions_are_aligned_and_disjoint() -> None:
    lst = bind(plan(_mixed_graph()))
    lay = lst.layout
    assert lay.staging >= lay.plan_size and lay.staging % ALIGN == 0
    assert lay.staging_size == 2816  # the permuted output (2·9·9·4 f32), copied dense, aligned
    assert lay.zeros_size == 0  # the only conv has a bias
    assert lay.cublas_workspace == lay.zeros + lay.zeros_size
    assert lay.cublas_workspace_size == ExecutorSettings().cublas_workspace
    assert lay.conv_workspace == lay.cublas_workspace + lay.cublas_workspace_size
    assert lay.total(100) == lay.conv_workspace + ALIGN
    names = [o.name for o in lst.outputs]
    assert names == ["y", "s", "t"]
    t = lst.outputs[2]
    assert t.offset == lay.staging and t.shape == (2, 9, 9, 4)
    copy = lst.calls[-1]
    assert isinstance(copy, c.KernelCall) and copy.step == -1 and copy.kind == "output-copy"


def test_no_library_regions_without_library_calls() -> None:
    g = Graph()
    x = g.input(Shape.of(3, 4), DType.F32, "x")
    g.add_output(g.relu(x), "y")
    lst = bind(plan(g))
    lay = lst.layout
    assert lay.staging_size == lay.zeros_size == lay.cublas_workspace_size == 0
    assert not lst.has_gemm and not lst.has_conv and lay.total(0) == lay.plan_size


@pytest.mark.parametrize(
    ("bias", "residual", "relu"),
    [(True, False, True), (False, False, False), (True, True, True), (False, True, False)],
)
def test_conv_calls(bias: bool, residual: bool, relu: bool) -> None:
    p = plan(_conv_graph(bias, residual, relu))
    lst = bind(p)
    (call,) = [x for x in lst.calls if isinstance(x, c.ConvCall)]
    step = call.op
    assert (step.bias is not None, step.residual is not None, step.relu) == (bias, residual, relu)
    assert call.bias == (step.bias.offset if bias else lst.layout.zeros)
    assert lst.layout.zeros_size == (0 if bias else ALIGN)
    assert call.alpha2 == (1.0 if residual else 0.0)
    assert call.z == (step.residual.offset if residual else step.out.offset)
    assert call.activation is (ActivationMode.RELU if relu else ActivationMode.IDENTITY)
    assert call.algo is (None if relu else ConvFwdAlgo.IMPLICIT_PRECOMP_GEMM)
    assert call.math is MathType.FMA
    assert call.bias_dims == (1, 4, 1, 1) and call.bias_strides == (4, 1, 1, 1)
    tf32 = bind(p, ExecutorSettings(tf32=True))
    assert next(x for x in tf32.calls if isinstance(x, c.ConvCall)).math is MathType.TENSOR_OP


def test_1d_conv_lifts_the_residual_too() -> None:
    lst = bind(plan(_conv_graph(True, True, True, nd=1)))
    (call,) = [x for x in lst.calls if isinstance(x, c.ConvCall)]
    assert call.geometry.x_dims == (2, 4, 1, 9) and call.geometry.y_dims == (2, 4, 1, 9)
    assert call.z_strides == call.geometry.y_strides == (36, 9, 9, 1)


def test_gemm_compute_types() -> None:
    for dt, tf32, want in [
        (DType.F32, False, c.CUBLAS_COMPUTE_32F),
        (DType.F32, True, c.CUBLAS_COMPUTE_32F_FAST_TF32),
        (DType.F16, True, c.CUBLAS_COMPUTE_32F),
        (DType.F64, False, c.CUBLAS_COMPUTE_64F),
    ]:
        g = Graph()
        a = g.input(Shape.of(1, 4, 6), dt, "a")
        b = g.input(Shape.of(1, 6, 5), dt, "b")
        g.add_output(g.matmul(a, b), "c")
        (call,) = [x for x in bind(plan(g), ExecutorSettings(tf32=tf32)).calls]
        assert isinstance(call, c.GemmCall) and call.compute_type == want, dt
        assert call.function == "cublasGemmEx" and call.scalar == (
            np.float64 if dt is DType.F64 else np.float32
        )


def test_steps_with_empty_outputs_are_dropped() -> None:
    g = Graph()
    x = g.input(Shape.of(0, 4), DType.F32, "x")
    g.add_output(g.exp(x), "y")
    lst = bind(plan(g))
    assert lst.calls == () and lst.outputs[0].shape == (0, 4)


def test_launch_list_prints() -> None:
    text = str(bind(plan(_mixed_graph())))
    assert text.startswith("launch list: 4 calls")
    assert "cudnnConvolutionBiasActivationForward x=[2, 4, 9, 9]" in text
    assert "cublasGemmStridedBatchedEx TN" in text and "output-copy" in text


def _all_plans() -> list:
    out = [
        plan(_mixed_graph()),
        plan(_mixed_graph(), settings=PlanSettings(fuse_elementwise=False)),
    ]
    for f in FIXTURES:
        out += fixture_plans(f["name"])
    return out


def test_every_fixture_binds_inside_the_allocation() -> None:
    """Every pointer any call passes lies in its region and is aligned to its element size."""
    n_calls = 0
    for p in _all_plans():
        lst = bind(p)
        lay = lst.layout
        end = lay.total(0)
        for call in lst.calls:
            n_calls += 1
            match call:
                case c.KernelCall():
                    views = [*call.op.reads(), *call.op.writes()]
                case c.GemmCall():
                    views = [call.op.a, call.op.b, call.op.c]
                    assert (call.a, call.b, call.c) == tuple(v.offset for v in views)
                case c.ConvCall():
                    views = [*call.op.reads(), call.op.out]
                    assert 0 <= call.bias < end and call.bias % 4 == 0
            for v in views:
                lo, hi = v.byte_extent()
                assert 0 <= lo <= hi <= end, (call, v)
                assert v.offset % v.itemsize == 0, (call, v)
                if hi > lay.plan_size:
                    assert lay.staging <= lo and hi <= lay.staging + lay.staging_size
    assert n_calls > 1000
