"""What the serving tests share: free ports, a tiny two-input model whose sizes Triton cannot
check (both inputs `[batch, width]`, width symbolic), the reference answers."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from kn_graph.onnx import load_onnx
from kn_runtime import Device
from tests.paths import ROOT

TINY = ROOT / "kn_runtime" / "models" / "resnet_tiny.onnx"
RTOL, ATOL = 1e-4, 1e-5
"""A dynamic batch may take another blocking of the same convolution than one request alone:
float32 sums in another order, a few ulps apart (as in test_batching)."""


def free_ports(n: int) -> list[int]:
    """n ports nobody listens on now (bound to port 0 together, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def cli_command(module: str, *args: str) -> list[str]:
    """`python -m module args` that takes Ctrl-C as a terminal's user does and dumps every
    thread's stack on SIGUSR1 (`stop_by_ctrl_c` sends it when Ctrl-C does not stop the process).

    SIGINT is given back Python's handler: a test run started in the background of a
    non-interactive shell (`cmd &`, as a CI script may) ignores SIGINT, children inherit that,
    and Python leaves an ignored SIGINT ignored — the server then never saw the test's Ctrl-C
    (found by this function's /proc report: SigIgn had bit 2 set in pytest and the server)."""
    boot = (
        "import faulthandler, runpy, signal, sys; "
        "signal.signal(signal.SIGINT, signal.default_int_handler); "
        "faulthandler.register(signal.SIGUSR1, all_threads=True); "
        f"sys.argv[0] = {module!r}; runpy.run_module({module!r}, run_name='__main__')"
    )
    return [sys.executable, "-c", boot, *args]


def _signals(pid: int) -> str:
    """The process's state and signal masks (/proc), for a failure message."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as e:
        return f"(no /proc status: {e})"
    keep = ("State", "Threads", "SigBlk", "SigIgn", "SigCgt", "SigPnd", "ShdPnd")
    return "; ".join(line.replace("\t", " ") for line in lines if line.startswith(keep))


def stop_by_ctrl_c(proc: subprocess.Popen, timeout: float, output: Callable[[], str]) -> int:  # type: ignore[type-arg]
    """Send SIGINT and return the exit status; a process still running after `timeout` fails
    the test with its signal state, its threads' stacks (SIGUSR1: `cli_command`) and the end of
    its `output()`, then is killed."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        state = _signals(proc.pid)
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(2)
        proc.kill()
        proc.wait()
        raise AssertionError(
            f"still running {timeout:g} s after Ctrl-C; {state}; parent: {_signals(os.getpid())}"
            f"\n{output()[-12000:]}"
        ) from None


def add_model(path: Path) -> Path:
    """`y = a + b` over `[batch, width]` float32: Triton sees `dims: [-1]` for both inputs, so requests
    whose widths differ reach Kyanite, which rejects them."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", "width"])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", "width"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "width"])
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "add", [a, b], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def row_sum_model(path: Path) -> Path:
    """`y = sum(x, axis 1) + s` with `x [batch, width]`, `s [batch]`, `y [batch]`: a scalar per
    row in and out, which Triton cannot declare with empty dims."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "width"])
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, ["batch"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["r"], keepdims=0, axes=[1]),
        helper.make_node("Add", ["r", "s"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "row_sum", [x, s], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@functools.cache
def tiny_reference() -> Callable[[np.ndarray], np.ndarray]:
    """The tiny ResNet's logits for one request, evaluated alone on Device.cpu()."""
    prepared = Device.cpu().prepare(load_onnx(str(TINY)))
    return lambda x: prepared.eval([x])[0]


def wait_ready(
    client, model: str, alive: Callable[[], bool], timeout_s: float = 120, log: Path | None = None
) -> None:
    """Until the server says `model` is ready; AssertionError (with the end of the server's
    `log`) when the server died or never got there: a guard against hanging, not a timing."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            break
        try:
            if client.is_model_ready(model):
                return
        except Exception:
            pass
        time.sleep(0.05)
    tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
    state = "running" if alive() else "exited"
    raise AssertionError(f"model '{model}' not ready (server {state}); its log ends:\n{tail}")
