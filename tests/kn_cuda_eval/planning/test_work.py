"""`planning.work`: the operations a plan does, counted by hand for a GEMM and a convolution,
and what the CPU backend makes of it: a plan under `SINGLE_THREAD_WORK` runs on one thread
whatever the device's thread count, a larger one on all of them; both give the reference's
numbers."""

from __future__ import annotations

import numpy as np

from kn_cuda_eval import plan
from kn_cuda_eval.cpu.executor import SINGLE_THREAD_WORK
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.work import plan_work, step_work
from kn_graph import DType, Graph, Shape
from kn_graph.reference import evaluate
from kn_runtime import Device


def _matmul(m: int, k: int, n: int) -> Graph:
    g = Graph()
    a = g.input(Shape.of(1, m, k), DType.F32, "a")
    b = g.input(Shape.of(1, k, n), DType.F32, "b")
    g.add_output(g.matmul(a, b), "c")
    return g


def test_a_gemm_counts_two_operations_per_multiply_add() -> None:
    p = plan(_matmul(4, 8, 16))
    (mm,) = [s for s in p.steps if isinstance(s, st.MatMul)]
    assert step_work(mm) == 2 * 4 * 8 * 16
    assert plan_work(p.steps) >= 2 * 4 * 8 * 16


def test_a_convolution_counts_its_filter_taps_per_output() -> None:
    g = Graph()
    x = g.input(Shape.of(1, 3, 10, 10), DType.F32, "x")
    w = g.constant(np.ones((5, 3, 3, 3), np.float32))
    g.add_output(g.conv(x, w, stride=(1, 1), padding=(1, 1)), "y")
    (conv,) = [s for s in plan(g).steps if isinstance(s, st.Conv)]
    assert step_work(conv) == 2 * (5 * 10 * 10) * (3 * 3 * 3)


def test_the_cpu_backend_runs_small_plans_on_one_thread() -> None:
    rng = np.random.default_rng(0)
    for (m, k, n), threads in (((4, 8, 16), 1), ((256, 256, 256), 2)):
        g = _matmul(m, k, n)
        assert (plan_work(plan(g).steps) < SINGLE_THREAD_WORK) == (threads == 1)
        p = Device.cpu(threads=2).prepare(g)
        (ex,) = p.cache.values()
        assert ex.threads == threads  # type: ignore[attr-defined]
        feed = [rng.standard_normal((1, m, k)).astype(np.float32), rng.standard_normal((1, k, n))]
        feed[1] = feed[1].astype(np.float32)
        np.testing.assert_allclose(p.eval(feed)[0], evaluate(g, feed)[0], rtol=1e-4, atol=1e-4)
