"""Serving on Ray Serve and Triton: the HTTP path's overhead, what dynamic batching gains, what a second
replica gains; Kyanite and onnxruntime behind the same server code (`kn_runtime.serve`), side by
side in one run.

    .venv/bin/python benchmarks/serving.py [--cache /work/bigmodels] [--seconds 8] [-k resnet50]
        [--engine ray|triton|pytriton] [--ingress proxy|haproxy]

Replicas plan every batch size when they start (`--no-warmup`: they plan as sizes come).
Models: ResNet-50 (`.npy` bodies of one 224x224 image) and BERT-base (`.npz` bodies, one sequence
of 128 tokens) with random weights and a dynamic batch axis, exported once into the cache by
benchmarks/_serving_models.py under a venv with torch (`--torch-python`, default
/work/venv-fx/bin/python). Per model and runtime:
- `direct`: `BatchedModel.run` in this process, 1 thread: p50/p99 of one request, its calls
  taking turns with the `http c=1` requests;
- `http c=1`: one client, one replica of 1 thread, through Serve's HTTP proxy (`--ingress
  haproxy`: HAProxy to replicas that serve HTTP themselves): p50/p99; the overhead is its p50
  minus direct's, split by the replica's Server-Timing into `outside` (client, proxy, the
  server's HTTP parsing: latency minus the handler's phases) and `handler` (its read, decode,
  queue and encode: the phases besides the evaluation);
- `c=16 batched` / `c=16 unbatched`: 16 clients, one replica of 1 thread, `max_batch_size` 16
  (no wait: `--batch-wait-ms`) or 1: requests/s, counted after `--seconds` of the same load,
  and the batched replica's mean requests per evaluation (`rows`, from GET /metadata);
- `c=16 2 replicas`: 16 clients, two replicas of 1 thread each, batched: requests/s.
`--engine triton`: the same table through a Triton server: a model repository
(`write_repository`, Kyanite or onnxruntime inside the Python backend's stub) on the
`tritonserver` PyTriton bundles; `unbatched` is a model without dynamic batcher, `2 replicas` an
instance group of two. `--engine pytriton`: the model in this process bound through PyTriton
(`kn-serve --engine triton`), no `2 replicas`. Requests are KServe v2 binary bodies; `outside` /
`handler` there come from Triton's statistics extension: latency minus Triton's time for the
request, and Triton's time for the same body sent to a model that does almost nothing with it
minus that model's direct evaluation. Clients keep their connection alive
(http.client), each sends `--seconds` worth of requests after a warm-up. A local Ray instance with 2 CPUs; the clients, the proxy and the replicas share the
machine's cores, as they would on one node.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import io
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PORT = 8765
_TRITON_TYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}
MODELS = {"resnet50": "serve_resnet50.onnx", "bert_base": "serve_bert_base.onnx"}


def _body(name: str) -> tuple[bytes, str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    if name == "resnet50":
        x = rng.standard_normal((1, 3, 224, 224), dtype=np.float32)
        np.save(buf, x)
        return buf.getvalue(), "application/x-npy", {"input": x}
    ids = rng.integers(0, 30000, (1, 128), dtype=np.int64)
    inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    np.savez(buf, **inputs)
    return buf.getvalue(), "application/x-npz", inputs


Req = tuple[str, bytes, dict[str, str]]
"""A request as the client sends it: path, body, headers."""


def _ray_request(body: bytes, ctype: str) -> Req:
    return "/", body, {"Content-Type": ctype}


def _kserve_request(model: str, inputs: dict[str, np.ndarray], outputs: list[str]) -> Req:
    """KServe v2's binary tensor extension (what tritonclient sends with `binary_data=True`): a
    JSON header, then the tensors' bytes; outputs asked back as bytes."""
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": n,
                    "shape": list(a.shape),
                    "datatype": _TRITON_TYPES[a.dtype],
                    "parameters": {"binary_data_size": a.nbytes},
                }
                for n, a in inputs.items()
            ],
            "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in outputs],
        }
    ).encode()
    body = header + b"".join(np.ascontiguousarray(a).tobytes() for a in inputs.values())
    heads = {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }
    return f"/v2/models/{model}/infer", body, heads


def _post(conn: http.client.HTTPConnection, req: Req) -> float:
    return _post_timed(conn, req)[0]


def _post_timed(conn: http.client.HTTPConnection, req: Req) -> tuple[float, dict[str, float]]:
    """Seconds to the answer, and the replica's Server-Timing phases (seconds; Ray only)."""
    path, body, heads = req
    t = time.perf_counter()
    conn.request("POST", path, body, heads)
    r = conn.getresponse()
    data = r.read()
    took = time.perf_counter() - t
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {data[:300]!r}")
    phases = {}
    for item in (r.getheader("Server-Timing") or "").split(","):
        if ";dur=" in item:
            name, ms = item.strip().split(";dur=")
            phases[name] = float(ms) / 1e3
    return took, phases


def _served() -> dict[str, int]:
    """The replica's counts (GET /metadata: requests, batches, largest batch)."""
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
    try:
        conn.request("GET", "/metadata")
        return json.loads(conn.getresponse().read())["served"]
    finally:
        conn.close()


def _ready(req: Req, timeout: float = 60.0, port: int = PORT) -> None:
    """Wait until the application answers 200 (HAProxy takes the replicas up a moment after
    `serve.run` returns: 503 meanwhile; Triton loads its models)."""
    end = time.monotonic() + timeout
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            _post(conn, req)
            return
        except (OSError, RuntimeError):
            if time.monotonic() > end:
                raise
            time.sleep(0.2)
        finally:
            conn.close()


def _latency(
    req: Req,
    seconds: float,
    direct: object,
    inputs: dict[str, np.ndarray],
    port: int = PORT,
    server_time: Callable[[], float] | None = None,
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Seconds per request over HTTP and per direct `run` in this process, taking turns (the
    VM's speed drifts between runs minutes apart; the overhead is measured in one window); and
    per request, from its Server-Timing: the time outside the replica's handler (client,
    proxy, connection, the server's HTTP parsing) and the handler's own time besides the
    evaluation (read, decode, queue, encode). `server_time` (Triton), asked after each request,
    not timed: the server's own time for it; `outside` is the rest, `handler` that time."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    for _ in range(3):
        _post(conn, req)
    times: list[float] = []
    direct_times: list[float] = []
    outside: list[float] = []
    handler: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 20:
        took, phases = _post_timed(conn, req)
        times.append(took)
        if server_time is not None:
            inside = server_time()
            outside.append(took - inside)
            handler.append(inside)
        else:
            outside.append(took - sum(phases.values()))
            handler.append(sum(phases.values()) - phases.get("eval", 0.0))
        t = time.perf_counter()
        direct.run(inputs)  # type: ignore[attr-defined]
        direct_times.append(time.perf_counter() - t)
    conn.close()
    return times, direct_times, outside, handler


def _throughput(req: Req, seconds: float, clients: int = 16, port: int = PORT) -> float:
    """Requests per second of `clients` concurrent clients over `seconds`, after as long a load
    that is not counted: a batching replica meets a new batch size now and then for a while,
    and the first evaluation at a size plans and compiles (BERT-base at 16 rows: 2.5 s once), a
    cost a server pays once, not in its steady state."""
    done = [0] * clients
    start = threading.Barrier(clients + 1)
    stop = threading.Event()
    errors: list[BaseException] = []
    warm_until = time.perf_counter() + seconds

    def client(i: int) -> None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            _post(conn, req)  # warm: connection, replica, binding
            while time.perf_counter() < warm_until:  # and the batch sizes the load makes
                _post(conn, req)
            start.wait()
            while not stop.is_set():
                _post(conn, req)
                done[i] += 1
            conn.close()
        except BaseException as exc:
            errors.append(exc)
            start.abort()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(done) / (time.perf_counter() - t0)


def _pct(times: list[float], q: float) -> float:
    return float(np.percentile(np.array(times) * 1e3, q))


TRITON_PORT = PORT + 10
PROBE = "probe"
TRITON_MODELS = {"c=16 batched": "batched", "c=16 unbatched": "unbatched", "c=16 2 replicas": "two"}
"""Per row of the table, the model Triton serves it from (c=1 asks `batched`)."""


def _probe_model(path: Path, out: Path) -> Path:
    """A model with `path`'s inputs and almost no work (the mean of the first input per row):
    the time Triton spends on its requests, less its evaluation, is the handler's share of the
    overhead, which the big model's evaluation (80-300 ms, drifting by milliseconds from one
    call to the next here) hides."""
    import onnx
    from onnx import TensorProto, helper

    inputs = list(onnx.load(str(path), load_external_data=False).graph.input)
    rank = len(inputs[0].type.tensor_type.shape.dim)
    batch = inputs[0].type.tensor_type.shape.dim[0].dim_param or "batch"
    nodes = [
        helper.make_node("Cast", [inputs[0].name], ["f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMean", ["f"], ["probe"], axes=list(range(1, rank)), keepdims=0),
    ]
    y = helper.make_tensor_value_info("probe", TensorProto.FLOAT, [batch])
    model = helper.make_model(
        helper.make_graph(nodes, "probe", inputs, [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    onnx.save(model, out)
    return out


def _triton_stats(model: str) -> dict[str, int]:
    """Triton's statistics extension: requests, executions, and successful requests with their
    summed time in the server (from arrival to response, queue and backend included)."""
    conn = http.client.HTTPConnection("127.0.0.1", TRITON_PORT, timeout=60)
    try:
        conn.request("GET", f"/v2/models/{model}/stats")
        [m] = json.loads(conn.getresponse().read())["model_stats"]
    finally:
        conn.close()
    ok = m["inference_stats"]["success"]
    return {
        "requests": m["inference_count"],
        "batches": m["execution_count"],
        "n": ok["count"],
        "ns": ok["ns"],
    }


@contextlib.contextmanager
def _triton_server(
    engine: str, path: Path, probe: Path, runtime: str, warmup: bool | dict[str, int]
) -> Iterator[list[str]]:
    """A Triton server on TRITON_PORT with the models of TRITON_MODELS it can serve; yields
    their names. `triton`: a repository (`write_repository`, model.py running the model inside
    the Python backend's stub) on the bundled `tritonserver`: `batched` (dynamic batching, no
    wait), `unbatched` (no dynamic batcher: one request per execution), `two` (two instances
    of 1 thread). `pytriton`: `kn-serve --engine triton`'s way, the model in this process
    bound through PyTriton: `batched` and `unbatched` (max batch 1); PyTriton's instances share
    one model, so no `two`. Both serve `probe` too (`_probe_model`)."""
    if engine == "triton":  # and `probe` (_probe_model)
        from kn_runtime.serve.repository import write_repository
        from kn_runtime.serve.triton import launch_repository
        from kn_runtime.serve.triton_server import _stop

        repo = Path(tempfile.mkdtemp(prefix="kn-bench-repo-"))
        common = dict(copy_model=False, threads=1, runtime=runtime, warmup=warmup)
        write_repository(path, repo, name="batched", **common)
        write_repository(path, repo, name="unbatched", dynamic_batching=False, **common)
        write_repository(path, repo, name="two", instances=2, **common)
        write_repository(probe, repo, name=PROBE, copy_model=False, threads=1, runtime=runtime)
        with (repo / "server.log").open("wb") as log:
            proc = launch_repository(
                repo, http_port=TRITON_PORT, grpc_port=TRITON_PORT + 1, stdout=log
            )
        try:
            yield [*TRITON_MODELS.values(), PROBE]
        finally:
            _stop(proc)  # SIGINT, killed after 60 s
            shutil.rmtree(repo, ignore_errors=True)
        return
    from kn_runtime.serve import load_model
    from kn_runtime.serve.triton import bind, start

    triton = start(http_port=TRITON_PORT, grpc_port=TRITON_PORT + 1)
    try:
        model = load_model(path, threads=1, runtime=runtime, max_batch_size=16, warmup=warmup)
        bind(triton, model, name="batched", max_batch_size=16)
        bind(triton, model, name="unbatched", max_batch_size=1)
        bind(triton, load_model(probe, threads=1, runtime=runtime), name=PROBE)
        yield ["batched", "unbatched", PROBE]
    finally:
        triton.stop()


def _server_time(model: str) -> Callable[[], float]:
    """Seconds Triton spent on `model`'s requests since the last call (its statistics)."""
    last = [_triton_stats(model)["ns"]]

    def since() -> float:
        now = _triton_stats(model)["ns"]
        took, last[0] = (now - last[0]) / 1e9, now
        return took

    return since


def _triton_row(
    engine: str, path: Path, runtime: str, inputs: dict[str, np.ndarray], seconds: float,
    warmup: bool | dict[str, int],
) -> dict[str, float]:  # fmt: skip
    """The Ray table's row through Triton, with the same client (http.client, keep-alive, KServe
    v2 binary bodies). `outside`: p50 of each request's latency minus Triton's time for it (its
    statistics, asked after each request); `handler`: the same requests to `probe`, p50 of
    Triton's time for them minus the p50 of their direct evaluation (queue, the backend's stub,
    model.py and our checks besides the evaluation)."""
    from kn_runtime.serve import load_model

    row: dict[str, float] = {}
    direct = load_model(path, threads=1, runtime=runtime)
    for _ in range(3):
        direct.run(inputs)
    outputs = direct.output_names
    probe_path = _probe_model(path, Path(tempfile.mkdtemp(prefix="kn-bench-")) / "probe.onnx")
    with _triton_server(engine, path, probe_path, runtime, warmup) as names:
        for m in names:
            asked = ["probe"] if m == PROBE else outputs
            _ready(_kserve_request(m, inputs, asked), timeout=900, port=TRITON_PORT)
        req = _kserve_request("batched", inputs, outputs)
        times, direct_times, outside, _ = _latency(
            req, seconds, direct, inputs, port=TRITON_PORT, server_time=_server_time("batched")
        )
        del direct
        row["http p50"], row["http p99"] = _pct(times, 50), _pct(times, 99)
        row["direct p50"], row["direct p99"] = _pct(direct_times, 50), _pct(direct_times, 99)
        row["outside"] = _pct(outside[1:], 50)  # the first holds the warm-up requests too
        probe = load_model(probe_path, threads=1)
        _, probe_times, _, inside = _latency(
            _kserve_request(PROBE, inputs, ["probe"]),
            min(seconds, 3.0),
            probe,
            inputs,
            port=TRITON_PORT,
            server_time=_server_time(PROBE),
        )
        row["handler"] = _pct(inside[1:], 50) - _pct(probe_times, 50)
        for label, m in TRITON_MODELS.items():
            if m not in names:
                row[label] = row[label + " rows"] = float("nan")
                continue
            before = _triton_stats(m)
            row[label] = _throughput(_kserve_request(m, inputs, outputs), seconds, port=TRITON_PORT)
            after = _triton_stats(m)
            row[label + " rows"] = (after["requests"] - before["requests"]) / max(
                1, after["batches"] - before["batches"]
            )
            print(f"{path.name} {runtime} {label} done", file=sys.stderr, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=Path("/work/bigmodels"))
    ap.add_argument("--torch-python", type=Path, default=Path("/work/venv-fx/bin/python"))
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("-k", dest="only", action="append", choices=list(MODELS))
    ap.add_argument("--engine", choices=["ray", "triton", "pytriton"], default="ray")
    ap.add_argument("--runtime", action="append", choices=["kyanite", "onnxruntime"])
    ap.add_argument(
        "--batch-wait-ms", type=float, default=0.0, help="batch_wait_timeout_s of the replicas"
    )
    ap.add_argument(
        "--ingress", choices=["proxy", "haproxy"], default="proxy", help="how HTTP reaches Serve"
    )
    ap.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="replicas plan every batch size when they start (default on)",
    )
    args = ap.parse_args()
    if not all((args.cache / f).exists() for f in MODELS.values()):
        print("exporting the models ...", flush=True)
        subprocess.run(
            [str(args.torch_python), str(ROOT / "benchmarks" / "_serving_models.py"), args.cache],
            check=True,
        )
    if args.engine != "ray":
        rows = []
        for name in args.only or list(MODELS):
            warmup = args.warmup and ({"seq": 128} if name == "bert_base" else True)
            for runtime in args.runtime or ("kyanite", "onnxruntime"):
                row = _triton_row(
                    args.engine, args.cache / MODELS[name], runtime, _body(name)[2],
                    args.seconds, warmup,
                )  # fmt: skip
                rows.append((name, runtime, row))
        _table(rows, f"engine: {args.engine} (outside / handler: from Triton's statistics)")
        return
    import ray
    from ray import serve

    from kn_runtime.serve import load_model
    from kn_runtime.serve.ray_serve import deployment, use_ingress

    use_ingress(args.ingress)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    rows = []
    try:
        for name in args.only or list(MODELS):
            path = args.cache / MODELS[name]
            body, ctype, inputs = _body(name)
            req = _ray_request(body, ctype)
            for runtime in args.runtime or ("kyanite", "onnxruntime"):
                row: dict[str, float] = {}
                direct = load_model(path, threads=1, runtime=runtime)
                for _ in range(3):
                    direct.run(inputs)
                for label, replicas, batch in (
                    ("c=1", 1, 16),
                    ("c=16 unbatched", 1, 1),
                    ("c=16 batched", 1, 16),
                    ("c=16 2 replicas", 2, 16),
                ):
                    app = deployment(
                        path,
                        num_replicas=replicas,
                        ray_actor_options={"num_cpus": 0.5},
                        threads=1,
                        max_batch_size=batch,
                        batch_wait_timeout_s=args.batch_wait_ms / 1000,
                        runtime=runtime,
                        warmup=args.warmup and ({"seq": 128} if name == "bert_base" else True),
                    )
                    serve.run(app, route_prefix="/", name="bench")
                    _ready(req)
                    if label == "c=1":  # direct calls and requests take turns: same conditions
                        times, direct_times, outside, handler = _latency(
                            req, args.seconds, direct, inputs
                        )
                        row["http p50"], row["http p99"] = _pct(times, 50), _pct(times, 99)
                        row["direct p50"] = _pct(direct_times, 50)
                        row["direct p99"] = _pct(direct_times, 99)
                        row["outside"], row["handler"] = _pct(outside, 50), _pct(handler, 50)
                        del direct
                    else:
                        before = _served()
                        row[label] = _throughput(req, args.seconds)
                        if replicas == 1:  # /metadata answers from the one replica
                            after = _served()
                            row[label + " rows"] = (after["requests"] - before["requests"]) / max(
                                1, after["batches"] - before["batches"]
                            )
                    serve.delete("bench")
                    print(f"{name} {runtime} {label} done", file=sys.stderr, flush=True)
                rows.append((name, runtime, row))
    finally:
        serve.shutdown()
        ray.shutdown()
    _table(rows, f"ingress: {args.ingress}, warm-up: {args.warmup}")


def _table(rows: list[tuple[str, str, dict[str, float]]], title: str) -> None:
    print(f"\n{title}")
    print(
        "\n| model | runtime | direct p50/p99 ms | HTTP c=1 p50/p99 ms | overhead p50 ms "
        "| outside / handler p50 ms | c=16 unbatched req/s | c=16 batched req/s (rows) "
        "| batching gain | 2 replicas req/s | replica gain |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, runtime, r in rows:
        print(
            f"| {name} | {runtime} | {r['direct p50']:.1f} / {r['direct p99']:.1f} "
            f"| {r['http p50']:.1f} / {r['http p99']:.1f} | {r['http p50'] - r['direct p50']:.2f} "
            f"| {r['outside']:.2f} / {r['handler']:.2f} "
            f"| {r['c=16 unbatched']:.1f} | {r['c=16 batched']:.1f} "
            f"({r['c=16 batched rows']:.1f}) "
            f"| {r['c=16 batched'] / r['c=16 unbatched']:.2f}x | {r['c=16 2 replicas']:.1f} "
            f"| {r['c=16 2 replicas'] / r['c=16 batched']:.2f}x |"
        )
    for name in {n for n, _, _ in rows}:
        ours = next((r for n, rt, r in rows if n == name and rt == "kyanite"), None)
        peer = next((r for n, rt, r in rows if n == name and rt == "onnxruntime"), None)
        if ours is None or peer is None:
            continue
        ratio = statistics.geometric_mean(
            [ours["c=16 batched"] / peer["c=16 batched"], peer["http p50"] / ours["http p50"]]
        )
        print(
            f"{name}: kyanite/onnxruntime speed (geomean of batched throughput, c=1): {ratio:.2f}"
        )


if __name__ == "__main__":
    main()
