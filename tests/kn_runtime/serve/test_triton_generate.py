"""Text generation on PyTriton's real Triton server, decoupled: the tiny LLM bound with
`bind_generator`, streamed to `tritonclient.grpc` one response per token; the texts against
`Generator.generate` of the same prompt called directly (greedy)."""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kn_runtime.generate import Batcher
from kn_runtime.generate.generator import Generator, load_generator
from kn_runtime.serve import triton as kt
from tests.kn_runtime.serve.support import cli_command, free_ports, stop_by_ctrl_c
from tests.paths import MODELS

pytestmark = [
    pytest.mark.skipif(
        sys.platform != "linux", reason="PyTriton ships its Triton server for Linux only"
    ),
    pytest.mark.xdist_group("triton"),
]

TOKENS = 16
WAIT_S = 60.0
"""Bound on each wait for a response (a failure, not a hang, when exceeded)."""


CONCURRENT = 4
BATCHED = MODELS / "llm" / "llama_optimum"
"""The concurrent test's LLM: a fixture export whose left-padded rows are exact (the Batcher
joins them)."""


class _HeldUntilQueued:
    """A batcher's model whose first forward waits until `n` more requests are queued: the
    concurrent requests are then decoded together whatever the speed of the machine."""

    def __init__(self, batcher: Batcher, n: int) -> None:
        self._model, self._batcher, self._n, self._calls = batcher.model, batcher, n, 0

    def forward(self, *args: object) -> object:
        self._calls += 1
        if self._calls == 1:
            deadline = time.monotonic() + WAIT_S
            while self._batcher.waiting() < self._n:
                if time.monotonic() > deadline:
                    raise TimeoutError("the concurrent requests never arrived")
                time.sleep(0.01)
        return self._model.forward(*args)

    def __getattr__(self, name: str) -> object:
        return getattr(self._model, name)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Batcher]]:
    """The server's gRPC address, and the batcher of "gen-batched" (a second binding whose
    first prefill waits for CONCURRENT requests)."""
    http_port, grpc_port = free_ports(2)
    triton = kt.start(http_port=http_port, grpc_port=grpc_port, exit_timeout_s=5)
    try:
        kt.bind_generator(triton, load_generator(), name="gen")
        # the tiny LLM counts positions from the past length (no joins): a folder that reads
        # position_ids
        batcher = Batcher(load_generator(BATCHED), max_batch=CONCURRENT)
        batcher.model = _HeldUntilQueued(batcher, CONCURRENT - 1)
        assert kt.bind_generator(triton, batcher, name="gen-batched") is batcher
        yield f"localhost:{grpc_port}", batcher
    finally:
        triton.stop()


@pytest.fixture(scope="module")
def grpc_url(server: tuple[str, Batcher]) -> str:
    return server[0]


def _stream(url: str, settings: dict[str, Any], model: str = "gen") -> list[Any]:
    """Every response of one streamed request (an error as its exception), up to the final
    empty one."""
    import tritonclient.grpc as tc

    got: queue.Queue[Any] = queue.Queue()
    inputs = []
    for key, value in settings.items():
        dtype = kt.GENERATION_INPUTS[key]
        array = (
            np.array([value.encode()], dtype=np.object_)
            if dtype is bytes
            else np.array([value], dtype=dtype)
        )
        tensor = tc.InferInput(
            key, [1], "BYTES" if dtype is bytes else tc.np_to_triton_dtype(dtype)
        )
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    client = tc.InferenceServerClient(url)
    responses: list[Any] = []
    try:
        client.start_stream(callback=lambda result, error: got.put(error or result))
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        while True:
            item = got.get(timeout=WAIT_S)
            if isinstance(item, Exception):
                return [*responses, item]
            final = item.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return responses
            responses.append(item)
    finally:
        # cancel what is left: after an error response the server may never end the stream,
        # and a plain stop_stream() then waits for it forever (a CI run hung there)
        client.stop_stream(cancel_requests=True)
        client.close()


def test_tokens_stream_one_response_each(grpc_url: str) -> None:
    reference: Generator = load_generator()
    prompt = "Once upon a time"
    expected = reference.generate(prompt, max_new_tokens=TOKENS)
    responses = _stream(grpc_url, {"prompt": prompt, "max_new_tokens": TOKENS})
    assert not any(isinstance(r, Exception) for r in responses), responses
    texts = [r.as_numpy("text")[0].decode() for r in responses]
    finishes = [r.as_numpy("finish_reason")[0].decode() for r in responses]
    assert len(responses) == len(expected.ids[0]) + 1  # a response per token, then the end
    assert "".join(texts) == expected.text
    assert finishes == [""] * len(expected.ids[0]) + [expected.finish_reasons[0]]


def test_concurrent_streams_are_decoded_together(server: tuple[str, Batcher]) -> None:
    """CONCURRENT clients stream at once from one model instance: each gets the text of its
    prompt generated alone, and the batcher ran them in one batch."""
    url, batcher = server
    reference: Generator = load_generator(BATCHED)
    prompts = ["Once upon a time", "The cat", "In a land far away there", "Hello"]
    lengths = [12, 20, 6, 16]
    expected = [
        reference.generate(p, max_new_tokens=n).text for p, n in zip(prompts, lengths, strict=True)
    ]
    got: list[Any] = [None] * CONCURRENT

    def client(i: int) -> None:
        settings = {"prompt": prompts[i], "max_new_tokens": lengths[i]}
        got[i] = _stream(url, settings, "gen-batched")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CONCURRENT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=2 * WAIT_S)
    for responses in got:
        assert responses is not None and not any(isinstance(r, Exception) for r in responses)
    texts = ["".join(r.as_numpy("text")[0].decode() for r in rs) for rs in got]
    assert texts == expected
    assert batcher.largest_batch == CONCURRENT


def test_a_bad_setting_is_the_requests_error(grpc_url: str) -> None:
    responses = _stream(grpc_url, {"prompt": "a", "top_p": 0.0})
    assert len(responses) == 1 and isinstance(responses[0], Exception)
    assert "top_p" in str(responses[0])


def test_kn_serve_generate_on_triton_streams_the_tokens(tmp_path: Path) -> None:
    """`kn-serve generate --engine triton` (the tiny LLM) as a user starts it: ready once the
    model is, a request streamed over gRPC gives the direct generation's text, Ctrl-C stops it
    (PyTriton's `serve()` takes the signal and returns: status 0; 130 if it reaches us). Its
    output goes to a file: Triton logs a line per model per second while it stops, and a pipe
    nobody reads fills and blocks it (a CI run hung there)."""
    import subprocess

    import tritonclient.http as th

    http_port, grpc_port = free_ports(2)
    cmd = cli_command("kn_runtime.serve.cli", "generate", "--engine", "triton")
    cmd += ["--port", str(http_port), "--grpc-port", str(grpc_port)]
    log = tmp_path / "kn-serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    client = th.InferenceServerClient(f"localhost:{http_port}")
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if client.is_model_ready("kyanite-generate"):
                    break
            except Exception:  # not listening yet
                pass
            assert time.monotonic() < deadline, "kn-serve generate did not become ready"
            time.sleep(0.5)
        prompt = "Once upon a time"
        expected = load_generator().generate(prompt, max_new_tokens=8)
        responses = _stream(
            f"localhost:{grpc_port}", {"prompt": prompt, "max_new_tokens": 8}, "kyanite-generate"
        )
        assert not any(isinstance(r, Exception) for r in responses), responses
        assert "".join(r.as_numpy("text")[0].decode() for r in responses) == expected.text
    finally:
        # Triton waits out its exit timeout (30 s) for every HTTP connection still open
        client.close()
        code = stop_by_ctrl_c(proc, 60, log.read_text)
    assert code in (0, 130), log.read_text()[-3000:]
