"""`write_repository`: its config.pbtxt parses with Triton's own schema (tritonclient's
`model_config_pb2`) and says what the graph says; the written repository loads in the
`tritonserver` PyTriton bundles (Python backend, Kyanite inside the backend's stub) and answers
HTTP and gRPC requests as `Device.cpu()` evaluates each alone, concurrent ones too; a request
only Kyanite can reject fails alone, with Kyanite's message. One server for the module."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from kn_graph.errors import ArgumentValueError
from kn_runtime.serve import load_model
from kn_runtime.serve.repository import config_text, write_repository
from kn_runtime.serve.triton import launch_repository
from kn_runtime.serve.triton_server import _stop
from tests.kn_runtime.serve.support import (
    ATOL,
    RTOL,
    TINY,
    add_model,
    cli_command,
    free_ports,
    stop_by_ctrl_c,
    tiny_reference,
    wait_ready,
)
from tests.paths import ROOT

pytestmark = [
    pytest.mark.skipif(
        sys.platform != "linux", reason="PyTriton ships its Triton server for Linux only"
    ),
    pytest.mark.xdist_group("triton"),  # one worker: one server per module, not one per worker
]


def _parse(text: str):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _type(t) -> str:
    from tritonclient.grpc import model_config_pb2

    return model_config_pb2.DataType.Name(t.data_type)


def test_config_parses_with_tritons_schema(tmp_path) -> None:
    folder = write_repository(TINY, tmp_path, max_batch_size=8, instances=2, threads=2)
    config = _parse((folder / "config.pbtxt").read_text())
    assert (config.name, config.backend, config.max_batch_size) == ("kyanite", "python", 8)
    [i], [o] = config.input, config.output
    assert (i.name, _type(i), list(i.dims)) == ("input", "TYPE_FP32", [3, 64, 64])
    assert (o.name, _type(o), list(o.dims)) == ("logits", "TYPE_FP32", [10])
    # no wait by default (Triton's own default): a lone request would pay it
    assert config.dynamic_batching.max_queue_delay_microseconds == 0
    [group] = config.instance_group
    assert (group.count, group.kind) == (2, group.KIND_CPU)
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params == {
        "kyanite_model": "model.onnx",
        "kyanite_device": "cpu",
        "kyanite_threads": "2",
    }
    assert (folder / "1" / "model.onnx").read_bytes() == TINY.read_bytes()
    assert (
        "from kn_runtime.serve.repository import TritonPythonModel"
        in (folder / "1" / "model.py").read_text()
    )


def test_a_model_without_batch_axis_gets_its_full_shapes(tmp_path) -> None:
    """Axis 0 fixed (2): requests cannot be concatenated; max_batch_size 0, no dynamic batching,
    the symbolic axis -1."""
    x = helper.make_tensor_value_info("x", TensorProto.INT64, [2, "width"])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [2, "width"])
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"])], "neg", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "neg.onnx")
    config = _parse(config_text(load_model(tmp_path / "neg.onnx"), kind="KIND_GPU"))
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert [list(t.dims) for t in (*config.input, *config.output)] == [[2, -1], [2, -1]]
    assert [_type(t) for t in (*config.input, *config.output)] == ["TYPE_INT64"] * 2
    assert config.instance_group[0].kind == config.instance_group[0].KIND_GPU


def test_external_data_is_copied_beside_the_model(tmp_path) -> None:
    model = onnx.load(str(TINY))
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(
        model, src / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0
    )
    folder = write_repository(src / "m.onnx", tmp_path / "repo")
    assert (folder / "1" / "m.data").read_bytes() == (src / "m.data").read_bytes()
    x = np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)
    got = load_model(folder / "1" / "model.onnx").run({"input": x})["logits"]
    np.testing.assert_allclose(got, tiny_reference()(x), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("kwargs", "want"),
    [
        ({}, {"max_batch_size": 8, "runtime": "kyanite", "warmup": False, "threads": 1}),
        (
            {"runtime": "onnxruntime", "warmup": True, "threads": None},
            {"max_batch_size": 8, "runtime": "onnxruntime", "warmup": True, "threads": None},
        ),
        (
            {"warmup": {"seq": 128, "past_len": 0}, "threads": 3},
            {"max_batch_size": 8, "warmup": {"seq": 128, "past_len": 0}, "threads": 3},
        ),
    ],
)
def test_model_py_loads_what_the_repository_says(tmp_path, monkeypatch, kwargs, want) -> None:
    """`TritonPythonModel.initialize` reads config.pbtxt as Triton hands it over (the config as
    JSON with the schema's field names) and loads the model with its batch cap (executors kept
    per batch size), runtime, warm-up and threads."""
    import json
    import types

    from google.protobuf import json_format

    from kn_runtime.serve import loading
    from kn_runtime.serve.repository import TritonPythonModel

    folder = write_repository(TINY, tmp_path, max_batch_size=8, **kwargs)
    config = _parse((folder / "config.pbtxt").read_text())
    seen = {}
    monkeypatch.setattr(loading, "load_model", lambda path, **kw: seen.update(kw, path=path))
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("pb"))
    args = {
        "model_config": json.dumps(
            json_format.MessageToDict(config, preserving_proto_field_name=True)
        ),
        "model_repository": str(folder),
        "model_version": "1",
    }
    TritonPythonModel().initialize(args)
    assert seen["path"] == folder / "1" / "model.onnx"
    assert {k: seen[k] for k in want} == want
    assert seen["device"] == "cpu"


def test_gpus_place_the_instances(tmp_path) -> None:
    folder = write_repository(TINY, tmp_path, kind="KIND_GPU", instances=2, gpus=[1])
    [group] = _parse((folder / "config.pbtxt").read_text()).instance_group
    assert (group.count, group.kind, list(group.gpus)) == (2, group.KIND_GPU, [1])


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"name": "a/b"}, "name: expected letters"),
        ({"gpus": [0]}, "gpus: only with kind KIND_GPU, found kind KIND_CPU"),
        ({"gpus": [-1], "kind": "KIND_GPU"}, "gpus: expected GPU indices >= 0, found [-1]"),
        ({"runtime": "tvm"}, "runtime: expected kyanite or onnxruntime, found 'tvm'"),
        ({"warmup": {"seq": -1}}, "warmup['seq']: expected a size >= 0, found -1"),
        ({"warmup": {"a,b": 1}}, "warmup: expected symbol names, found 'a,b'"),
        ({"warmup": 3}, "warmup: expected True, False or {symbol: size}, found 3"),
        ({"max_batch_size": 0}, "max_batch_size: expected a positive int"),
        ({"kind": "KIND_TPU"}, "kind: expected KIND_CPU or KIND_GPU"),
    ],
)
def test_bad_arguments_are_clear_errors(tmp_path, kwargs, words) -> None:
    with pytest.raises(ArgumentValueError, match=re.escape(words)):
        write_repository(TINY, tmp_path, **kwargs)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The bundled tritonserver on a repository of the tiny ResNet ('kyanite') and the add model
    ('add'), the stub importing this checkout; always stopped. Yields (http_url, grpc_url)."""
    repo = tmp_path_factory.mktemp("repo")
    write_repository(TINY, repo, max_batch_size=8, max_queue_delay_us=20_000, python_path=ROOT)
    add = add_model(tmp_path_factory.mktemp("add") / "add.onnx")
    write_repository(add, repo, name="add", max_batch_size=8, max_queue_delay_us=20_000,
                     python_path=ROOT)  # fmt: skip
    http_port, grpc_port = free_ports(2)
    log = repo / "server.log"
    with log.open("wb") as out:
        proc = launch_repository(
            repo, http_port=http_port, grpc_port=grpc_port, exit_timeout_s=5, stdout=out
        )
    try:
        import tritonclient.http as th

        with th.InferenceServerClient(f"localhost:{http_port}") as client:
            for name in ("kyanite", "add"):
                wait_ready(client, name, lambda: proc.poll() is None, log=log)
        yield f"localhost:{http_port}", f"localhost:{grpc_port}"
    finally:
        _stop(proc)  # SIGINT, killed after 60 s


def _client(server, protocol: str):
    if protocol == "http":
        import tritonclient.http as tc

        return tc, tc.InferenceServerClient(server[0])
    import tritonclient.grpc as tc

    return tc, tc.InferenceServerClient(server[1])


def _inputs(tc, **arrays: np.ndarray) -> list:
    out = []
    for name, a in arrays.items():
        i = tc.InferInput(name, list(a.shape), "FP32")
        i.set_data_from_numpy(a)
        out.append(i)
    return out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_repository_answers_equal_cpu_eval(server, protocol) -> None:
    reference = tiny_reference()
    tc, client = _client(server, protocol)
    x = np.random.default_rng(3).standard_normal((3, 3, 64, 64)).astype(np.float32)
    with client:
        got = client.infer("kyanite", _inputs(tc, input=x)).as_numpy("logits")
    np.testing.assert_allclose(got, reference(x), rtol=RTOL, atol=ATOL)


def test_concurrent_requests_one_bad_fails_alone(server) -> None:
    """16 requests at once to the add model, every fourth with b one column wider than a (Triton
    passes it, dims -1): the dynamic batcher may put them in one `execute`; the bad ones get
    Kyanite's message, the others their sums."""
    from tritonclient.utils import InferenceServerException

    rng = np.random.default_rng(5)
    cases = []
    for i in range(16):
        a = rng.standard_normal((1 + i % 2, 3)).astype(np.float32)
        b = rng.standard_normal((1 + i % 2, 4 if i % 4 == 3 else 3)).astype(np.float32)
        cases.append((a, b))
    got: list = [None] * len(cases)
    start = threading.Barrier(len(cases))

    def worker(i: int) -> None:
        tc, client = _client(server, "http" if i % 2 else "grpc")
        a, b = cases[i]
        with client:
            start.wait()
            try:
                got[i] = client.infer("add", _inputs(tc, a=a, b=b)).as_numpy("y")
            except InferenceServerException as exc:
                got[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, ((a, b), y) in enumerate(zip(cases, got, strict=True)):
        if i % 4 == 3:
            assert isinstance(y, InferenceServerException), y
            assert "input 'b', axis 1" in str(y) and "found 4" in str(y), str(y)
        else:
            assert isinstance(y, np.ndarray), y
            np.testing.assert_array_equal(y, a + b)
    import tritonclient.http as th

    with th.InferenceServerClient(server[0]) as client:
        [stats] = client.get_inference_statistics("add")["model_stats"]
    print(f"add: {stats['inference_count']} requests in {stats['execution_count']} executions")


def test_repository_rejects_a_wrong_dtype_clearly(server) -> None:
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    x = np.zeros((1, 3, 64, 64), np.float64)
    i = th.InferInput("input", list(x.shape), "FP64")
    i.set_data_from_numpy(x)
    with (
        th.InferenceServerClient(server[0]) as client,
        pytest.raises(
            InferenceServerException,
            match="'input' data-type is 'FP64', but model 'kyanite' expects 'FP32'",
        ),
    ):
        client.infer("kyanite", [i])


def test_kn_serve_triton_runs_the_model_inside_the_server(tmp_path) -> None:
    """`kn-serve model.onnx --engine triton --replicas 2` as a user starts it: a repository on
    the bundled server with an instance group of two, answers equal to `Device.cpu()` over HTTP
    and gRPC, Ctrl-C stops it and the server with it (its ports are free again)."""
    import time

    import tritonclient.http as th

    from kn_runtime.serve.triton_server import _check_ports

    http_port, grpc_port = free_ports(2)
    cmd = cli_command("kn_runtime.serve.cli", str(TINY), "--engine", "triton", "--replicas", "2")
    cmd += ["--port", str(http_port), "--grpc-port", str(grpc_port), "--warmup"]
    log = tmp_path / "kn-serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        client = th.InferenceServerClient(f"localhost:{http_port}")
        wait_ready(client, "kyanite", lambda: proc.poll() is None, log=log)
        deadline = time.monotonic() + 30  # the log line follows the readiness kn-serve polls
        while "inside Triton" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "serving" in log.read_text() and "inside Triton" in log.read_text()
        [group] = client.get_model_config("kyanite")["instance_group"]
        assert group["count"] == 2 and group["kind"] == "KIND_CPU"
        client.close()
        x = np.random.default_rng(4).standard_normal((2, 3, 64, 64)).astype(np.float32)
        for protocol in ("http", "grpc"):
            tc, client = _client((f"localhost:{http_port}", f"localhost:{grpc_port}"), protocol)
            with client:
                got = client.infer("kyanite", _inputs(tc, input=x)).as_numpy("logits")
            np.testing.assert_allclose(got, tiny_reference()(x), rtol=RTOL, atol=ATOL)
    finally:
        code = stop_by_ctrl_c(proc, 90, log.read_text)
    assert code in (0, 130), log.read_text()[-3000:]
    _check_ports({"http": http_port, "grpc": grpc_port})  # raises while a server holds them


def test_a_server_that_exits_before_ready_is_an_error_with_its_log(tmp_path) -> None:
    from kn_runtime.serve.triton_server import TritonUnavailableError, _wait_ready

    server_log = tmp_path / "log"
    server_log.write_text("E1204 model 'kyanite' failed to load: no such backend\n")
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(TritonUnavailableError, match="status 3 before 'kyanite' was ready") as e:
        _wait_ready(proc, free_ports(1)[0], "kyanite", server_log, 60)
    assert "failed to load: no such backend" in str(e.value)


def test_bad_bodies_get_statuses_and_a_stalled_client_blocks_no_one(server) -> None:
    """Raw HTTP against the repository's server: malformed JSON, a batch over max_batch_size
    (8 rows of the 16 MB kind the cap exists for) and a binary body shorter than its header
    says are refused with an error status at once; a client that stalls halfway through its
    body does not hold up another's request."""
    import http.client
    import json
    import socket

    host, port = server[0].split(":")
    x = np.random.default_rng(8).standard_normal((1, 3, 64, 64)).astype(np.float32)

    def binary(a: np.ndarray, cut: int = 0) -> tuple[bytes, dict[str, str]]:
        head = {"name": "input", "shape": list(a.shape), "datatype": "FP32"}
        header = json.dumps({"inputs": [{**head, "parameters": {"binary_data_size": a.nbytes}}]})
        body = header.encode() + a.tobytes()[: a.nbytes - cut]
        return body, {"Inference-Header-Content-Length": str(len(header))}

    def post(body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            conn.request("POST", "/v2/models/kyanite/infer", body, headers or {})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    status, text = post(b'{"inputs": [ {"name": ')
    assert status in (400, 500) and b"parse the request JSON" in text, text
    status, text = post(*binary(np.zeros((9, 3, 64, 64), np.float32)))
    assert status == 400 and b"batch-size must be <= 8" in text, text
    status, text = post(*binary(x, cut=100))
    assert status == 400 and b"expecting" in text, text
    body, headers = binary(x)
    stalled = socket.create_connection((host, int(port)))
    try:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        stalled.sendall(
            f"POST /v2/models/kyanite/infer HTTP/1.1\r\nHost: x\r\n{head}"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[: len(body) // 2]
        )
        status, text = post(body, headers)
        assert status == 200, text
        [out] = json.loads(text)["outputs"]
        np.testing.assert_allclose(
            np.array(out["data"], np.float32).reshape(out["shape"]),
            tiny_reference()(x),
            rtol=RTOL,
            atol=ATOL,
        )
    finally:
        stalled.close()


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux's /proc children lists)."""
    from pathlib import Path

    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
        for kid in kids:
            found += [kid, *_descendants(kid)]
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_an_instance_killed_mid_request_fails_that_request_and_is_served_again(tmp_path) -> None:
    """An instance killed while it evaluates: its request gets an error (Triton 2.51's 500, or
    the connection closing), not a hang; Triton cannot restart the instance (the server
    crashes), so `kn-serve` starts the server again and the model answers right after."""
    import os
    import time

    import tritonclient.http as th
    from onnx import numpy_helper

    eye = numpy_helper.from_array(np.eye(1024, dtype=np.float32), "w")
    nodes = [helper.make_node("MatMul", [f"m{i}", "w"], [f"m{i + 1}"]) for i in range(32)]
    x_info = helper.make_tensor_value_info("m0", TensorProto.FLOAT, ["batch", 1024])
    y_info = helper.make_tensor_value_info("m32", TensorProto.FLOAT, ["batch", 1024])
    graph = helper.make_graph(nodes, "slow", [x_info], [y_info], [eye])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "slow.onnx")  # fmt: skip
    http_port, grpc_port = free_ports(2)
    cmd = cli_command("kn_runtime.serve.cli", str(tmp_path / "slow.onnx"), "--engine", "triton")
    cmd += ["--port", str(http_port), "--grpc-port", str(grpc_port), "--max-batch-size", "4096"]
    log = tmp_path / "kn-serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)

    def infer(x: np.ndarray) -> np.ndarray:
        with th.InferenceServerClient(f"localhost:{http_port}", network_timeout=120) as client:
            i = th.InferInput("m0", list(x.shape), "FP32")
            i.set_data_from_numpy(x)
            return client.infer("kyanite", [i]).as_numpy("m32")

    try:
        with th.InferenceServerClient(f"localhost:{http_port}") as client:
            wait_ready(client, "kyanite", lambda: proc.poll() is None, log=log)
        big = np.random.default_rng(6).standard_normal((4096, 1024)).astype(np.float32)
        got: list = []
        flight = threading.Thread(target=lambda: got.append(_outcome(infer, big)))
        flight.start()
        time.sleep(0.5)  # sent (16 MB) and evaluating: 32 GEMMs of 4096x1024x1024, seconds
        stubs = [p for p in _descendants(proc.pid) if "triton_python_backend_stub" in _cmdline(p)]
        assert stubs, log.read_text()[-3000:]
        for pid in stubs:
            os.kill(pid, signal.SIGKILL)
        flight.join(timeout=90)
        assert not flight.is_alive(), "the request of the killed instance hangs"
        [outcome] = got
        assert isinstance(outcome, Exception), outcome  # Triton's 500, or the connection closed
        x = big[:3]
        deadline = time.monotonic() + 180
        while True:  # connection refused while kn-serve starts the server again
            try:
                np.testing.assert_array_equal(infer(x), x)
                break
            except Exception:  # refused, closed (geventhttpclient's own), 503 while loading
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
        assert "starting it again" in log.read_text()
    finally:
        code = stop_by_ctrl_c(proc, 90, log.read_text)
    assert code in (0, 130), log.read_text()[-3000:]


def _outcome(call, *args):
    try:
        return call(*args)
    except Exception as exc:  # the outcome the test inspects
        return exc
