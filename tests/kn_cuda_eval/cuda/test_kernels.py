"""Kernel generation and compilation: strict templates, structured C, NVRTC errors that carry the
log and the numbered source, the on-disk cache, and kernels shared across batch sizes."""

from __future__ import annotations

import numpy as np
import pytest

from kn_cuda_eval import plan
from kn_cuda_eval.codegen.template import CodeWriter, fill
from kn_cuda_eval.cuda.kernels import FloatArg, IntArg, Kernel, PtrArg, distinct_kernels
from kn_cuda_eval.cuda.kernels import compile as kc
from kn_cuda_eval.cuda.kernels.dispatch import plan_launches
from kn_graph import DType, Graph, Shape, Size
from kn_graph.errors import KernelCompileError

B = Size.sym("B")


def test_fill_is_strict() -> None:
    assert fill("a $X$ b $Y_2$", {"X": 1, "Y_2": "z"}) == "a 1 b z"
    with pytest.raises(KeyError, match="without values: \\['Y'\\]"):
        fill("$X$ $Y$", {"X": 1})
    with pytest.raises(KeyError, match="without holes: \\['Z'\\]"):
        fill("$X$", {"X": 1, "Z": 2})


def test_code_writer_indents_blocks() -> None:
    w = CodeWriter()
    with w.block("if (x)"):
        w.line("y();")
    assert str(w) == "if (x) {\n    y();\n}"


def test_compile_error_carries_log_and_numbered_source() -> None:
    bad = Kernel("kn_broken", 'extern "C" __global__ void kn_broken() {\n    this is not C;\n}\n')
    with pytest.raises(KernelCompileError) as e:
        kc.compile_kernel(bad, 80)
    msg = str(e.value)
    assert "--- log ---" in msg and "error" in msg
    assert "   2      this is not C;" in msg


def test_compiled_kernels_are_cached_on_disk(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KN_KERNEL_CACHE", str(tmp_path))
    k = Kernel(
        "kn_tiny", 'extern "C" __global__ void kn_tiny(float* x) { x[threadIdx.x] *= 2.f; }\n'
    )
    first = kc.compile_kernel(k, 90)
    assert first.cubin[:4] == b"\x7fELF" and first.registers > 0
    assert list(tmp_path.rglob("*.cubin"))
    kc._memory.clear()
    monkeypatch.setattr(kc, "_compile", lambda *a: pytest.fail("should come from the disk cache"))
    again = kc.compile_kernel(k, 90)
    assert again.cubin == first.cubin and again.registers == first.registers


def test_arch_is_clamped_to_what_nvrtc_supports() -> None:
    assert kc.clamp_arch(90) == 90
    assert kc.clamp_arch(10_000) == max(kc.supported_archs())
    with pytest.raises(KernelCompileError):
        kc.clamp_arch(10)


def _model() -> Graph:
    g = Graph()
    x = g.input(Shape.of(B, 12, 32), DType.F32, "x")
    h = g.layernorm(g.add(x, 1.0), 2, 1e-5)
    g.add_output(g.softmax(g.mul(h, 0.5), 2), "y")
    return g


def test_kernels_are_shared_across_batch_sizes() -> None:
    g = _model()
    k1 = {k.name for k in distinct_kernels(plan_launches(plan(g, 1)))}
    k8 = {k.name for k in distinct_kernels(plan_launches(plan(g, 8)))}
    assert k1 == k8 and len(k1) == 2


def test_launch_arguments_follow_the_plan() -> None:
    g = Graph()
    x = g.input(Shape.of(4, 6), DType.F32, "x")
    g.add_output(g.mul(g.permute(x, [1, 0]), 3.0), "y")
    p = plan(g)
    (launch,) = plan_launches(p)
    (step,) = p.steps
    ptrs = [a.offset for a in launch.args if isinstance(a, PtrArg)]
    assert ptrs == [step.outputs[0].offset, step.inputs[0].offset]
    ints = [a.value for a in launch.args if isinstance(a, IntArg)]
    assert ints[0] == 24 and all(a.bits == 32 for a in launch.args if isinstance(a, IntArg))
    assert not any(isinstance(a, FloatArg) for a in launch.args)
    assert launch.block == (256, 1, 1) and launch.grid == (1, 1, 1)
    assert "kn_idx c1 = crem % d1" in launch.kernel.source


def test_attention_kernel_takes_scale_as_argument() -> None:
    g = Graph()
    q = g.input(Shape.of(2, 3, 64), DType.F16, "q")
    g.add_output(g.attention(q, q, q, None, 0.125, True), "o")
    (launch,) = plan_launches(plan(g))
    assert FloatArg(0.125) in launch.args
    assert "#define DVL 2" in launch.kernel.source
    from tests.kn_cuda_eval.helpers import check_plan

    check_plan(g, [np.random.default_rng(8).standard_normal((2, 3, 64)).astype(np.float16)])
