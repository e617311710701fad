"""Kyanite on PyTriton's real Triton server: the tiny ResNet (symbolic batch axis) answers
tritonclient's HTTP and gRPC requests as `Device.cpu()` evaluates each request alone, concurrent
requests under dynamic batching too; a wrong dtype or shape is a clear client-side error (Triton's
own check, or Kyanite's message for sizes only Kyanite can check), never a hang. One server for
the module; the NumPy-2 guard and the lazy import are checked without one."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

from kn_runtime.serve import load_model
from kn_runtime.serve import triton as kt
from kn_runtime.serve import triton_stub as tstub
from tests.kn_runtime.serve.support import (
    ATOL,
    RTOL,
    TINY,
    add_model,
    free_ports,
    row_sum_model,
    tiny_reference,
)
from tests.paths import ROOT

pytestmark = [
    pytest.mark.skipif(
        sys.platform != "linux", reason="PyTriton ships its Triton server for Linux only"
    ),
    pytest.mark.xdist_group("triton"),  # one worker: one server per module, not one per worker
]

MAX_BATCH = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A started server with the tiny ResNet bound as 'kyanite' and the add model as 'add'
    (symbolic width); always stopped. Yields (http_url, grpc_url, the batch sizes run_batch saw)."""
    http_port, grpc_port = free_ports(2)
    model = load_model(TINY, threads=1)
    seen: list[int] = []
    inner = model.run_batch

    def counted(requests, **kw):
        seen.append(len(requests))
        return inner(requests, **kw)

    model.run_batch = counted  # type: ignore[method-assign]
    add = load_model(add_model(tmp_path_factory.mktemp("add") / "add.onnx"))
    triton = kt.start(http_port=http_port, grpc_port=grpc_port, exit_timeout_s=5)
    try:
        kt.bind(triton, model, max_batch_size=MAX_BATCH, max_queue_delay_us=20_000)
        kt.bind(triton, add, name="add", max_batch_size=MAX_BATCH)
        row_sum = load_model(row_sum_model(tmp_path_factory.mktemp("rs") / "rs.onnx"))
        kt.bind(triton, row_sum, name="row_sum", max_batch_size=MAX_BATCH)
        yield f"localhost:{http_port}", f"localhost:{grpc_port}", seen
    finally:
        triton.stop()


def _client(server, protocol: str):
    if protocol == "http":
        import tritonclient.http as tc

        return tc, tc.InferenceServerClient(server[0], concurrency=4)
    import tritonclient.grpc as tc

    return tc, tc.InferenceServerClient(server[1])


def _infer(tc, client, x: np.ndarray, model: str = "kyanite", name: str = "input"):
    from tritonclient.utils import np_to_triton_dtype

    i = tc.InferInput(name, list(x.shape), np_to_triton_dtype(x.dtype))
    i.set_data_from_numpy(x)
    return client.infer(model, [i]).as_numpy("logits")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("rows", [1, 3])
def test_answers_equal_cpu_eval(server, protocol, rows) -> None:
    reference = tiny_reference()
    tc, client = _client(server, protocol)
    x = np.random.default_rng(rows).standard_normal((rows, 3, 64, 64)).astype(np.float32)
    with client:
        got = _infer(tc, client, x)
    np.testing.assert_allclose(got, reference(x), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_scalar_per_row_is_declared_one_wide(server, protocol) -> None:
    """Triton refuses empty dims: `s [batch]` and `y [batch]` are declared [1]; the client sends
    s as [rows, 1] and gets y as [rows, 1], the sums of its own rows."""
    tc, client = _client(server, protocol)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    s = rng.standard_normal((3, 1)).astype(np.float32)
    inputs = []
    for name, a in (("x", x), ("s", s)):
        i = tc.InferInput(name, list(a.shape), "FP32")
        i.set_data_from_numpy(a)
        inputs.append(i)
    with client:
        y = client.infer("row_sum", inputs).as_numpy("y")
    assert y.shape == (3, 1)
    np.testing.assert_allclose(y, x.sum(axis=1, keepdims=True) + s, rtol=1e-6, atol=1e-6)


def test_metadata_folds_the_batch_axis_into_max_batch_size(server) -> None:
    _, client = _client(server, "http")
    with client:
        meta = client.get_model_metadata("kyanite")
        config = client.get_model_config("kyanite")
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 64, 64]}]
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}]
    assert config["max_batch_size"] == MAX_BATCH
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 20_000


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_concurrent_requests_are_each_answered_right(server, protocol) -> None:
    """24 requests of 1-3 rows from 8 threads at once: Triton's dynamic batcher hands them over
    in groups (how many share a call is up to timing), each answer is its request's own."""
    reference = tiny_reference()
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((1 + i % 3, 3, 64, 64)).astype(np.float32) for i in range(24)]
    got: list[np.ndarray | BaseException | None] = [None] * len(xs)
    start = threading.Barrier(8)

    def worker(k: int) -> None:
        tc, client = _client(server, protocol)
        with client:
            start.wait()
            for i in range(k, len(xs), 8):
                try:
                    got[i] = _infer(tc, client, xs[i])
                except BaseException as exc:
                    got[i] = exc

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, y in zip(xs, got, strict=True):
        assert isinstance(y, np.ndarray), y
        np.testing.assert_allclose(y, reference(x), rtol=RTOL, atol=ATOL)
    print(f"requests per run_batch call so far: {server[2]}")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(
    ("x", "words"),
    [
        (np.zeros((1, 3, 64, 64), np.float64), ["'input'", "FP64", "FP32"]),
        (
            np.zeros((2, 3, 32, 32), np.float32),
            ["unexpected shape for input 'input'", "[-1,3,64,64]"],
        ),
        (np.zeros((MAX_BATCH + 1, 3, 64, 64), np.float32), [f"batch-size must be <= {MAX_BATCH}"]),
    ],
    ids=["dtype", "shape", "too-many-rows"],
)
def test_wrong_requests_are_clear_client_errors(server, protocol, x, words) -> None:
    """Triton checks dtypes, fixed sizes and the batch cap against the bound model before
    batching: the request fails alone, with a message naming the input."""
    from tritonclient.utils import InferenceServerException

    tc, client = _client(server, protocol)
    with client, pytest.raises(InferenceServerException) as e:
        _infer(tc, client, x)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_sizes_only_kyanite_checks_come_back_with_its_message(server, protocol) -> None:
    """Both inputs of the add model are `[batch, width]`: Triton lets a[1,3] + b[1,4] through
    (dims -1), Kyanite's check rejects it, the client gets Kyanite's message."""
    from tritonclient.utils import InferenceServerException

    tc, client = _client(server, protocol)
    a, b = np.ones((1, 3), np.float32), np.ones((1, 4), np.float32)
    ia, ib = tc.InferInput("a", [1, 3], "FP32"), tc.InferInput("b", [1, 4], "FP32")
    ia.set_data_from_numpy(a)
    ib.set_data_from_numpy(b)
    with client:
        with pytest.raises(InferenceServerException) as e:
            client.infer("add", [ia, ib])
        ib = tc.InferInput("b", [1, 3], "FP32")
        ib.set_data_from_numpy(2 * a)
        np.testing.assert_array_equal(client.infer("add", [ia, ib]).as_numpy("y"), 3 * a)
    assert "RequestError" in str(e.value) and "request 1 of 1" in str(e.value)
    assert "'b'" in str(e.value) or "'a'" in str(e.value), str(e.value)


def test_bind_refuses_a_server_whose_stub_would_read_zeros(monkeypatch) -> None:
    """Under NumPy 2 only a server `start` started (its stub on NumPy 1) is accepted."""
    monkeypatch.setattr(tstub, "_numpy2", lambda: True)
    with pytest.raises(kt.TritonUnavailableError, match="zeros"):
        kt.bind(object(), load_model(TINY))


def test_a_missing_stub_environment_says_how_to_make_one(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(tstub, "_numpy2", lambda: True)
    monkeypatch.delenv(kt.STUB_ENV_VAR, raising=False)
    with pytest.raises(kt.TritonUnavailableError) as e:
        tstub._stub_env(tmp_path / "none")
    assert "kn-serve triton-stub-env" in str(e.value)
    assert "numpy<2" in str(e.value)


def test_a_taken_port_fails_at_once() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(kt.TritonUnavailableError, match=f"http_port {port} is taken"):
            kt.start(http_port=port, grpc_port=free_ports(1)[0])


def test_engines_are_imported_only_when_used(monkeypatch) -> None:
    code = (
        "import sys, kn_runtime.serve, kn_runtime.serve.triton, kn_runtime.serve.repository\n"
        "print(sorted(m for m in ('pytriton', 'tritonclient') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
    monkeypatch.setitem(sys.modules, "pytriton.triton", None)
    with pytest.raises(kt.TritonUnavailableError, match=r"pip install 'kyanite\[serve-triton\]'"):
        kt._pytriton()
