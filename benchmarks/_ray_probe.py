"""What Ray Serve adds to one request at concurrency 1: the p50 of `BatchedModel.run` called
directly against the same request sent over HTTP to a one-replica deployment (JSON and .npy
bodies) and through a deployment handle (no HTTP), with the batch wait at 5 ms (kn-serve's
default: a lone request waits for company) and at 0.

    PYTHONPATH=. python benchmarks/_ray_probe.py [model.onnx] [--requests 300]

Starts a local Ray for itself (RAY_TMPDIR, RAY_AUTH_MODE as set in the environment) and stops
it at the end."""

from __future__ import annotations

import argparse
import io
import json
import socket
import statistics
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kn_runtime.serve.loading import load_model
from kn_runtime.serve.ray_serve import deployment

MODEL = Path(__file__).resolve().parents[1] / "kn_runtime" / "models" / "resnet_tiny.onnx"


class Echo:
    """Serve's own cost: a deployment that reads the body and answers 2 bytes."""

    async def __call__(self, request: object) -> object:
        from starlette.responses import Response

        await request.body()  # type: ignore[attr-defined]
        return Response(b"ok")


def p50_ms(fn: Callable[[], object], n: int) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def post(url: str, body: bytes, content_type: str) -> bytes:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": content_type})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", type=Path, default=MODEL)
    ap.add_argument("--requests", type=int, default=300)
    args = ap.parse_args()

    import ray
    from ray import serve

    model = load_model(args.model, threads=1)
    spec = model.inputs[0]
    shape = [1 if d is None else d for d in spec.shape]
    x = np.random.default_rng(0).standard_normal(shape).astype(spec.dtype)
    request = {spec.name: x}
    buf = io.BytesIO()
    np.save(buf, x)
    npy = buf.getvalue()
    body = json.dumps({"inputs": {spec.name: x.tolist()}}).encode()
    rows = [("direct BatchedModel.run", p50_ms(lambda: model.run(request), args.requests))]

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.init(num_cpus=2, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        url = f"http://127.0.0.1:{port}/"
        serve.run(serve.deployment(Echo).bind(), name="echo", route_prefix="/")
        rows.append(
            ("HTTP no-op deployment (Serve)", p50_ms(lambda: post(url, npy, "a/b"), args.requests))
        )
        serve.delete("echo")
        for wait in (0.005, 0.0):
            app = deployment(args.model, batch_wait_timeout_s=wait)
            handle = serve.run(app, name="probe", route_prefix="/")
            tag = f"wait {wait * 1e3:g} ms"
            rows.append(
                (
                    f"Serve handle .infer ({tag})",
                    p50_ms(lambda h=handle: h.infer.remote(request).result(), args.requests),
                )
            )
            rows.append(
                (
                    f"HTTP .npy ({tag})",
                    p50_ms(lambda: post(url, npy, "application/x-npy"), args.requests),
                )
            )
            rows.append(
                (
                    f"HTTP JSON ({tag})",
                    p50_ms(lambda: post(url, body, "application/json"), args.requests),
                )
            )
            serve.delete("probe")
    finally:
        serve.shutdown()
        ray.shutdown()
    print(f"{args.model.name}, input {shape}, {args.requests} requests, concurrency 1, p50:")
    for name, ms in rows:
        print(f"  {name:32s} {ms:8.3f} ms")


if __name__ == "__main__":
    main()
