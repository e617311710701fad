"""The CUDA executor on a real GPU (`-m cuda`; skips, saying why, without one): host, CuPy and
DLPack (torch) inputs, device outputs, CUDA graphs against step-by-step launches, the status
word, profiling, TF32, several executors side by side, kn_runtime and kn-run. Every planner test
and every fixture model also runs here through helpers.check_device (graphs on and off)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from kn_cuda_eval import emulate
from kn_cuda_eval.cuda.device import ExecutorSettings
from kn_graph import DType, Graph, Shape, UnaryOp
from kn_graph.errors import EvaluationError, InputMismatchError
from kn_runtime import Device
from kn_runtime.cli import main as kn_run
from tests.kn_cuda_eval.cuda.test_executor_binding import _mixed_graph
from tests.kn_cuda_eval.helpers import assert_close, need_gpu

pytestmark = pytest.mark.cuda
RNG = np.random.default_rng(21)


def _ex(g: Graph, **settings: object):  # type: ignore[no-untyped-def]
    need_gpu()
    from kn_cuda_eval.cuda.device.executor import CudaExecutor

    return CudaExecutor(g, settings=ExecutorSettings(**settings))  # type: ignore[arg-type]


def _x() -> np.ndarray:
    return RNG.standard_normal((2, 4, 9, 9)).astype(np.float32)


def _same(got: list, want: list[np.ndarray], what: str = "") -> None:
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        a = a if isinstance(a, np.ndarray) else a.get()
        assert_close(a, b, f"{what} output {k}")


def test_graphs_and_step_by_step_agree_over_many_runs() -> None:
    with _ex(_mixed_graph()) as g_ex, _ex(_mixed_graph(), cuda_graphs=False) as s_ex:
        for k in range(5):
            x = _x()
            want = emulate(g_ex.plan, [x])
            _same(g_ex.eval([x]), want, f"graphs run {k}")
            _same(s_ex.eval([x]), want, f"steps run {k}")
        assert g_ex.uses_cuda_graph, g_ex.graph_error
        assert not s_ex.uses_cuda_graph


def test_cupy_and_dlpack_inputs_and_device_outputs() -> None:
    import cupy as cp

    with _ex(_mixed_graph()) as ex:
        x = _x()
        want = emulate(ex.plan, [x])
        for _ in range(3):
            outs = ex.eval([cp.asarray(x)], return_device=True)
            assert all(isinstance(o, cp.ndarray) for o in outs)
            _same(outs, want, "cupy in, cupy out")
        strided = cp.asarray(np.ascontiguousarray(x.transpose(0, 1, 3, 2))).transpose(0, 1, 3, 2)
        _same(ex.eval([strided]), want, "non-contiguous cupy input")
        try:
            import torch
        except ImportError:
            return
        t = torch.from_numpy(x).cuda()
        _same(ex.eval([t]), want, "torch (DLPack) input")
        with pytest.raises(InputMismatchError):
            ex.eval([t.double()])


def test_status_word_on_the_device() -> None:
    g = Graph()
    x = g.input(Shape.of(5, 3), DType.F32, "x")
    i = g.input(Shape.of(4), DType.I64, "i")
    g.add_output(g.gather(x, 0, i), "y")
    with _ex(g) as ex:
        xv = RNG.standard_normal((5, 3)).astype(np.float32)
        good = np.array([0, 4, 2, 1])
        _same(ex.eval([xv, good]), [xv[good]])
        with pytest.raises(EvaluationError, match="out of range"):
            ex.eval([xv, np.array([0, 5, 2, 1])])
        for _ in range(3):
            _same(ex.eval([xv, good]), [xv[good]])
        assert ex.uses_cuda_graph


def test_profile_on_the_device() -> None:
    with _ex(_mixed_graph()) as ex:
        prof = ex.profile([_x()])
        assert [r.kind for r in prof.rows] == ["conv", "matmul", "softmax", "output-copy"]
        assert all(r.ms > 0 for r in prof.rows)
        print(prof)


def test_tf32_runs_close_to_f32() -> None:
    x = _x()
    with _ex(_mixed_graph(), tf32=True) as ex:
        got = ex.eval([x])
        want = emulate(ex.plan, [x])
        for a, b in zip(got, want, strict=True):
            err = float(np.max(np.abs(a - b))) / max(1.0, float(np.max(np.abs(b))))
            assert err < 2e-2


def test_many_executors_side_by_side() -> None:
    exs = [_ex(_mixed_graph(), cuda_graphs=k % 2 == 0) for k in range(6)]
    xs = [_x() for _ in exs]
    for _ in range(2):
        outs = [ex.eval([x]) for ex, x in zip(exs, xs, strict=True)]
        for ex, x, o in zip(exs, xs, outs, strict=True):
            _same(o, emulate(ex.plan, [x]))
    for ex in exs:
        ex.close()


def test_evaluation_overhead_of_a_1000_step_plan() -> None:
    """Not a pass/fail speed test: prints the numbers the issue's target is about."""
    from kn_cuda_eval import PlanSettings

    g = Graph()
    x = g.input(Shape.of(1, 32), DType.F32, "x")
    y = x
    for k in range(1000):
        y = g.unary(UnaryOp.SIN if k % 2 else UnaryOp.COS, y)
    g.add_output(y, "y")
    for graphs in (True, False):
        with _ex(g, cuda_graphs=graphs, plan=PlanSettings(fuse_elementwise=False)) as ex:
            assert len(ex.launches.calls) == 1000
            xv = np.ones((1, 32), np.float32)
            for _ in range(3):
                ex.eval([xv])
            ts = []
            for _ in range(20):
                t0 = time.perf_counter()
                ex.run_device(sync=False)
                t1 = time.perf_counter()
                ex.synchronize()
                ts.append((t1 - t0, time.perf_counter() - t0))
            sub = float(np.median([a for a, _ in ts])) * 1e6
            wall = float(np.median([b for _, b in ts])) * 1e6
            print(f"1000 steps, cuda graphs {graphs}: submit {sub:.0f} us, wall {wall:.0f} us")


def test_kn_runtime_and_kn_run_on_the_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    need_gpu()
    assert Device.best().kind == "cuda"
    assert kn_run(["--device", "cuda", "--batch", "2", "--bench", "--runs", "3", "--profile"]) == 0
    out = capsys.readouterr().out
    assert "device: cuda:0" in out and "profile on cuda:0" in out
    diff = float(out.split("max |d| / max |ref| = ")[1].split()[0])
    assert diff < 1e-4
