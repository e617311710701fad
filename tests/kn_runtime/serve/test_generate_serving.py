"""Text generation on Ray Serve: a local Ray (two CPUs), one replica holding the shipped tiny
LLM, real HTTP requests streamed and not, each answer against `Generator.generate` of the same
prompt called directly in this process (greedy, so the same ids whatever the thread)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kn_graph.errors import RequestError
from kn_runtime.generate.generator import Generator, load_generator
from kn_runtime.serve.generation import parse_request
from tests.kn_runtime.serve.support import free_ports

try:
    import ray
    from ray import serve
except ImportError:  # the serve-ray extra is not installed: only the parsing tests run
    ray = serve = None
NO_RAY = "ray[serve] is not installed (the serve-ray extra)"

pytestmark = pytest.mark.xdist_group("ray_cluster")

ROOT = Path(__file__).resolve().parents[3]
HTTP_TIMEOUT_S = 60.0
TOKENS = 24
PROMPTS = ("Once upon a time", "The quick brown fox", "kyanite")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """A local Ray with Serve and the generation application at /gen; always taken down.
    Without token authentication and with a temp dir and HOME of its own, so that neither this
    machine's ~/.ray nor a token file changes what Ray does (as test_ray_serve does)."""
    if ray is None:
        pytest.skip(NO_RAY)
    from kn_cuda_eval.codegen.cache import cache_dir
    from kn_runtime.serve.ray_generation import generation_deployment

    tmp = Path(tempfile.mkdtemp(prefix="kn-gen-", dir="/tmp"))  # Unix sockets: short paths
    env = {
        "KN_KERNEL_CACHE": str(cache_dir()),  # the compiled kernels stay where they are
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "HOME": str(tmp / "home"),
        # the replicas import this checkout
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    saved = {k: os.environ.get(k) for k in [*env, "RAY_ADDRESS", "RAY_AUTH_TOKEN"]}
    for k in ("RAY_ADDRESS", "RAY_AUTH_TOKEN"):
        os.environ.pop(k, None)
    os.environ.update(env)
    try:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            _temp_dir=str(tmp / "ray"),
            object_store_memory=80 << 20,
        )
        port = free_ports(1)[0]
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(generation_deployment(name="gen"), name="gen", route_prefix="/gen")
        yield f"http://127.0.0.1:{port}/gen"
    finally:
        try:
            if ray.is_initialized():
                serve.shutdown()
        finally:
            ray.shutdown()
            shutil.rmtree(tmp, ignore_errors=True)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture(scope="module")
def reference() -> Generator:
    return load_generator()


def _post(url: str, body: bytes) -> tuple[int, str, bytes]:
    req = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


def _stream(url: str, prompt: str) -> list[dict[str, Any]]:
    """The lines of a streamed answer, read one by one as they arrive."""
    doc = {"prompt": prompt, "max_new_tokens": TOKENS, "stream": True}
    req = urllib.request.Request(
        url, data=json.dumps(doc).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("application/x-ndjson")
        return [json.loads(line) for line in r if line.strip()]


def _check_stream(lines: list[dict[str, Any]], reference: Generator, prompt: str) -> None:
    expected = reference.generate(prompt, max_new_tokens=TOKENS)
    *tokens, end = lines
    assert all(set(t) == {"text"} for t in tokens)
    assert "".join(t["text"] for t in tokens) == expected.text
    assert end == {"finish_reason": expected.finish_reasons[0], "tokens": len(expected.ids[0])}
    assert len(tokens) == len(expected.ids[0])  # one line per token


def test_a_streamed_answer_is_the_direct_generation(url: str, reference: Generator) -> None:
    _check_stream(_stream(url, PROMPTS[0]), reference, PROMPTS[0])


def test_an_answer_at_once_is_the_direct_generation(url: str, reference: Generator) -> None:
    body = {"prompt": PROMPTS[1], "max_new_tokens": TOKENS, "temperature": 0, "stop": []}
    status, kind, payload = _post(url, json.dumps(body).encode())
    assert status == 200, payload
    assert kind.startswith("application/json")
    expected = reference.generate(PROMPTS[1], max_new_tokens=TOKENS)
    assert json.loads(payload) == {
        "text": expected.text,
        "ids": list(expected.ids[0]),
        "finish_reason": expected.finish_reasons[0],
    }


def test_two_concurrent_streams_are_both_right(url: str, reference: Generator) -> None:
    got: dict[str, list[dict[str, Any]]] = {}
    errors: list[BaseException] = []

    def client(prompt: str) -> None:
        try:
            got[prompt] = _stream(url, prompt)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=client, args=(p,)) for p in PROMPTS[1:]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for prompt in PROMPTS[1:]:
        _check_stream(got[prompt], reference, prompt)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", "malformed JSON"),
        (b'{"prompt": "a", "max_tokens": 3}', "max_tokens"),
        (b'{"prompt": "a", "max_new_tokens": -1}', "max_new_tokens"),
    ],
)
def test_bad_requests_are_answered_400(url: str, body: bytes, field: str) -> None:
    status, kind, payload = _post(url, body)
    assert status == 400, payload
    assert kind.startswith("application/json")
    doc = json.loads(payload)
    assert doc["error"] == "RequestError"
    assert field in doc["message"]


def test_metadata_names_the_model(url: str) -> None:
    with urllib.request.urlopen(f"{url}/metadata", timeout=HTTP_TIMEOUT_S) as r:
        meta = json.load(r)
    assert meta["model"] == "tiny_llm"
    assert meta["replica"]["app"] == "gen"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[1]", "expected an object"),
        (b'{"max_new_tokens": 3}', "prompt"),
        (b'{"prompt": "a", "top_p": 0}', "top_p"),
        (b'{"prompt": "a", "temperature": -0.5}', "temperature"),
        (b'{"prompt": "a", "stream": "yes"}', "stream"),
        (b'{"prompt": "a", "stop": [1]}', "stop"),
        (b'{"prompt": "a", "seed": true}', "seed"),
        (b'{"prompt": "a", "max_new_tokens": 2.5}', "max_new_tokens"),
    ],
)
def test_parse_request_names_the_bad_field(body: bytes, message: str) -> None:
    with pytest.raises(RequestError, match=message) as e:
        parse_request(body)
    assert e.value.status == 400


def test_parse_request_keeps_the_settings() -> None:
    got = parse_request(b'{"prompt": "hi", "top_k": 5, "stop": "x", "seed": 3, "stream": true}')
    assert (got.prompt, got.top_k, got.stop, got.seed, got.stream) == ("hi", 5, ("x",), 3, True)
    assert (got.max_new_tokens, got.temperature, got.top_p) == (64, 0.0, 1.0)
