"""`load_generator(folder)` → `Generator`: text generation with an LLM folder on a device.
`generate` returns every row's ids and text at the end; `stream` yields each token as it is
chosen. One `Generator` may serve several threads at once: each call keeps its own cache and
rows, and the model's steps take turns (`DecoderModel` holds a lock around each evaluation), so
concurrent requests interleave token by token — the simple form of serving; batching requests
that arrive together into one batch is the serving layer's job."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from kn_graph.errors import ArgumentTypeError, ArgumentValueError, ModelFolderError
from kn_runtime.generate.folder import ModelSpec, read_folder
from kn_runtime.generate.loop import LoopSettings, run
from kn_runtime.generate.model import DecoderModel
from kn_runtime.generate.result import GenerationResult, TokenEvent
from kn_runtime.generate.sampling import SamplingParams
from kn_runtime.generate.signature import read_signature
from kn_runtime.generate.tokenizer import Tokenizer, load_tokenizer

__all__ = ["DEFAULT_MAX_BINDINGS", "TINY_LLM", "GenerationStream", "Generator", "load_generator"]

TINY_LLM = Path(__file__).resolve().parents[1] / "models" / "tiny_llm"
"""The shipped default model (random weights, character tokenizer): `kn-generate` without a
folder; how it was made: kn_runtime/models/tiny_llm/README.md."""

DEFAULT_MAX_BINDINGS = 64
"""Executors kept per decoder (`Device.prepare(max_bindings=...)`). The growing cache makes every
past length a binding of its own: a generation of N tokens after a P-token prompt creates N
bindings (a prefill plus N-1 decode steps; P+N-1 for a model fed one token at a time), each used
once. Keeping 64 lets a second generation of similar length (a chat turn, a benchmark run) reuse
them, while bounding what a long generation holds; a kept executor costs its plan and compiled
steps, not a copy of the weights (they are shared)."""

Prompt = str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]]


class GenerationStream:
    """The token events of one generation (iterate it); `result` once it is exhausted."""

    def __init__(self, events: Iterator[TokenEvent]) -> None:
        self._events = events
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[TokenEvent]:
        self.result = yield from self._events


class Generator:
    """A decoder, its tokenizer and the folder's ids (eos, pad, context length) on a device."""

    def __init__(self, spec: ModelSpec, model: DecoderModel, tokenizer: Tokenizer) -> None:
        self.spec = spec
        self.model = model
        self.tokenizer = tokenizer
        vocab = model.signature.vocab or spec.vocab_size
        if vocab is None:
            raise ModelFolderError(
                f"{spec.folder}: the vocabulary size is neither in the graph's logits nor in "
                "the config (vocab_size)"
            )
        if tokenizer.vocab_size > vocab:
            raise ModelFolderError(
                f"{spec.tokenizer_path}: the tokenizer has {tokenizer.vocab_size} tokens but the "
                f"model's logits have {vocab}: the tokenizer belongs to another model; put the "
                "model's own tokenizer.json in the folder"
            )
        self.vocab = vocab
        self.eos = frozenset(spec.eos_token_ids)
        pad = spec.pad_token_id
        self.pad = pad if pad is not None else (min(self.eos) if self.eos else 0)

    def encode(self, prompt: Prompt) -> list[list[int]]:
        """Token ids per row: a string, a list of strings, a list of ids or a list of lists."""
        if isinstance(prompt, str):
            return [self._encode_text(prompt)]
        if not isinstance(prompt, Sequence) or len(prompt) == 0:
            raise ArgumentTypeError(
                "prompt must be a string, a non-empty list of strings, a list of token ids or "
                f"a list of lists of ids, found {prompt!r:.80}"
            )
        if all(isinstance(p, str) for p in prompt):
            return [self._encode_text(p) for p in prompt]  # type: ignore[arg-type]
        if all(_is_id(t) for t in prompt):
            return [self._checked_ids(prompt)]  # type: ignore[arg-type]
        if all(isinstance(p, Sequence) and not isinstance(p, str) for p in prompt):
            return [self._checked_ids(p) for p in prompt]  # type: ignore[arg-type]
        raise ArgumentTypeError(f"prompt mixes strings, ids and lists: {prompt!r:.80}")

    def _encode_text(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text)
        bos = self.spec.bos_token_id
        if bos is not None and (not ids or ids[0] != bos) and self.spec.layout == "genai":
            ids = [bos, *ids]  # genai's tokenizer adds it; a HF tokenizer.json says itself
        if not ids:
            raise ArgumentValueError(f"prompt {text!r} encodes to no tokens: give some text")
        return ids

    def _checked_ids(self, ids: Sequence[Any]) -> list[int]:
        if len(ids) == 0 or not all(_is_id(t) for t in ids):
            raise ArgumentTypeError(f"a prompt row must be a non-empty list of ints: {ids!r:.80}")
        bad = [int(t) for t in ids if not 0 <= int(t) < self.vocab]
        if bad:
            raise ArgumentValueError(
                f"token ids {bad[:5]} are outside the vocabulary [0, {self.vocab})"
            )
        return [int(t) for t in ids]

    def stream(
        self,
        prompt: Prompt,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
    ) -> GenerationStream:
        """The token events as they come (`TokenEvent`: row, id, text piece, finish); the
        stream's `result` holds the `GenerationResult` once it is exhausted. Arguments as
        `generate`."""
        started = time.perf_counter()
        rows, settings = self.settings(
            prompt, max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed, stop
        )
        return GenerationStream(
            run(self.model, self.tokenizer, rows, self.vocab, settings, started)
        )

    def settings(
        self,
        prompt: Prompt,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
    ) -> tuple[list[list[int]], LoopSettings]:
        """The prompt's rows of ids and the loop's settings, checked (arguments as `generate`)."""
        params = SamplingParams(float(temperature), top_k, float(top_p), float(repetition_penalty))
        rows = self.encode(prompt)
        settings = LoopSettings(
            params,
            _checked_count(max_new_tokens),
            _checked_stops(stop),
            self.eos,
            self.pad,
            self.spec.context_length,
            seed,
        )
        context = self.spec.context_length
        longest = max(len(r) for r in rows)
        if context is not None and longest > context:
            raise ArgumentValueError(
                f"the prompt has {longest} tokens but the model's context is {context} "
                f"({_context_source(self.spec)}): shorten the prompt"
            )
        return rows, settings

    def generate(
        self,
        prompt: Prompt,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
    ) -> GenerationResult:
        """Generate up to `max_new_tokens` per row. `prompt`: a string, a list of strings (one
        row each, left-padded into one batch), token ids or a list of id lists. `temperature`
        0 is greedy; otherwise the draw is from the distribution after `repetition_penalty`
        (Hugging Face's), `top_k` (0: off) and `top_p` (1.0: off), reproducible with `seed`.
        A row ends on an eos id of the folder, on one of the `stop` strings (its text then
        ends before it), after `max_new_tokens` or at the context length."""
        stream = self.stream(
            prompt, max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed, stop
        )
        for _ in stream:
            pass
        assert stream.result is not None
        return stream.result

    def close(self) -> None:
        """Let go of the executors (the prepared graph builds them again when used)."""
        self.model.prepared.close()

    def __repr__(self) -> str:
        return (
            f"<Generator {self.spec.folder} ({self.spec.layout}), vocab {self.vocab}, "
            f"{len(self.model.signature.past)} cache tensors, on {self.model.prepared.device}>"
        )


def _is_id(t: object) -> bool:
    import numpy as np

    return isinstance(t, int | np.integer) and not isinstance(t, bool)


def _checked_count(n: object) -> int:
    if not _is_id(n) or int(n) < 1:  # type: ignore[call-overload]
        raise ArgumentValueError(f"max_new_tokens must be an int >= 1, found {n!r}")
    return int(n)  # type: ignore[call-overload]


def _checked_stops(stop: object) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,) if stop else ()
    if isinstance(stop, Sequence) and all(isinstance(s, str) for s in stop):
        return tuple(s for s in stop if s)
    raise ArgumentTypeError(f"stop must be a string or a list of strings, found {stop!r:.80}")


def _context_source(spec: ModelSpec) -> str:
    if spec.layout == "genai":
        return "genai_config.json model.context_length"
    return "config.json max_position_embeddings"


def _mask_apart(graph: Any, path: Path) -> Any:
    """The model loaded again with `attention_mask`'s length a symbol of its own when the export
    named it like the new tokens' (older Optimum merged decoders declare both `sequence_length`,
    though the mask covers past + new tokens; onnxruntime does not hold dim names to equality,
    our loader does)."""
    from kn_graph import Graph, Size
    from kn_graph.onnx import load_onnx

    if not isinstance(graph, Graph):
        return graph
    shapes = dict(zip(graph.input_names, (graph.shape(v) for v in graph.inputs), strict=True))
    mask, ids = shapes.get("attention_mask"), shapes.get("input_ids")
    has_past = any(n.startswith("past") for n in shapes)
    if mask is None or ids is None or mask.rank != 2 or ids.rank != 2 or not has_past:
        return graph
    if mask[1] != ids[1] or mask[1].is_fixed:
        return graph
    return load_onnx(path, input_shapes={"attention_mask": [mask[0], Size.sym("mask_length")]})


def _positions_from_mask(path: Path) -> bool:
    """Whether every attention of the model is GroupQueryAttention with its rotary inside
    (`do_rotary`): each row's positions and keys then come from seqlens_k, which
    onnxruntime-genai's folders compute from the attention mask's row sums, so a past padded at
    its end with masked zeros is exact (`DecoderModel.positions_from_mask`). Refused where
    anything else could count positions (rotary or attention ops of other kinds, a Range over
    a shape, control flow)."""
    import onnx
    from google.protobuf.message import DecodeError

    try:  # load_onnx read it already: the graph proto alone, weights left where they are
        nodes = onnx.load(str(path), load_external_data=False).graph.node
    except (OSError, DecodeError):
        return False
    others = {"RotaryEmbedding", "Attention", "MultiHeadAttention", "Range", "If", "Loop", "Scan"}
    gqa = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    return (
        bool(gqa)
        and not any(n.op_type in others for n in nodes)
        and all(any(a.name == "do_rotary" and a.i == 1 for a in n.attribute) for n in gqa)
    )


def load_generator(
    folder: str | Path | None = None, device: Any = None, *, max_bindings: int | None = None
) -> Generator:
    """A `Generator` for an LLM folder (None: the shipped tiny model, `TINY_LLM`) on `device`
    (a `kn_runtime.Device`; None: `Device.cpu()`). `max_bindings`: executors kept per decoder
    (None: `DEFAULT_MAX_BINDINGS`). Raises ModelFolderError for a folder that lacks a file,
    has an unknown layout, or whose tokenizer does not fit the model."""
    from kn_graph import Graph
    from kn_graph.onnx import load_onnx
    from kn_runtime.device import Device
    from kn_runtime.generate.trim import trim_outputs

    spec = read_folder(TINY_LLM if folder is None else folder)
    tokenizer = load_tokenizer(spec.tokenizer_path)
    loaded = _mask_apart(load_onnx(spec.model_path), spec.model_path)
    signature = read_signature(
        loaded, spec.names, spec.kv_heads, spec.head_dim, str(spec.model_path)
    )
    # the logits of the last position, the new keys and values
    appends = isinstance(loaded, Graph) and trim_outputs(loaded, signature)
    device = Device.cpu() if device is None else device
    prepared = device.prepare(loaded, max_bindings=max_bindings or DEFAULT_MAX_BINDINGS)
    model = DecoderModel(
        prepared,
        signature,
        appends=appends,
        # genai's builder writes its weights apart (model.onnx.data): reading the nodes again
        # is cheap there, where an Optimum file (weights inside, no GroupQueryAttention from
        # its exporters) would be parsed a second time whole
        positions_from_mask=spec.layout == "genai" and _positions_from_mask(spec.model_path),
    )
    return Generator(spec, model, tokenizer)
