"""The generation loop: left-pad the prompts, run the prefill, then one step per token until
every row has ended. Rows end on their own (an eos id, a stop string, `max_new_tokens`, the
context length); a finished row is still fed (the pad token, attention 1) so the batch keeps one
shape, and emits nothing more."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from kn_runtime.generate.model import DecoderModel
from kn_runtime.generate.result import GenerationResult, Timing, TokenEvent
from kn_runtime.generate.sampling import SamplingParams, choose
from kn_runtime.generate.text import RowText
from kn_runtime.generate.tokenizer import Tokenizer

__all__ = ["LoopSettings", "run"]


@dataclass(frozen=True, slots=True)
class LoopSettings:
    """One generation's settings (checked by `Generator`)."""

    params: SamplingParams
    max_new_tokens: int
    stops: tuple[str, ...]
    eos: frozenset[int]
    pad: int
    context: int | None
    seed: int | None


def left_padded(rows: Sequence[Sequence[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Ids [batch, longest] with pads on the left, and the mask (0 on pads)."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = r
        mask[i, width - len(r) :] = 1
    return ids, mask


class _Rows:
    """Each row's text, finish reason and the tokens seen (for the repetition penalty)."""

    def __init__(
        self, prompts: Sequence[Sequence[int]], vocab: int, tok: Tokenizer, s: LoopSettings
    ) -> None:
        self.texts = [RowText(tok, s.stops) for _ in prompts]
        self.finish: list[str | None] = [None] * len(prompts)
        self.seen = np.zeros((len(prompts), vocab), bool)
        for i, p in enumerate(prompts):
            self.seen[i, [t for t in p if 0 <= t < vocab]] = True
        self.eos = s.eos

    def take(self, tokens: np.ndarray, last: str | None) -> list[TokenEvent]:
        """Give each live row its token; `last` is the reason every row still live ends now
        ("length", "context"), if any."""
        events = []
        for i, t in enumerate(tokens.tolist()):
            if self.finish[i] is not None:
                continue
            row = self.texts[i]
            self.seen[i, t] = True
            piece = row.add(t)
            reason = "eos" if t in self.eos else "stop" if row.stopped else last
            if reason is not None:
                piece += "" if row.stopped else row.flush()
                self.finish[i] = reason
            events.append(TokenEvent(i, t, piece, reason))
        return events

    @property
    def done(self) -> bool:
        return all(f is not None for f in self.finish)


def run(
    model: DecoderModel,
    tokenizer: Tokenizer,
    prompts: Sequence[Sequence[int]],
    vocab: int,
    s: LoopSettings,
    started: float,
) -> Iterator[TokenEvent]:
    """Yield the token events; return (StopIteration.value) the `GenerationResult`.
    `started` is the call's `time.perf_counter()` (time to first token counts from it)."""
    rng = np.random.default_rng(s.seed)
    rows = _Rows(prompts, vocab, tokenizer, s)
    ids, mask = left_padded(prompts, s.pad)
    t0 = time.perf_counter()
    logits, cache = model.forward(ids, mask, model.empty_cache(len(prompts)))
    prefill = time.perf_counter() - t0
    ttft = decode_s = 0.0
    decode_tokens = 0
    tokens = ids[:, -1]
    for step in range(s.max_new_tokens):
        if step > 0:
            t = time.perf_counter()
            logits, cache = model.forward(tokens[:, None], mask, cache)
            decode_s += time.perf_counter() - t
        tokens = choose(logits[:, :vocab], s.params, rows.seen, rng)
        tokens = np.where([f is None for f in rows.finish], tokens, s.pad)
        full = s.context is not None and mask.shape[1] + 1 >= s.context
        last = "length" if step == s.max_new_tokens - 1 else "context" if full else None
        events = rows.take(tokens, last)
        if step == 0:
            ttft = time.perf_counter() - started
        else:
            decode_tokens += len(events)
        yield from events
        if rows.done:
            break
        mask = np.concatenate([mask, np.ones((len(prompts), 1), np.int64)], axis=1)
    return GenerationResult(
        prompt_ids=tuple(tuple(p) for p in prompts),
        ids=tuple(tuple(r.ids) for r in rows.texts),
        texts=tuple(r.text for r in rows.texts),
        finish_reasons=tuple(f or "length" for f in rows.finish),
        timing=Timing(sum(len(p) for p in prompts), prefill, ttft, decode_tokens, decode_s),
    )
