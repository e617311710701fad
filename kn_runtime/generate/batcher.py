"""Continuous batching: concurrent generations share each decode step.

A decode step of an LLM on the CPU reads every weight once whatever the batch (Qwen2-0.5B: 2 GB
of fp32 weights a token), so eight requests decoded together cost little more than one. The
`Batcher` runs one loop on a thread of its own: a request that arrives is prefilled alone (its
prompt, batch 1), its first token sent, and its cache joins the batch at the next step — left-
padded to the batch's past (or the batch's to its own, when it is longer; attention masks hide
the padding, position ids count each row's own tokens) — and a row that ends leaves it, with the
positions no remaining row reads. Each request keeps its own sampling settings, random
generator, stop strings and limits; its events come through its own queue.

Only for models whose cache appends (`DecoderModel.appends`: every present is the past plus
the new positions) and whose padding is exact (`DecoderModel.pads_exactly`: positions from
`position_ids`), and for GroupQueryAttention exports (`DecoderModel.positions_from_mask`:
onnxruntime-genai's folders), whose rows keep their keys at the front of the cache and count
positions from the mask's row sums: their pasts are padded at the end instead (a row's new key
goes right after its own past), the masks still at the front (only their sums are read). A
model that counts positions from the past length would give a row joined with padding
positions its prefill did not (its rotary distances off by the padding): its requests run one
at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from kn_graph.errors import ArgumentValueError, KnError
from kn_runtime.generate.loop import LoopSettings
from kn_runtime.generate.model import Cache
from kn_runtime.generate.result import GenerationResult, Timing, TokenEvent
from kn_runtime.generate.sampling import choose
from kn_runtime.generate.text import RowText

__all__ = ["Batcher"]

_END = object()


@dataclass(eq=False)
class _Request:
    ids: list[int]
    settings: LoopSettings
    text: RowText
    seen: np.ndarray  # [1, vocab] bool: the tokens of the prompt and of the row so far
    rng: np.random.Generator
    started: float
    events: queue.Queue = field(default_factory=queue.Queue)  # type: ignore[type-arg]
    wake: Callable[[], None] | None = None  # an async reader's: called after each event
    cancelled: bool = False  # its reader went away: the row leaves at the next step
    finish: str | None = None
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    decode_tokens: int = 0
    result: GenerationResult | None = None

    def take(self, token: int) -> TokenEvent | None:
        """The request's next token: its event, with the finish reason when it ends now."""
        if self.finish is not None:
            return None
        s = self.settings
        self.seen[0, token] = True
        piece = self.text.add(token)
        produced = len(self.text.ids)
        full = s.context is not None and len(self.ids) + produced >= s.context
        last = "length" if produced >= s.max_new_tokens else "context" if full else None
        reason = "eos" if token in s.eos else "stop" if self.text.stopped else last
        if reason is not None:
            piece += "" if self.text.stopped else self.text.flush()
            self.finish = reason
        return TokenEvent(0, token, piece, reason)

    def emit(self, event: object) -> None:
        """Hand `event` (a `TokenEvent`, an exception or the end) to the request's reader."""
        self.events.put(event)
        wake = self.wake
        if wake is not None:
            with contextlib.suppress(RuntimeError):  # the reader's loop has closed
                wake()

    def done(self) -> None:
        self.result = GenerationResult(
            prompt_ids=(tuple(self.ids),),
            ids=(tuple(self.text.ids),),
            texts=(self.text.text,),
            finish_reasons=(self.finish or "length",),
            timing=Timing(
                len(self.ids), self.prefill_s, self.ttft_s, self.decode_tokens, self.decode_s
            ),
        )
        self.emit(_END)


class BatchedStream:
    """One request's token events as they come; `result` once exhausted (as
    `GenerationStream`). Read it with `for` (blocks the thread between tokens) or, on an event
    loop, with `async for` (waits without a thread: the loop is woken by each event), which is
    how an asyncio server streams many requests from one thread."""

    def __init__(self, request: _Request) -> None:
        self._r = request
        self.result: GenerationResult | None = None

    def _event(self, e: object) -> TokenEvent | None:
        """A token event, or None at the end (the result then set); raises a failure."""
        if e is _END:
            self.result = self._r.result
            return None
        if isinstance(e, BaseException):
            raise e
        return e  # type: ignore[return-value]

    def __iter__(self) -> Iterator[TokenEvent]:
        while (e := self._event(self._r.events.get())) is not None:
            yield e

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        self._r.wake = lambda: loop.call_soon_threadsafe(ready.set)
        try:
            while True:
                ready.clear()  # before looking: an event put after the look sets it again
                try:
                    got = self._r.events.get_nowait()
                except queue.Empty:
                    await ready.wait()
                    continue
                if (e := self._event(got)) is None:
                    return
                yield e
        finally:
            self._r.wake = None
            if self.result is None:  # the reader stopped early (a client went away)
                self.cancel()

    def cancel(self) -> None:
        """Stop generating for this request: it leaves the batch at the next step (its finish
        reason "cancelled"); the events it made so far stay readable."""
        self._r.cancelled = True


class Batcher:
    """Concurrent generations of one `Generator`, decoded together (module docstring).
    `submit` is thread-safe; `max_batch` rows at most share a step (the rest wait for a
    place)."""

    def __init__(self, generator: object, max_batch: int = 8) -> None:
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ArgumentValueError(f"Batcher: max_batch must be an int >= 1, found {max_batch!r}")
        self.gen = generator
        self.model = generator.model  # type: ignore[attr-defined]
        self._at_end = bool(getattr(self.model, "positions_from_mask", False))
        """Pasts are padded at their end (GroupQueryAttention rows), not at their front."""
        joins = (self.model.appends and self.model.pads_exactly) or self._at_end
        self.max_batch = max_batch if joins else 1
        self.steps = 0
        """Batched decode steps run so far (each a single evaluation for every active row)."""
        self.largest_batch = 0
        """The most rows one step has run."""
        self.cancelled = 0
        """Requests that ended because their reader went away."""
        self._pending: queue.Queue[_Request | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(
        self,
        prompt: str | Sequence[int],
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
    ) -> BatchedStream:
        """One prompt (a string or token ids), arguments as `Generator.generate`; its events
        stream as the shared loop produces them."""
        started = time.perf_counter()
        rows, s = self.gen.settings(  # type: ignore[attr-defined]
            prompt, max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed, stop
        )
        if len(rows) != 1:
            raise ArgumentValueError(f"Batcher.submit takes one prompt, found {len(rows)} rows")
        seen = np.zeros((1, self.gen.vocab), bool)  # type: ignore[attr-defined]
        seen[0, [t for t in rows[0] if 0 <= t < seen.shape[1]]] = True
        req = _Request(
            rows[0],
            s,
            RowText(self.gen.tokenizer, s.stops),  # type: ignore[attr-defined]
            seen,
            np.random.default_rng(s.seed),
            started,
        )
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="kn-batcher", daemon=True)
                self._thread.start()
        self._pending.put(req)
        return BatchedStream(req)

    def waiting(self) -> int:
        """How many submitted requests the loop has not taken yet."""
        return self._pending.qsize()

    def close(self) -> None:
        """Stop the loop once the requests it has run out (new ones are not taken)."""
        with self._lock:
            if self._thread is not None:
                self._pending.put(None)
                self._thread.join()
                self._thread = None

    # -- the loop ------------------------------------------------------------------------------
    def _loop(self) -> None:
        active: list[_Request] = []
        cache: Cache | None = None
        mask = np.zeros((0, 0), np.int64)
        tokens = np.zeros(0, np.int64)
        closing = False
        while active or not closing:
            try:
                while len(active) < self.max_batch and not closing:
                    req = self._pending.get(block=not active)
                    if req is None:
                        closing = True
                        break
                    joined = self._prefill(req)
                    if joined is not None:
                        cache, mask, tokens = _join(cache, mask, tokens, *joined, self._at_end)
                        active.append(req)
            except queue.Empty:
                pass
            if not active:
                continue
            try:
                cache, mask, tokens, active = self._step(cache, mask, tokens, active)  # type: ignore[arg-type]
            except BaseException as e:  # every active request gets the error, the loop goes on
                for r in active:
                    r.emit(e if isinstance(e, KnError) else RuntimeError(str(e)))
                active, cache = [], None
                mask, tokens = np.zeros((0, 0), np.int64), np.zeros(0, np.int64)

    def _prefill(self, req: _Request) -> tuple[Cache, np.ndarray, int] | None:
        """The request's prompt alone: its first token sent; (its cache, its mask, that token)
        to join the batch, or None when it ended already (or failed, or was cancelled)."""
        if req.cancelled:
            req.finish = "cancelled"
            self.cancelled += 1
            req.done()
            return None
        try:
            ids = np.array([req.ids], np.int64)
            mask = np.ones_like(ids)
            t = time.perf_counter()
            logits, cache = self.model.forward(ids, mask, self.model.empty_cache(1))
            req.prefill_s = time.perf_counter() - t
            token = int(
                choose(logits[:, : self.gen.vocab], req.settings.params, req.seen, req.rng)[0]
            )  # type: ignore[attr-defined]
        except BaseException as e:
            req.emit(e if isinstance(e, KnError) else RuntimeError(str(e)))
            return None
        event = req.take(token)
        req.ttft_s = time.perf_counter() - req.started
        assert event is not None
        req.emit(event)
        if req.finish is not None:
            req.done()
            return None
        return cache, mask, token

    def _step(
        self, cache: Cache, mask: np.ndarray, tokens: np.ndarray, active: list[_Request]
    ) -> tuple[Cache, np.ndarray, np.ndarray, list[_Request]]:
        """One decode step of every active row; rows that end leave the batch."""
        mask = np.concatenate([mask, np.ones((len(active), 1), np.int64)], axis=1)
        t = time.perf_counter()
        logits, cache = self.model.forward(tokens[:, None], mask, cache)
        dt = time.perf_counter() - t
        self.steps += 1
        self.largest_batch = max(self.largest_batch, len(active))
        vocab = self.gen.vocab  # type: ignore[attr-defined]
        for i, r in enumerate(active):
            tok = int(choose(logits[i : i + 1, :vocab], r.settings.params, r.seen, r.rng)[0])
            tokens[i] = tok
            if r.cancelled and r.finish is None:
                r.finish = "cancelled"
                self.cancelled += 1
            event = r.take(tok)
            r.decode_s += dt
            if event is not None:
                r.decode_tokens += 1
                r.emit(event)
        keep = [i for i, r in enumerate(active) if r.finish is None]
        for r in active:
            if r.finish is not None:
                r.done()
        if len(keep) == len(active):
            return cache, mask, tokens, active
        active = [active[i] for i in keep]
        if not active:
            return cache, np.zeros((0, 0), np.int64), np.zeros(0, np.int64), active
        mask = mask[keep]
        drop = int(np.argmax(mask.any(axis=0)))  # columns no remaining row reads
        kept = cache.select(keep)
        kept = kept.resized(kept.length - drop) if self._at_end else kept.shifted(0, drop)
        return kept, mask[:, drop:], tokens[keep], active


def _join(
    cache: Cache | None,
    mask: np.ndarray,
    tokens: np.ndarray,
    new: Cache,
    new_mask: np.ndarray,
    token: int,
    at_end: bool = False,
) -> tuple[Cache, np.ndarray, np.ndarray]:
    """The batch with one more row: both pasts padded to the longer one, at their front (or
    with `at_end` at their end), the masks at their front."""
    if cache is None or len(tokens) == 0:
        return new, new_mask, np.array([token], np.int64)
    length = max(cache.length, new.length)
    a, b = length - cache.length, length - new.length

    def padded(c: Cache, n: int) -> Cache:
        return c if not n else c.resized(length) if at_end else c.shifted(n)

    joined = Cache.stacked([padded(cache, a), padded(new, b)])
    pad = np.zeros((mask.shape[0], a), np.int64)
    rows = np.concatenate([pad, mask], axis=1)
    row = np.concatenate([np.zeros((1, b), np.int64), new_mask], axis=1)
    return joined, np.concatenate([rows, row]), np.append(tokens, token)
