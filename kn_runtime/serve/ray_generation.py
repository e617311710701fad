"""LLM generation on Ray Serve (`kn-serve generate --engine ray`): `generation_deployment(...)`
builds a Serve application whose replicas each hold one `Generator`; a POST gets the answer at
once or streamed as newline-delimited JSON (`generation`: the request's fields and the lines).
The replica plumbing (metadata, body limits, actor options, running until stopped) is
`ray_serve`'s."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kn_graph.errors import ArgumentValueError
from kn_runtime.generate.batcher import Batcher
from kn_runtime.serve import codec
from kn_runtime.serve.ray_serve import (
    _actor_options,
    _check_length,
    _not_a_post,
    _replica_info,
    _run_until_stopped,
    _serve,
    _too_large,
)

if TYPE_CHECKING:
    from ray.serve import Application
    from starlette.requests import Request
    from starlette.responses import Response

    from kn_runtime.generate.generator import Generator

__all__ = ["GenerationDeployment", "generation_deployment", "serve_generation_forever"]

log = logging.getLogger(__name__)


MAX_ONGOING = 16
"""Requests a replica takes at a time, all decoded together (`Batcher`)."""

GENERATION_MAX_BODY = 1 << 20
"""The largest generation request body (a prompt and a few settings), in bytes."""


class GenerationDeployment:
    """One Serve replica holding one `Generator` (an LLM folder on a device): POST a JSON
    request (`generation.parse_request`), get the answer at once or streamed as
    newline-delimited JSON. Concurrent requests are decoded together (`generate.Batcher`,
    continuous batching); streams are read on the event loop (`async for`), and a client that
    goes away cancels its request (its row leaves the batch). Every failure
    before the answer starts is an HTTP error (`codec.encode_error`: 400 for a bad field, 413
    over the body limit); one after a stream started ends it with an `{"error"}` line.

    A plain class at module level (wrapped by `generation_deployment()`), so that Ray pickles
    it by reference and replicas import it from the installed package."""

    def __init__(self, folder: str | None, *, threads: int | None = 1, device: str = "cpu") -> None:
        from kn_runtime.generate.generator import load_generator
        from kn_runtime.serve.loading import resolve_device

        self.generator: Generator = load_generator(folder, resolve_device(device, threads))
        # concurrent requests decoded together (continuous batching), as many as Serve lets in
        self.batcher = Batcher(self.generator, max_batch=MAX_ONGOING)
        spec = self.generator.spec
        self._metadata = {
            "model": spec.folder.name,
            "layout": spec.layout,
            "vocab": self.generator.vocab,
            "context_length": spec.context_length,
            "device": str(self.generator.model.prepared.device),
            "max_body_bytes": GENERATION_MAX_BODY,
            "replica": _replica_info(),
        }
        self._served = {"requests": 0, "streamed": 0, "tokens": 0}
        log.info("kyanite generation replica ready: %r", self.generator)

    async def __call__(self, request: Request) -> Response:
        from starlette.responses import Response, StreamingResponse

        from kn_runtime.serve import generation

        try:
            b = self.batcher
            batched = {"steps": b.steps, "largest_batch": b.largest_batch, "cancelled": b.cancelled}
            early = _not_a_post(request, self._metadata | {"served": self._served | batched})
            if early is not None:
                return early
            _check_length(request, GENERATION_MAX_BODY)
            body = await request.body()
            if len(body) > GENERATION_MAX_BODY:
                raise _too_large(len(body), GENERATION_MAX_BODY)
            asked = generation.parse_request(body)
            stream = generation.start(self.batcher, asked)  # a refused prompt: 400 here
            self._served["requests"] += 1
            if asked.stream:
                self._served["streamed"] += 1
                return StreamingResponse(self._lines(stream), media_type="application/x-ndjson")
            async for _ in stream:
                self._served["tokens"] += 1
            assert stream.result is not None
            return Response(generation.answer(stream.result), media_type="application/json")
        except Exception as exc:
            status, payload = codec.encode_error(exc)
            if status >= 500:
                log.exception("generation request failed (%d)", status)
            return Response(payload, status_code=status, media_type="application/json")

    async def _lines(self, stream: Any) -> AsyncIterator[bytes]:
        """The streamed body: a line per token, then the finish line (or an error line)."""
        from kn_runtime.serve import generation

        try:
            async for event in stream:
                self._served["tokens"] += 1
                yield generation.event_line(event)
            assert stream.result is not None
            yield generation.end_line(stream.result)
        except Exception as exc:
            log.exception("a streamed generation failed")
            yield generation.error_line(exc)


def generation_deployment(
    folder: str | os.PathLike[str] | None = None,
    *,
    name: str = "kyanite-generate",
    num_replicas: int = 1,
    ray_actor_options: Mapping[str, Any] | None = None,
    threads: int | None = 1,
    device: str = "cpu",
    deployment_options: Mapping[str, Any] | None = None,
) -> Application:
    """A bound Serve application generating text with the LLM in `folder` (None: the shipped
    tiny model, `TINY_LLM`): pass it to `serve.run(app, ...)`. POST `{"prompt": ..., "stream":
    true, ...}` (`generation.FIELDS`); GET /metadata for the model and the replica.

    Each replica loads the folder itself (the same path on every node). Replicas reserve
    `threads` CPUs (one GPU when `device` is a CUDA device) unless `ray_actor_options` says
    otherwise, and take up to 16 requests at a time (decoded together: `generate.Batcher`);
    `deployment_options`: further `serve.deployment` options, which win over these."""
    from kn_runtime.generate.folder import read_folder
    from kn_runtime.generate.generator import TINY_LLM

    serve = _serve()
    if num_replicas < 1:
        raise ArgumentValueError(f"num_replicas must be at least 1, found {num_replicas}")
    path = Path(TINY_LLM if folder is None else folder).resolve()
    read_folder(path)  # a folder that lacks a file is refused here, not in every replica
    settings: dict[str, Any] = {
        "name": name,
        "num_replicas": num_replicas,
        "ray_actor_options": _actor_options(threads, device, ray_actor_options),
        "max_ongoing_requests": MAX_ONGOING,
    }
    settings.update(deployment_options or {})
    if "autoscaling_config" in settings and "num_replicas" not in (deployment_options or {}):
        del settings["num_replicas"]  # Serve takes one or the other
    bound = serve.deployment(GenerationDeployment, **settings)
    return bound.bind(str(path), threads=threads, device=device)


def serve_generation_forever(
    folder: str | os.PathLike[str] | None = None,
    *,
    port: int = 8000,
    threads: int | None = 1,
    address: str | None = None,
    device: str = "cpu",
    host: str = "127.0.0.1",
    name: str = "kyanite-generate",
    ingress: str = "proxy",
) -> None:
    """Generate text over HTTP on `host:port` until SIGTERM or Ctrl-C (`kn-serve generate
    --engine ray`), with the cluster rules and the `ingress` of `serve_forever`: POST a request
    to any path, GET /metadata for the model."""
    app = generation_deployment(folder, name=name, threads=threads, device=device)
    what = "the tiny LLM" if folder is None else str(folder)
    _run_until_stopped(app, what, name=name, port=port, address=address, host=host, ingress=ingress)
