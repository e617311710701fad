"""Text generation on PyTriton's real Triton server, decoupled: the tiny LLM bound with
`bind_generator`, streamed to `tritonclient.grpc` one response per token; the texts against
`Generator.generate` of the same prompt called directly (greedy)."""

from __future__ import annotations

import queue
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kn_runtime.generate.generator import Generator, load_generator
from kn_runtime.serve import triton as kt
from tests.kn_runtime.serve.support import free_ports

pytestmark = [
    pytest.mark.skipif(
        sys.platform != "linux", reason="PyTriton ships its Triton server for Linux only"
    ),
    pytest.mark.xdist_group("triton"),
]

TOKENS = 16
WAIT_S = 60.0
"""Bound on each wait for a response (a failure, not a hang, when exceeded)."""


@pytest.fixture(scope="module")
def grpc_url() -> Iterator[str]:
    http_port, grpc_port = free_ports(2)
    triton = kt.start(http_port=http_port, grpc_port=grpc_port, exit_timeout_s=5)
    try:
        kt.bind_generator(triton, load_generator(), name="gen")
        yield f"localhost:{grpc_port}"
    finally:
        triton.stop()


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


def test_a_bad_setting_is_the_requests_error(grpc_url: str) -> None:
    responses = _stream(grpc_url, {"prompt": "a", "top_p": 0.0})
    assert len(responses) == 1 and isinstance(responses[0], Exception)
    assert "top_p" in str(responses[0])


def test_kn_serve_generate_on_triton_streams_the_tokens() -> None:
    """`kn-serve generate --engine triton` (the tiny LLM) as a user starts it: ready once the
    model is, a request streamed over gRPC gives the direct generation's text, Ctrl-C stops it
    (PyTriton's `serve()` takes the signal and returns: status 0; 130 if it reaches us)."""
    import signal
    import subprocess
    import time

    import tritonclient.http as th

    http_port, grpc_port = free_ports(2)
    cmd = [sys.executable, "-m", "kn_runtime.serve.cli", "generate", "--engine", "triton"]
    cmd += ["--port", str(http_port), "--grpc-port", str(grpc_port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        client = th.InferenceServerClient(f"localhost:{http_port}")
        while True:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
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
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code in (0, 130), proc.communicate()[1][-2000:]
