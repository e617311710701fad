"""Serving on Ray Serve: the HTTP path's overhead, what dynamic batching gains, what a second
replica gains; Kyanite and onnxruntime behind the same server code (`kn_runtime.serve`), side by
side in one run.

    .venv/bin/python benchmarks/serving.py [--cache /work/bigmodels] [--seconds 8] [-k resnet50]
        [--engine ray|triton] [--ingress proxy|haproxy]

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
`--engine triton`: PyTriton's Triton server over HTTP (tritonclient), c=1 latency and c=16
requests/s with dynamic batching (max batch 16), per runtime; compare its c=1 p50 with the Ray
run's direct p50. Clients keep their connection alive (http.client), each sends `--seconds` worth of requests after
a warm-up. A local Ray instance with 2 CPUs; the clients, the proxy and the replicas share the
machine's cores, as they would on one node.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PORT = 8765
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


def _post(conn: http.client.HTTPConnection, body: bytes, ctype: str) -> float:
    return _post_timed(conn, body, ctype)[0]


def _post_timed(
    conn: http.client.HTTPConnection, body: bytes, ctype: str
) -> tuple[float, dict[str, float]]:
    """Seconds to the answer, and the replica's Server-Timing phases (seconds)."""
    t = time.perf_counter()
    conn.request("POST", "/", body, {"Content-Type": ctype})
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


def _ready(body: bytes, ctype: str, timeout: float = 60.0) -> None:
    """Wait until the application answers 200 (HAProxy takes the replicas up a moment after
    `serve.run` returns: 503 meanwhile)."""
    end = time.monotonic() + timeout
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=60)
        try:
            _post(conn, body, ctype)
            return
        except (OSError, RuntimeError):
            if time.monotonic() > end:
                raise
            time.sleep(0.2)
        finally:
            conn.close()


def _latency(
    body: bytes, ctype: str, seconds: float, direct: object, inputs: dict[str, np.ndarray]
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Seconds per request over HTTP and per direct `run` in this process, taking turns (the
    VM's speed drifts between runs minutes apart; the overhead is measured in one window); and
    per request, from its Server-Timing: the time outside the replica's handler (client,
    proxy, connection, the server's HTTP parsing) and the handler's own time besides the
    evaluation (read, decode, queue, encode)."""
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    for _ in range(3):
        _post(conn, body, ctype)
    times: list[float] = []
    direct_times: list[float] = []
    outside: list[float] = []
    handler: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 20:
        took, phases = _post_timed(conn, body, ctype)
        times.append(took)
        outside.append(took - sum(phases.values()))
        handler.append(sum(phases.values()) - phases.get("eval", 0.0))
        t = time.perf_counter()
        direct.run(inputs)  # type: ignore[attr-defined]
        direct_times.append(time.perf_counter() - t)
    conn.close()
    return times, direct_times, outside, handler


def _throughput(body: bytes, ctype: str, seconds: float, clients: int = 16) -> float:
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
            conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=300)
            _post(conn, body, ctype)  # warm: connection, replica, binding
            while time.perf_counter() < warm_until:  # and the batch sizes the load makes
                _post(conn, body, ctype)
            start.wait()
            while not stop.is_set():
                _post(conn, body, ctype)
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


_TRITON_TYPES = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64"}


def _triton_call(client: object, inputs: dict[str, np.ndarray]) -> float:
    import tritonclient.http as th

    ins = []
    for name, a in inputs.items():
        t = th.InferInput(name, list(a.shape), _TRITON_TYPES[a.dtype])
        t.set_data_from_numpy(a, binary_data=True)
        ins.append(t)
    t0 = time.perf_counter()
    client.infer("kyanite", ins)  # type: ignore[attr-defined]
    return time.perf_counter() - t0


def _triton_measure(url: str, inputs: dict[str, np.ndarray], seconds: float) -> tuple:
    """p50 and p99 (ms) at concurrency 1, then requests/s with 16 clients."""
    import tritonclient.http as th

    client = th.InferenceServerClient(url)
    for _ in range(3):
        _triton_call(client, inputs)
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 20:
        times.append(_triton_call(client, inputs))
    done = [0] * 16
    stop = threading.Event()

    def worker(i: int) -> None:
        c = th.InferenceServerClient(url)
        while not stop.is_set():
            _triton_call(c, inputs)
            done[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return _pct(times, 50), _pct(times, 99), sum(done) / (time.perf_counter() - t0)


def _triton(path: Path, inputs: dict[str, np.ndarray], seconds: float) -> list[tuple]:
    """The same through PyTriton's Triton server (HTTP, tritonclient): p50/p99 at concurrency 1
    and requests/s at 16 with dynamic batching, for each runtime."""
    from kn_runtime.serve import load_model
    from kn_runtime.serve.triton import bind, start

    rows = []
    for runtime in ("kyanite", "onnxruntime"):
        triton = start(http_port=PORT + 10, grpc_port=PORT + 11)
        try:
            bind(triton, load_model(path, threads=1, runtime=runtime), max_batch_size=16)
            rows.append((runtime, *_triton_measure(f"127.0.0.1:{PORT + 10}", inputs, seconds)))
        finally:
            triton.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=Path("/work/bigmodels"))
    ap.add_argument("--torch-python", type=Path, default=Path("/work/venv-fx/bin/python"))
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("-k", dest="only", action="append", choices=list(MODELS))
    ap.add_argument("--engine", choices=["ray", "triton"], default="ray")
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
    if args.engine == "triton":
        print("| model | runtime | Triton HTTP c=1 p50/p99 ms | c=16 batched req/s |")
        print("|---|---|---|---|")
        for name in args.only or list(MODELS):
            for runtime, p50, p99, rate in _triton(
                args.cache / MODELS[name], _body(name)[2], args.seconds
            ):
                print(f"| {name} | {runtime} | {p50:.1f} / {p99:.1f} | {rate:.1f} |", flush=True)
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
                    _ready(body, ctype)
                    if label == "c=1":  # direct calls and requests take turns: same conditions
                        times, direct_times, outside, handler = _latency(
                            body, ctype, args.seconds, direct, inputs
                        )
                        row["http p50"], row["http p99"] = _pct(times, 50), _pct(times, 99)
                        row["direct p50"] = _pct(direct_times, 50)
                        row["direct p99"] = _pct(direct_times, 99)
                        row["outside"], row["handler"] = _pct(outside, 50), _pct(handler, 50)
                        del direct
                    else:
                        before = _served()
                        row[label] = _throughput(body, ctype, args.seconds)
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
    print(f"\ningress: {args.ingress}, warm-up: {args.warmup}")
    print(
        "\n| model | runtime | direct p50/p99 ms | HTTP c=1 p50/p99 ms | overhead p50 ms "
        "| outside / handler p50 ms | c=16 unbatched req/s | c=16 batched req/s (rows) "
        "| batching gain | 2 replicas req/s | replica gain |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, runtime, r in rows:
        print(
            f"| {name} | {runtime} | {r['direct p50']:.1f} / {r['direct p99']:.1f} "
            f"| {r['http p50']:.1f} / {r['http p99']:.1f} | {r['http p50'] - r['direct p50']:.1f} "
            f"| {r['outside']:.2f} / {r['handler']:.2f} "
            f"| {r['c=16 unbatched']:.1f} | {r['c=16 batched']:.1f} "
            f"({r['c=16 batched rows']:.1f}) "
            f"| {r['c=16 batched'] / r['c=16 unbatched']:.2f}x | {r['c=16 2 replicas']:.1f} "
            f"| {r['c=16 2 replicas'] / r['c=16 batched']:.2f}x |"
        )
    for name in {n for n, _, _ in rows}:
        ours = next(r for n, rt, r in rows if n == name and rt == "kyanite")
        peer = next(r for n, rt, r in rows if n == name and rt == "onnxruntime")
        ratio = statistics.geometric_mean(
            [ours["c=16 batched"] / peer["c=16 batched"], peer["http p50"] / ours["http p50"]]
        )
        print(
            f"{name}: kyanite/onnxruntime speed (geomean of batched throughput, c=1): {ratio:.2f}"
        )


if __name__ == "__main__":
    main()
