"""kn_runtime and the CLI around the CUDA executor: probing without a GPU never crashes, CUDA
devices prepare executors (one per binding of the symbols, exercised on the fake device), and
`kn-run --device/--profile` behave."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import kn_cuda_eval.cuda.device.executor as executor_module
from kn_cuda_eval.cuda.device import calls
from kn_cuda_eval.cuda.device.__main__ import main as device_main
from kn_graph import DType, Graph, Shape, Size
from kn_graph.errors import CudaUnavailableError, InputMismatchError, KnError
from kn_runtime import Device, PreparedGraph
from kn_runtime.cli import main as kn_run
from tests.kn_cuda_eval.cuda.fake_device import FakeApi
from tests.kn_cuda_eval.helpers import gpu_problem


def _no_gpu() -> str:
    reason = gpu_problem()
    if reason is None:
        pytest.skip("a CUDA device is present")
    return reason


def test_importing_the_device_package_loads_no_cupy() -> None:
    code = (
        "import sys, kn_cuda_eval.cuda.device as d, kn_runtime; d.bind; d.ExecutorSettings(); "
        "print('cupy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_probe_says_why_and_best_falls_back_to_the_cpu() -> None:
    reason = _no_gpu()
    assert isinstance(reason, str) and reason
    assert Device.best() == Device.cpu()
    with pytest.raises(CudaUnavailableError, match="CUDA device 0 is not usable: "):
        Device.cuda()


def test_device_module_prints_versions_and_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    reason = _no_gpu()
    assert device_main([]) == 1
    out = capsys.readouterr().out
    assert "cupy:" in out and f"no CUDA device: {reason}" in out


def test_the_reference_executor_has_no_profile() -> None:
    g = Graph()
    g.add_output(g.relu(g.input(Shape.of(2), DType.F32, "x")), "y")
    with pytest.raises(KnError, match="profiling times device steps"):
        Device.cpu(reference=True).prepare(g).profile([np.ones(2, np.float32)])
    rows = Device.cpu().prepare(g).profile([np.ones(2, np.float32)]).rows
    assert [r.kind for r in rows] == ["elementwise"]


def test_kn_run_cuda_without_a_gpu_is_one_clean_line(capsys: pytest.CaptureFixture[str]) -> None:
    _no_gpu()
    assert kn_run(["--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kn-run: error: CUDA device 0 is not usable")


def test_kn_run_profile_on_the_reference_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert kn_run(["--device", "cpu-reference", "--profile"]) == 0
    assert "--profile times device steps" in capsys.readouterr().err


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    """Executors built by kn_runtime run on a fake device (their launch lists registered)."""
    api = FakeApi()
    monkeypatch.setattr(executor_module, "default_api", lambda: api)

    def bind(p, settings=None):  # type: ignore[no-untyped-def]
        lst = calls.bind(p, settings)
        api.expect(lst)
        return lst

    monkeypatch.setattr(executor_module, "bind", bind)
    return api


def _batched() -> Graph:
    g = Graph()
    x = g.input(Shape.of(Size.sym("B"), 4), DType.F32, "x")
    w = g.constant(np.arange(20, dtype=np.float32).reshape(1, 4, 5) / 10)
    g.add_output(g.softmax(g.matmul(g.view(x, Shape.of(1, Size.sym("B"), 4)), w), 2), "y")
    return g


def test_cuda_prepared_graphs_keep_one_executor_per_binding(fake: FakeApi) -> None:
    g = _batched()
    prepared = Device("cuda", 0).prepare(g)
    assert isinstance(prepared, PreparedGraph) and not prepared.cache
    for b in (1, 3, 1):
        x = np.random.default_rng(b).standard_normal((b, 4)).astype(np.float32)
        want = Device.cpu().prepare(g).eval([x])[0]
        got = prepared.eval([x])[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert sorted(prepared.cache.keys(prepared.graph.id)) == [(("B", 1),), (("B", 3),)]
    prof = prepared.profile({"x": np.ones((3, 4), np.float32)})
    assert [r.kind for r in prof.rows] == ["matmul", "softmax"]
    with pytest.raises(InputMismatchError, match="expected dtype f32"):
        prepared.eval([np.ones((2, 4), np.float64)])


def test_cuda_prepared_graphs_keep_at_most_max_bindings_executors(fake: FakeApi) -> None:
    g = _batched()
    prepared = Device("cuda", 0).prepare(g, max_bindings=2)
    made = []
    for b in (1, 2, 3, 1):
        x = np.random.default_rng(b).standard_normal((b, 4)).astype(np.float32)
        want = Device.cpu(reference=True).prepare(g).eval([x])[0]
        np.testing.assert_allclose(prepared.eval([x])[0], want, rtol=1e-5, atol=1e-6)
        made.append(prepared.executor({"B": b}).executor)  # type: ignore[attr-defined]
    assert prepared.cache.keys(prepared.graph.id) == [(("B", 3),), (("B", 1),)]
    assert made[3] is not made[0]  # B=1 was evicted (and closed) by B=3, then made again
    assert not made[0]._open and made[3]._open


def test_a_fixed_batch_builds_the_executor_at_once(fake: FakeApi) -> None:
    g = _batched()
    prepared = Device("cuda", 0).prepare(g, batch_size=2)
    assert prepared.cache.keys(prepared.graph.id) == [(("B", 2),)]
    out = prepared.eval([np.ones((2, 4), np.float32)], return_device=True)[0]
    assert out.shape == (1, 2, 5) and np.allclose(out.get().sum(axis=2), 1)


def test_a_static_graph_builds_its_executor_at_once(fake: FakeApi) -> None:
    """Nothing left to bind: planned and compiled at prepare time, as on the CPU."""
    g = Graph()
    g.add_output(g.relu(g.input(Shape.of(2, 4), DType.F32, "x")), "y")
    prepared = Device("cuda", 0).prepare(g)
    assert prepared.cache.keys(prepared.graph.id) == [()]
    np.testing.assert_array_equal(prepared.eval([np.ones((2, 4), np.float32)])[0], 1)


def test_kn_run_on_the_fake_device(
    fake: FakeApi, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(Device, "best", staticmethod(lambda: Device("cuda", 0)))
    assert kn_run(["--profile", "--batch", "2"]) == 0
    out = capsys.readouterr().out
    assert (
        "device: cuda:0" in out and "difference from the CPU executor: max |d| / max |ref| =" in out
    )
    assert "profile on cuda:0 (Fake GPU)" in out and "by kind:" in out
    # kn-run times a few evaluations after the first: one CUDA graph captured, then replayed
    assert fake.captures <= 1


def test_data_dependent_graphs_run_in_segments_on_the_device(fake: FakeApi) -> None:
    """NonZero picks rows for a MatMul: a CUDA device runs the graph segment by segment, one
    executor per segment and binding of its run-time sizes, values staying on the device."""
    g = Graph()
    x = g.input(Shape.of(Size.sym("n"), 4), DType.F32, "x")
    n = g.fresh_symbol("nonzero")
    col = g.view(g.slice_raw(x, 1, 0, 1, 1), Shape.of(Size.sym("n")))
    (idx,) = g.dynamic("nonzero", [g.relu(col)], (), [Shape.of(1, n)], [DType.I64])
    rows = g.gather(x, 0, g.view(idx, Shape.of(n)))
    w = g.constant(np.arange(12, dtype=np.float32).reshape(1, 4, 3) / 7)
    g.add_output(g.matmul(g.view(rows, Shape.of(1, n, 4)), w), "y")
    prepared = Device("cuda", 0).prepare(g)
    rng = np.random.default_rng(4)
    six, eleven = (rng.standard_normal((n, 4)).astype(np.float32) for n in (6, 11))
    for xs in (six, eleven, six):
        want = Device.cpu().prepare(g).eval([xs])[0]
        got = prepared.eval([xs])[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # per binding: the mask segment (n) and the gathered MatMul's (n, nonzero0); six reuses both
    assert len(prepared.cache) == 4, len(prepared.cache)
