"""The device-neutral row kernel description (`codegen/rows.py`) and the attention arithmetic
(`codegen/attention.py`), and that both backends print them: the accumulator, its identity and
the stored value appear in the CUDA and the C source of the same step."""

from __future__ import annotations

import doctest
from types import ModuleType

import numpy as np
import pytest

from kn_cuda_eval import plan
from kn_cuda_eval.codegen import attention, rows
from kn_cuda_eval.cpu import build, csource
from kn_cuda_eval.cpu.csource import rows as crows
from kn_cuda_eval.cpu.executor import HostExecutor
from kn_cuda_eval.cuda.kernels.dispatch import launch_for
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.program import Load, Program
from kn_cuda_eval.planning.view import StridedView
from kn_graph import DType, Graph, Shape
from kn_graph.ops import ReduceOp
from kn_graph.reference import evaluate


@pytest.mark.parametrize("module", [rows, attention, csource, crows], ids=lambda m: m.__name__)
def test_module_doctests_pass(module: ModuleType) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


def _x(shape: tuple[int, ...], dt: DType) -> st.Expr:
    return st.Expr(shape, (StridedView.dense(0, shape, dt),), (), Program((Load(0, dt),), (0,)))


def _sources(step: st.Step) -> tuple[str, str]:
    c = csource.step_call(step)
    cuda = launch_for(step, StridedView.dense(0, (1,), DType.I32))
    assert c is not None and cuda is not None
    return c.kernel.source, cuda.kernel.source


@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda o: o.value)
@pytest.mark.parametrize("dt", [DType.F32, DType.F16, DType.F64, DType.I8, DType.U8, DType.I64])
def test_both_backends_declare_the_described_accumulator(op: ReduceOp, dt: DType) -> None:
    k = rows.reduce(op, dt)
    out = StridedView.dense(4096, (3,), DType.I64 if op.is_arg else dt)
    c, cuda = _sources(st.Reduce(_x((3, 40), dt), out, op))
    decl = f"{k.acc} a = {k.last.identity};"
    assert decl in c and decl in cuda


@pytest.mark.parametrize("dt", [DType.F32, DType.F16, DType.F64])
def test_both_backends_store_the_described_normalized_value(dt: DType) -> None:
    acc = rows.reduce_acc(dt)
    step = st.Layernorm(_x((3, 40), dt), StridedView.dense(4096, (3, 40), dt), 1e-5)
    c, cuda = _sources(step)
    assert f"(({acc})cv0 - mean) / den" in c and f"(({acc})cv0 - mean) / den" in cuda
    exp = "exp" if dt is DType.F64 else "expf"
    c, cuda = _sources(st.Softmax(step.x, step.out))
    assert f"{exp}(({acc})bv0 - mx)" in c and f"{exp}(({acc})cv0 - mx) / sum" in cuda


def test_a_compound_result_is_parenthesized_in_the_store() -> None:
    mean = rows.StoreRow("$A$ / (float)ncols")
    assert mean.of("a[j]") == "a[j] / (float)ncols"
    assert mean.of("nan ? (float)NAN : a") == "(nan ? (float)NAN : a) / (float)ncols"
    assert rows.StoreRow("$A$").of("ai < 0 ? 0 : ai") == "ai < 0 ? 0 : ai"


def test_narrow_integers_accumulate_in_int() -> None:
    got = {dt: rows.reduce_acc(dt) for dt in (DType.BOOL, DType.I8, DType.U16, DType.I64)}
    assert got == {
        DType.BOOL: "int",
        DType.I8: "int",
        DType.U16: "unsigned int",
        DType.I64: "long long",
    }


def test_f16_softmax_on_the_host_with_software_half(monkeypatch: pytest.MonkeyPatch) -> None:
    """The C softmax keeps the exponentials in its f16 output and divides them in place; with
    `KN_SOFT_HALF` (a compiler without `_Float16`: `half` is the bits in a uint16_t) the stores
    and loads go through the conversions, not integer assignments."""
    flags = build.flags()
    if "-DKN_SOFT_HALF" not in flags:
        monkeypatch.setattr(build, "flags", lambda: (*flags, "-DKN_SOFT_HALF"))
    g = Graph()
    x = g.input(Shape.of(4, 33), DType.F16, "x")
    g.add_output(g.softmax(x, 1), "y")
    a = np.random.default_rng(3).standard_normal((4, 33)).astype(np.float16)
    got, want = HostExecutor(plan(g)).eval([a])[0], evaluate(g, [a])[0]
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), atol=2e-3)
