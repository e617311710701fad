"""Kyanite on PyTriton: a Triton Inference Server (the binary inside the `nvidia-pytriton`
wheel) whose model is a Python callable in this process that answers each dynamic batch with
one `BatchedModel.run_batch`. Clients speak Triton's KServe v2 protocol (`tritonclient.http`,
`tritonclient.grpc`).

    triton = start(http_port=8000, grpc_port=8001)
    bind(triton, load_model("model.onnx"), max_batch_size=16)
    triton.serve()                      # or serve_forever("model.onnx") for both

Triton runs the Python side of a model in a stub process (`triton_python_backend_stub`, one
build per Python minor version in the wheel) that embeds `libpython3.X.so` and takes its
standard library and site-packages from the first `python3` on its PATH (PyTriton puts this
environment's `bin` first). `start` gives it what it needs:
- the running interpreter's own `libpython` (LD_LIBRARY_PATH): the loader otherwise finds the
  system's, of another patch release, whose `_thread` lacks what this standard library calls
  (`'_thread.RLock' object has no attribute '_recursion_count'`: Debian's 3.11.2 library under
  pyenv's 3.11.7 standard library, pytriton issue #51);
- NumPy 1 inside the stub: PyTriton 0.5-0.7 build the stub with a pybind11 that reads NumPy's
  array structs as NumPy 1 lays them out, so under NumPy 2 every input reaches the model as
  zeros and every output comes back empty ("cannot reshape array of size 0"; fixed in the
  python_backend by pybind11 2.12, PR #384, not in these wheels). With NumPy 2 here, the stub
  runs in an environment of its own: a venv of this Python with numpy<2 and pyzmq
  (`kn-serve triton-stub-env DIR`, or `python -m kn_runtime.serve.triton stub-env DIR`; found
  by `KN_TRITON_STUB_ENV` or at `~/.cache/kyanite/triton-stub-3.X`). This process keeps its NumPy; the stub and this process
  exchange tensors through shared memory, not through NumPy's ABI.

`serve_forever` (`kn-serve --engine triton`) runs the same binary on a model repository
(`repository.write_repository`) instead, where Kyanite runs inside the stub itself
(`triton_server`); `in_process=True` binds as above.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kn_graph.errors import ArgumentValueError, RequestError
from kn_runtime.generate.batcher import Batcher
from kn_runtime.serve import triton_stub as tstub
from kn_runtime.serve.batching import BatchedModel, TensorSpec
from kn_runtime.serve.triton_server import (
    _check_ports,
    _pytriton,
    launch_repository,
    serve_repository_forever,
)
from kn_runtime.serve.triton_stub import (
    STUB_ENV_VAR,
    TritonUnavailableError,
    default_stub_env,
    make_stub_env,
)

if TYPE_CHECKING:
    from kn_runtime.generate.generator import Generator

__all__ = [
    "STUB_ENV_VAR",
    "TritonUnavailableError",
    "bind",
    "bind_generator",
    "default_stub_env",
    "launch_repository",
    "make_stub_env",
    "serve_forever",
    "serve_generation_forever",
    "start",
]

log = logging.getLogger(__name__)


_START_LOCK = threading.Lock()
_READY: weakref.WeakSet[Any] = weakref.WeakSet()  # servers `start` started (their stubs work)


def start(
    *,
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int | None = None,
    stub_env: str | os.PathLike[str] | None = None,
    log_verbose: int = 0,
    exit_timeout_s: int = 30,
) -> Any:
    """A running PyTriton `Triton` (the server started, ready for `bind`), with the environment
    its stub needs (module docstring). `metrics_port`: Prometheus metrics there (None: off).
    `exit_timeout_s`: how long `stop()` waits for open connections and requests. Stop it with
    `triton.stop()`."""
    pt = _pytriton()
    env = tstub._stub_env(stub_env)
    _check_ports({"http_port": http_port, "grpc_port": grpc_port, "metrics_port": metrics_port})
    config = pt.TritonConfig(
        http_port=http_port,
        grpc_port=grpc_port,
        allow_metrics=metrics_port is not None,
        metrics_port=metrics_port,
        log_verbose=log_verbose,
        exit_timeout_secs=exit_timeout_s,
    )
    triton = pt.Triton(config=config)
    with _START_LOCK, tstub._server_environment(env):
        try:
            triton.run()
        except BaseException:
            triton.stop()
            raise
    _READY.add(triton)
    return triton


# -- binding a model ----------------------------------------------------------------------------


def _row_shape(spec: TensorSpec, batched: bool) -> tuple[int, ...]:
    """The shape PyTriton declares: the batch axis left out when Triton batches, -1 for a
    symbolic size."""
    shape = spec.shape[1:] if batched and spec.batched else spec.shape
    return tuple(-1 if d is None else d for d in shape)


def _tensors(specs: Sequence[TensorSpec], batched: bool) -> list[Any]:
    """PyTriton's tensors. Triton refuses empty dims and PyTriton has no `reshape`: a scalar
    per row (an output [B], a scalar input) is declared [1], and `_callable` adds or drops that
    axis (`_scalars`)."""
    from pytriton.model_config import Tensor

    return [Tensor(name=s.name, dtype=s.dtype, shape=_row_shape(s, batched) or (1,)) for s in specs]


def _scalars(specs: Sequence[TensorSpec], batched: bool) -> frozenset[str]:
    """The tensors `_tensors` declares [1] for a scalar per row."""
    return frozenset(s.name for s in specs if not _row_shape(s, batched))


def bind(
    triton: Any,
    model: BatchedModel,
    *,
    name: str = "kyanite",
    max_batch_size: int = 16,
    max_queue_delay_us: int = 0,
    instances: int = 1,
) -> None:
    """Serve `model` as `name` on a PyTriton `Triton` (from `start`; bound to a running server
    the model loads at once, and a stub that cannot start raises here). Triton checks each
    request's dtypes and fixed sizes against the model's inputs before batching (a wrong one
    is rejected alone); dynamic batching gathers up to `max_batch_size` rows, waiting at most
    `max_queue_delay_us` (0, Triton's default: a free instance takes what is queued, and what
    arrives while it runs queues for the next batch anyway; a wait is paid by every lone
    request), and the callable answers them with one `run_batch`. A model whose
    requests cannot share an evaluation is bound without batching. `instances` callables share
    the model (its evaluations take turns; more instances overlap Triton's and NumPy's work).
    With more than one, PyTriton 0.7 now and then fails to load the model on a busy machine
    (`ConnectionRefusedError` in `get_config_from_handshake_server`: the later instances'
    stubs connect once to a socket the first one has bound but may not yet listen on); binding
    again under another name is the way out, as PyTriton keeps the failed name."""
    _check_started(triton)
    from pytriton.model_config import DynamicBatcher, ModelConfig

    for value, what in ((max_batch_size, "max_batch_size"), (instances, "instances")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ArgumentValueError(f"{what}: expected a positive int, found {value!r}")
    batched = model.batchable
    if batched:
        config = ModelConfig(
            batching=True,
            max_batch_size=max_batch_size,
            batcher=DynamicBatcher(max_queue_delay_microseconds=max_queue_delay_us),
        )
    else:
        log.info("%s: bound without batching: %s", name, model.why_not)
        config = ModelConfig(batching=False)
    infer = _callable(model)
    triton.bind(
        model_name=name,
        infer_func=[infer] * instances if instances > 1 else infer,
        inputs=_tensors(model.inputs, batched),
        outputs=_tensors(model.outputs, batched),
        config=config,
    )


def _check_started(triton: Any) -> None:
    """PyTriton importable, and under NumPy 2 a server that `start` started (module docstring)."""
    _pytriton()
    if tstub._numpy2() and triton not in _READY:
        raise TritonUnavailableError(
            f"with NumPy {np.__version__} a Triton server must be started by "
            "kn_runtime.serve.triton.start(), which runs PyTriton's stub on NumPy 1 (a Triton "
            "started otherwise hands every input over as zeros)"
        )


GENERATION_INPUTS: dict[str, type] = {
    "prompt": bytes,
    "max_new_tokens": np.int32,
    "temperature": np.float32,
    "top_k": np.int32,
    "top_p": np.float32,
    "repetition_penalty": np.float32,
    "seed": np.int64,
}
"""A generation model's inputs (shape [1] each; all but `prompt` optional): the settings of
`generation.FIELDS` that are numbers, as Triton tensors. Outputs: `text` and `finish_reason`
(BYTES, shape [1])."""


def bind_generator(
    triton: Any,
    generator: Generator | Batcher,
    *,
    name: str = "kyanite-generate",
    max_batch: int = 8,
) -> Batcher:
    """Serve `generator` as `name` on a PyTriton `Triton` (from `start`), decoupled: a request
    gets one response per generated token (`text`, its piece; `finish_reason` empty), then one
    with an empty `text` and the finish reason. Clients stream it over gRPC
    (`tritonclient.grpc`: `start_stream`, `async_stream_infer`). The settings are checked as
    the HTTP front ends check them (`generation.check_request`); a bad one is the request's
    error. Concurrent requests are decoded together by a `Batcher` of up to `max_batch` rows
    (or the one given): the callable is an async generator, which PyTriton runs as a task per
    request on its event loop, so one model instance streams every request under way. Returns
    the batcher (its `steps` and `largest_batch` say how much was shared)."""
    _check_started(triton)
    from pytriton.model_config import ModelConfig, Tensor

    batcher = generator if isinstance(generator, Batcher) else Batcher(generator, max_batch)
    inputs = [
        Tensor(name=k, dtype=t, shape=(1,), optional=k != "prompt")
        for k, t in GENERATION_INPUTS.items()
    ]
    outputs = [Tensor(name=k, dtype=bytes, shape=(1,)) for k in ("text", "finish_reason")]
    triton.bind(
        model_name=name,
        infer_func=_generating(batcher),
        inputs=inputs,
        outputs=outputs,
        config=ModelConfig(batching=False, decoupled=True),
    )
    return batcher


def _generating(batcher: Batcher) -> Any:
    """PyTriton's decoupled callable: an async generator function (PyTriton runs each call as a
    task on its loop, so requests stream side by side) yielding a response list per token of
    the (one) request; the batcher's events are awaited, not waited for in a thread."""
    from kn_runtime.serve import generation

    def piece(text: str, finish: str = "") -> list[dict[str, np.ndarray]]:
        return [
            {
                "text": np.array([text.encode()], dtype=np.object_),
                "finish_reason": np.array([finish.encode()], dtype=np.object_),
            }
        ]

    async def infer(requests: Sequence[Any]) -> AsyncIterator[list[dict[str, np.ndarray]]]:
        for request in requests:
            doc = {}
            for key, array in request.data.items():
                value = np.asarray(array).reshape(-1)[0]
                doc[key] = value.decode() if isinstance(value, bytes) else value.item()
            try:
                stream = generation.start(batcher, generation.check_request(doc))
            except (ValueError, TypeError) as exc:  # our request checks, the generator's
                raise RequestError(str(exc)) from None
            async for event in stream:
                yield piece(event.text)
            assert stream.result is not None
            yield piece("", stream.result.finish_reasons[0])

    return infer


def _callable(model: BatchedModel) -> Any:
    """PyTriton's inference callable: the requests of one dynamic batch (each with its own batch
    axis) in, their outputs out, from one `run_batch`. PyTriton answers a callable that raises
    with one error for every request of the call; the message names the failing requests."""

    scalar_in = _scalars(model.inputs, model.batchable)
    scalar_out = _scalars(model.outputs, model.batchable)

    def request(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for n in scalar_in & data.keys():  # [rows, 1] or [1] as declared -> [rows] or []
            a = data[n]
            if a.ndim and a.shape[-1] == 1:
                data[n] = a.reshape(a.shape[:-1])
        return data

    def answer(out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {n: v[..., None] if n in scalar_out else v for n, v in out.items()}

    def infer(requests: Sequence[Any]) -> list[dict[str, np.ndarray]]:
        results = model.run_batch([request(dict(r.data)) for r in requests], return_exceptions=True)
        failed = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
        if failed:  # the cause's traceback would only lengthen what every client reads
            detail = "; ".join(
                f"request {i + 1} of {len(results)}: {type(e).__name__}: {e}" for i, e in failed
            )
            raise RequestError(detail) from None
        return [answer(r) for r in results]

    return infer


def serve_forever(
    model_path: str | os.PathLike[str],
    *,
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int | None = None,
    threads: int = 1,
    max_batch_size: int = 16,
    max_queue_delay_us: int = 0,
    instances: int = 1,
    device: str = "cpu",
    name: str = "kyanite",
    stub_env: str | os.PathLike[str] | None = None,
    warmup: bool | Mapping[str, int] = False,
    in_process: bool = False,
) -> None:
    """`kn-serve model.onnx --engine triton`: serve until Ctrl-C or the server dies (then stop
    it). The model runs inside Triton: a model repository (`repository.write_repository`) in a
    temporary folder on the bundled `tritonserver` (`launch_repository`), each of `instances`
    instances a Python-backend process with `threads` intra-op threads that plans its batch
    sizes first when `warmup` says so. Instances evaluate in parallel, a request that fails
    fails alone, and a request crosses one process boundary (ResNet-50, a 600 kB body, 2 cores:
    1.3 ms over the direct evaluation, against 9.3 ms in_process; benchmarks/RESULTS.md).

    `in_process=True` (`kn-serve --engine pytriton`): the model loads in this process and
    PyTriton binds it (`bind`); PyTriton's instances share that one model, and under NumPy 2
    its stub needs `stub_env` (`make_stub_env`)."""
    if not in_process:
        serve_repository_forever(
            model_path,
            http_port=http_port,
            grpc_port=grpc_port,
            metrics_port=metrics_port,
            threads=threads,
            max_batch_size=max_batch_size,
            max_queue_delay_us=max_queue_delay_us,
            instances=instances,
            device=device,
            name=name,
            warmup=warmup,
        )
        return
    from kn_runtime.serve.loading import load_model

    model = load_model(
        model_path,
        device=device,
        threads=threads,
        max_batch_size=max_batch_size,
        warmup=warmup,
    )
    _serve_until_stopped(
        lambda triton: bind(
            triton,
            model,
            name=name,
            max_batch_size=max_batch_size,
            max_queue_delay_us=max_queue_delay_us,
            instances=instances,
        ),
        f"serving {model_path} as '{name}': HTTP on port {http_port}, gRPC on port {grpc_port} "
        "(KServe v2; Ctrl-C stops)",
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        stub_env=stub_env,
    )


def _serve_until_stopped(bind_to: Callable[[Any], None], message: str, **server: Any) -> None:
    """Start the server (`start(**server)`), bind the model with `bind_to(triton)`, say
    `message`, serve until Ctrl-C or the server dies, then stop it."""
    triton = start(**server)
    try:
        bind_to(triton)
        log.warning("%s", message)
        triton.serve()
    finally:
        triton.stop()


def serve_generation_forever(
    folder: str | os.PathLike[str] | None = None,
    *,
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int | None = None,
    threads: int | None = 1,
    device: str = "cpu",
    name: str = "kyanite-generate",
    stub_env: str | os.PathLike[str] | None = None,
) -> None:
    """`kn-serve generate [FOLDER] --engine triton`: load the LLM folder (None: the tiny LLM),
    start the server, bind it decoupled (`bind_generator`: one response per token, streamed over
    gRPC), serve until Ctrl-C or the server dies (then stop it)."""
    from kn_runtime.generate.generator import load_generator
    from kn_runtime.serve.loading import resolve_device

    generator = load_generator(folder, resolve_device(device, threads))
    what = "the tiny LLM" if folder is None else folder
    _serve_until_stopped(
        lambda triton: bind_generator(triton, generator, name=name),
        f"generating with {what} as '{name}' (decoupled: stream it over gRPC on port "
        f"{grpc_port}; HTTP on port {http_port}; Ctrl-C stops)",
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        stub_env=stub_env,
    )


# -- a model repository on the bundled server ---------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """`python -m kn_runtime.serve.triton stub-env [DIR]`: make the stub's environment."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] != "stub-env" or len(args) > 2:
        print("usage: python -m kn_runtime.serve.triton stub-env [DIR]", file=sys.stderr)
        return 2
    path = make_stub_env(args[1] if len(args) == 2 else None)
    print(f"the Triton stub environment is {path} (found by {STUB_ENV_VAR}={path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
