"""`Device.cpu()`: the planner's plan run on the host (kn_cuda_eval.cpu), through the public
API, against the reference executor `Device.cpu(reference=True)` — plain fixtures,
data-dependent ones (segments), two bindings each — plus its arguments and kn-run's
`--device cpu` / `cpu-reference`."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph.errors import ArgumentTypeError, ArgumentValueError
from kn_graph.optimizer import optimize
from kn_runtime import Device, PreparedGraph
from kn_runtime.backend import HostBackend
from kn_runtime.cli import main as kn_run
from tests.kn_cuda_eval.corpus import cases
from tests.kn_cuda_eval.helpers import assert_close


@pytest.mark.parametrize("name", ["resnet_hw_dynamo", "gpt2_ts", "yolo_nms", "loop_decode"])
def test_fast_cpu_matches_the_reference(name: str) -> None:
    prepared: dict[int, PreparedGraph] = {}
    for graph, feed, _ in cases(name):
        g = optimize(graph)
        p = prepared.setdefault(id(g), Device.cpu(threads=2).prepare(g))
        assert isinstance(p.backend, HostBackend)
        want = Device.cpu(reference=True).prepare(graph).eval(feed)
        for k, (a, b) in enumerate(zip(p.eval(feed), want, strict=True)):
            assert_close(a, b, f"{name} output {k}")


def test_fast_cpu_arguments() -> None:
    assert Device.cpu() == Device("cpu") == Device.cpu(fast=True) and Device.cpu().fast
    assert Device.cpu(reference=True) == Device.cpu(fast=False) and not Device.cpu(fast=False).fast
    assert Device.best() == Device.cpu()  # no GPU in CI
    assert str(Device.cpu()) == "cpu (plan on the host)"
    assert str(Device.cpu(reference=True)) == "cpu (reference executor)"
    assert isinstance(Device.cpu().prepare(cases("gpt2_ts")[0][0]).backend, HostBackend)
    with pytest.raises(ArgumentTypeError, match="threads must be an int"):
        Device.cpu(threads="2")  # type: ignore[arg-type]
    with pytest.raises(ArgumentValueError, match="threads must be >= 1"):
        Device.cpu(0)
    with pytest.raises(ArgumentValueError, match="contradict"):
        Device.cpu(fast=True, reference=True)


def test_kn_run_on_the_fast_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert kn_run(["--device", "cpu", "--threads", "1", "--profile"]) == 0
    out = capsys.readouterr().out
    assert "device: cpu (plan on the host)" in out
    assert "difference from the CPU executor: max |d| / max |ref| =" in out
    diff = float(out.split("max |d| / max |ref| = ")[1].split()[0])
    assert diff < 1e-4
    assert "by kind:" in out and "conv" in out
    assert np.isfinite(diff)
