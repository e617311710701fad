"""Text generation behind a server, whatever the engine: the JSON request every front end reads
(`parse_request`, checked field by field into a `GenerationRequest`), the lines a streamed
answer is made of (`event_line`, `end_line`) and the body of one that is not (`answer`).
`ray_generation.GenerationDeployment` serves them over HTTP."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kn_graph.errors import RequestError
from kn_runtime.generate.batcher import Batcher
from kn_runtime.serve.codec import json_object

if TYPE_CHECKING:
    from kn_runtime.generate.generator import Generator
    from kn_runtime.generate.result import GenerationResult, TokenEvent

__all__ = [
    "FIELDS",
    "GenerationRequest",
    "answer",
    "check_request",
    "end_line",
    "error_line",
    "event_line",
    "parse_request",
    "start",
]

FIELDS = (
    "prompt",
    "max_new_tokens",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "seed",
    "stop",
    "stream",
)
"""The keys a request may have (only `prompt` is required); any other is refused, so that a
misspelt setting (`max_tokens`) is an error rather than silently the default."""


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One checked request: `Generator.stream`'s arguments (defaults as there) and whether the
    answer is streamed."""

    prompt: str
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False


def _int(doc: dict[str, Any], key: str, low: int) -> int | None:
    v = doc.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise RequestError(f"{key}: expected an integer >= {low}, found {v!r:.80}")
    return v


def _float(doc: dict[str, Any], key: str, ok: str, test: Any) -> float | None:
    v = doc.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not test(v):
        raise RequestError(f"{key}: expected {ok}, found {v!r:.80}")
    return float(v)


def parse_request(body: bytes) -> GenerationRequest:
    """The request in a JSON body, or a `RequestError` (400) naming the field, what it takes and
    what was found: a body that is not a JSON object, a key not in `FIELDS`, a missing or empty
    prompt, a value of the wrong type or range (`max_new_tokens` >= 1, `temperature` >= 0,
    `top_k` >= 0, `top_p` in (0, 1], `repetition_penalty` > 0, `seed` >= 0, `stop` a string or
    a list of strings, `stream` a boolean). Checked here, so a bad request is answered before
    any generation starts."""
    return check_request(json_object(body, 'an object {"prompt": ...}'))


def check_request(doc: dict[str, Any]) -> GenerationRequest:
    """The request in `doc` (a decoded JSON object, or the tensors of a Triton request turned
    into Python values), checked as `parse_request` says."""
    unknown = sorted(set(doc) - set(FIELDS))
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r}: expected some of {', '.join(FIELDS)}")
    prompt = doc.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise RequestError(f"prompt: expected a non-empty string, found {prompt!r:.80}")
    stop = doc.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise RequestError(f"stop: expected a string or a list of strings, found {stop!r:.80}")
    stream = doc.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(f"stream: expected true or false, found {stream!r:.80}")
    settings: dict[str, Any] = {
        "max_new_tokens": _int(doc, "max_new_tokens", 1),
        "top_k": _int(doc, "top_k", 0),
        "temperature": _float(doc, "temperature", "a number >= 0", lambda v: v >= 0),
        "top_p": _float(doc, "top_p", "a number in (0, 1]", lambda v: 0 < v <= 1),
        "repetition_penalty": _float(doc, "repetition_penalty", "a number > 0", lambda v: v > 0),
    }
    request = GenerationRequest(
        prompt,
        seed=_int(doc, "seed", 0),
        stop=tuple(s for s in stop or () if s),
        stream=stream,
        **{k: v for k, v in settings.items() if v is not None},
    )
    return request


def start(generator: Generator | Batcher, request: GenerationRequest) -> Any:
    """The request's generation: a `Generator`'s, not yet begun (nothing is evaluated until it
    is iterated), or submitted to a `Batcher` (decoded together with the others under way).
    What the generator refuses (a prompt longer than the context) is raised here, before an
    answer starts. Its errors are `ArgumentValueError`/`ArgumentTypeError`, which servers
    answer 400."""
    begin = generator.submit if isinstance(generator, Batcher) else generator.stream
    return begin(
        request.prompt,
        max_new_tokens=request.max_new_tokens,
        temperature=request.temperature,
        top_k=request.top_k,
        top_p=request.top_p,
        repetition_penalty=request.repetition_penalty,
        seed=request.seed,
        stop=list(request.stop),
    )


def _line(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, ensure_ascii=False).encode() + b"\n"


def event_line(event: TokenEvent) -> bytes:
    """One token of a streamed answer: `{"text": ...}` and a newline (the text it releases,
    possibly empty: part of a character, or text that may begin a stop string)."""
    return _line({"text": event.text})


def end_line(result: GenerationResult) -> bytes:
    """The last line of a streamed answer: why it ended and how many tokens it generated."""
    return _line({"finish_reason": result.finish_reasons[0], "tokens": len(result.ids[0])})


def error_line(exc: BaseException) -> bytes:
    """The last line of a streamed answer that failed after it began (its status was sent
    already): `{"error", "message"}` as `codec.encode_error` writes them."""
    from kn_runtime.serve import codec

    return codec.encode_error(exc)[1] + b"\n"


def answer(result: GenerationResult) -> bytes:
    """The body of an answer that is not streamed: the text, the generated ids and why it
    ended."""
    return json.dumps(
        {
            "text": result.text,
            "ids": list(result.ids[0]),
            "finish_reason": result.finish_reasons[0],
        },
        ensure_ascii=False,
    ).encode()
