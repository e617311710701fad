"""The decoder of an LLM folder on a device: one `PreparedGraph`, evaluated once per step with
the inputs fed by name. The KV cache is a host buffer per cache input (`Cache`): each step is
fed a view of its filled positions and writes its new ones after them (the graph's presents cut
to the new positions by `trim`); every past length is a new binding of the graph's size
symbols, so a device plans (and on the CPU compiles) each length once and keeps `max_bindings`
of them. A merged Optimum decoder gets `use_cache_branch` False on its first
step (empty past) and True after; a model that takes one token per step is fed a prompt token
by token."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kn_runtime.generate.signature import DecoderSignature, PastSpec

__all__ = ["Cache", "DecoderModel"]


class Cache:
    """The past of one generation: per cache input a buffer [batch, kv heads, capacity, head
    size] whose first `length` positions hold the keys or values so far, the rest zeros. A step
    is fed views of the first `length` (or, padded, more) positions — zeros a mask hides — and
    its new positions are written after them: the cache is never rebuilt per token (it was
    concatenated twice per token, padded and trimmed, before). The capacity doubles when it
    runs out, so a generation copies it O(log n) times."""

    def __init__(self, specs: Sequence[PastSpec], batch: int) -> None:
        self.length = 0
        self._buf = {p.name: np.zeros((batch, p.heads, 0, p.head_dim), p.dtype) for p in specs}

    @property
    def capacity(self) -> int:
        return min((b.shape[2] for b in self._buf.values()), default=0)

    def view(self, upto: int | None = None) -> dict[str, np.ndarray]:
        """The first `upto` positions (default `length`) of every buffer, as views."""
        n = self.length if upto is None else upto
        self._reserve(n)
        return {k: b[:, :, :n] for k, b in self._buf.items()}

    @classmethod
    def _of(cls, bufs: dict[str, np.ndarray], length: int) -> Cache:
        c = cls.__new__(cls)
        c.length, c._buf = length, bufs
        return c

    def select(self, rows: Sequence[int]) -> Cache:
        """A cache of these batch rows (copied)."""
        return Cache._of(
            {k: b[rows, :, : self.length].copy() for k, b in self._buf.items()}, self.length
        )

    def shifted(self, front: int, drop: int = 0) -> Cache:
        """A copy with `front` zero positions before the past, less its first `drop` positions
        (rows joining a batch of a longer past are left-padded; positions no row reads go)."""
        return self._copied(front, drop, self.length, self.length - drop + front)

    def resized(self, length: int) -> Cache:
        """A copy holding `length` positions: the past, then zeros (a GroupQueryAttention row,
        whose keys sit at the front, padded at its end to a longer batch's past), or the first
        `length` (positions after every row's end dropped)."""
        return self._copied(0, 0, min(length, self.length), length)

    def _copied(self, front: int, start: int, stop: int, length: int) -> Cache:
        """A copy of `length` positions holding positions [start, stop) from `front` on."""
        out = {}
        for k, b in self._buf.items():
            grown = np.zeros((b.shape[0], b.shape[1], length, b.shape[3]), b.dtype)
            grown[:, :, front : front + stop - start] = b[:, :, start:stop]
            out[k] = grown
        return Cache._of(out, length)

    @staticmethod
    def stacked(caches: Sequence[Cache]) -> Cache:
        """The rows of caches of one length, one batch."""
        length = caches[0].length
        names = list(caches[0]._buf)
        return Cache._of(
            {k: np.concatenate([c._buf[k][:, :, :length] for c in caches]) for k in names}, length
        )

    def adopt(self, bufs: Mapping[str, np.ndarray], length: int) -> None:
        """Take `bufs` (fresh arrays, zeros after `length` positions) as the buffers: a
        GroupQueryAttention present is the whole cache, each row's keys at its front."""
        self._buf = dict(bufs)
        self.length = length

    def positions(self, name: str, start: int, stop: int) -> np.ndarray:
        """Positions [start, stop) of buffer `name`, as a view."""
        return self._buf[name][:, :, start:stop]

    def overwrite(self, past: Mapping[str, np.ndarray]) -> None:
        """Replace the first `length` positions by the model's own (a present that is not
        past + new: `trim.trim_outputs`)."""
        for k, v in past.items():
            self._buf[k][:, :, : self.length] = v[:, :, : self.length]

    def append(self, new: Mapping[str, np.ndarray]) -> None:
        """Write the new positions [batch, kv heads, S, head size] after the first `length`."""
        s = next(iter(new.values())).shape[2] if new else 0
        self._reserve(self.length + s)
        for k, v in new.items():
            self._buf[k][:, :, self.length : self.length + s] = v
        self.length += s

    def _reserve(self, n: int) -> None:
        if n <= self.capacity:
            return
        cap = max(n, 2 * self.capacity, 64)
        for k, b in self._buf.items():
            grown = np.zeros((*b.shape[:2], cap, b.shape[3]), b.dtype)
            grown[:, :, : self.length] = b[:, :, : self.length]
            self._buf[k] = grown


def positions_of(mask: np.ndarray, count: int) -> np.ndarray:
    """Position ids of the last `count` columns of an attention mask, counted from each row's
    first real token (left padding), as Hugging Face computes them (pads get 1)."""
    pos = np.cumsum(mask, axis=-1) - 1
    pos = np.where(mask == 0, 1, pos)
    return pos[:, -count:].astype(np.int64)


CACHE_BUCKET = 32
"""Decode steps feed the past padded to a multiple of this many positions (masked, zeros), or
of a quarter of the largest power of two not above the past when that is more
(`padded_length`), so the graph's past length takes one value per this many tokens: a device
plans (and on the CPU compiles) a new binding every 32 tokens instead of every token, and at
most four per doubling of the context (a 512-token prompt's decode: every 128 tokens), each
padding by less than a quarter of the past."""


def padded_length(past: int, bucket: int) -> int:
    """The past length a decode step is fed (`CACHE_BUCKET`): `past` rounded up to a multiple of
    max(bucket, 2^floor(log2 past) / 4); `past` itself for a bucket of 1."""
    if bucket <= 1 or past <= 0:
        return past
    step = max(bucket, (1 << (past.bit_length() - 1)) // 4)
    return -(-past // step) * step


def _reads(prepared: Any, name: str | None) -> bool:
    """Whether the prepared graph has input `name` and uses it (an export may declare a
    position_ids it ignores, counting positions from the past length instead)."""
    from kn_graph.errors import KnError

    if name is None:
        return False
    try:
        graph = prepared.graph
    except KnError:  # one graph per input value: nothing to look at, no padding
        return False
    by_name = dict(zip(graph.input_names, graph.inputs, strict=True))
    return name in by_name and graph.use_count(by_name[name]) > 0


class DecoderModel:
    """`forward(ids, mask, cache)`: the last position's logits and the extended cache.
    Thread-safe: one step at a time (a lock around the evaluation), so several generations
    may share one model, their steps interleaved.

    `bucket` (default `CACHE_BUCKET` where it is exact, else 1): a decode step's past is fed
    padded to `padded_length(past, bucket)` positions — zeros the attention mask hides (0 in the mask:
    a masked key's softmax weight is exactly 0, so its zero key and value add nothing) — and the
    new key and value are taken back out of the present. Exact where the model reads positions
    from `position_ids` and the mask masks past keys, and where it counts each row's positions
    and keys from the mask's row sums (`positions_from_mask`: GroupQueryAttention's seqlens_k,
    rotary inside, as onnxruntime-genai's folders have it: the zeros after a row's past are
    keys it never reads, and its new key goes right after its past); not where a model counts
    positions from the past length, which the padding would shift."""

    def __init__(
        self,
        prepared: Any,
        signature: DecoderSignature,
        bucket: int | None = None,
        *,
        appends: bool = False,
        positions_from_mask: bool = False,
    ) -> None:
        self.prepared = prepared
        self.signature = signature
        self.appends = appends
        """Every present is the past plus the new positions (`trim.trim_outputs` cut them to
        the new ones): the cache keeps its past and appends; else each step's whole present
        (its first positions as the model wrote them) replaces it."""
        exact = signature.attention_mask is not None and _reads(prepared, signature.position_ids)
        self.pads_exactly = exact
        """Positions come from `position_ids` and the mask hides past keys: a past padded at
        its front (or its end) gives the row's logits unpadded (a model that counts positions
        from the past length shifts a padded row's rotary distances)."""
        self.positions_from_mask = positions_from_mask
        """Each row's positions and keys come from the mask's row sums (class docstring): a past
        padded at its end is exact, at its front it is not."""
        padded = exact or positions_from_mask
        self.bucket = (CACHE_BUCKET if padded else 1) if bucket is None else max(1, int(bucket))
        self._lock = threading.Lock()
        self._mirror: tuple[Cache, Any, int, int] | None = None
        """(cache, executor, its arena's runs after the step, positions of that cache the arena
        holds): the past a step left in the executor's arena (`_in_arena`)."""
        self.steps = 0
        """Evaluations so far (a prompt fed token by token counts one per token)."""

    def _in_arena(self, feed: dict[str, np.ndarray], cache: Cache) -> Any:
        """Where the device keeps the past in its arena between steps (the CPU backend with the
        past placed in the attention's concat buffer, `HostExecutor.kept_inputs`): the executor
        this step runs, None elsewhere (each step then copies the past in). When the previous
        step was this cache's on the same executor and nothing else ran on its arena since, the
        arena already holds the past up to that step: only the positions appended since are
        written there, and the feed names the arena's own views, which the executor does not
        copy. Otherwise this step copies the whole past in once (a new padded length, another
        generation in between) and later steps build on it."""
        names = [p.name for p in self.signature.past]
        if not self.appends or not names:
            return None
        get = getattr(self.prepared, "resident_executor", None)
        ex = get(feed) if get is not None else None
        if ex is None or not set(names) <= ex.kept_inputs:
            self._mirror = None
            return None
        m = self._mirror
        if m is not None and m[0] is cache and m[1] is ex and m[2] == ex.arena_runs:
            have = m[3]
            for name in names:
                view = ex.input_view(name)
                view[:, :, have : cache.length] = cache.positions(name, have, cache.length)
                feed[name] = view
        return ex

    def empty_cache(self, batch: int) -> Cache:
        return Cache(self.signature.past, batch)

    def forward(self, ids: np.ndarray, mask: np.ndarray, cache: Cache) -> tuple[np.ndarray, Cache]:
        """Run `ids` [batch, S] after the cache; `mask` [batch, past + S] covers both. Returns
        the logits of the last position [batch, vocab] (float32) and the cache, S longer."""
        fixed = self.signature.step_tokens
        past = mask.shape[1] - ids.shape[1]
        if past != cache.length:
            from kn_graph.errors import ArgumentValueError

            raise ArgumentValueError(
                f"forward: the mask covers {past} past positions, the cache holds {cache.length}"
            )
        if ids.shape[1] == 1 and padded_length(past, self.bucket) != past:
            return self._padded_step(ids, mask, cache, past), cache
        if fixed is None or fixed == ids.shape[1]:
            return self._step(ids, mask, cache, cache.view()), cache
        if fixed != 1:
            from kn_graph.errors import ModelFolderError

            raise ModelFolderError(
                f"the model takes exactly {fixed} tokens per step; only 1 (fed token by token) "
                "or any number is supported"
            )
        logits = np.empty((0,), np.float32)
        for j in range(ids.shape[1]):
            logits = self._step(ids[:, j : j + 1], mask[:, : past + j + 1], cache, cache.view())
        return logits, cache

    def _padded_step(
        self, ids: np.ndarray, mask: np.ndarray, cache: Cache, past: int
    ) -> np.ndarray:
        """One decode token after a past padded to `padded_length` (class docstring): the
        cache's zeros past its length are the padding."""
        pad = padded_length(past, self.bucket) - past
        holes = np.zeros((ids.shape[0], pad), mask.dtype)
        return self._step(
            ids,
            np.concatenate([mask[:, :past], holes, mask[:, past:]], axis=1),
            cache,
            cache.view(past + pad),
            positions=positions_of(mask, 1),
        )

    def _step(
        self,
        ids: np.ndarray,
        mask: np.ndarray,
        cache: Cache,
        past: Mapping[str, np.ndarray],
        positions: np.ndarray | None = None,
    ) -> np.ndarray:
        """One evaluation; the new positions (the last S of each present) go into `cache`."""
        sig = self.signature
        feed: dict[str, np.ndarray] = {sig.input_ids: ids.astype(np.int64), **past}
        if sig.attention_mask is not None:
            feed[sig.attention_mask] = mask.astype(np.int64)
        if sig.position_ids is not None:
            feed[sig.position_ids] = (
                positions if positions is not None else positions_of(mask, ids.shape[1])
            )
        if sig.use_cache_branch is not None:
            has_past = mask.shape[1] > ids.shape[1]
            feed[sig.use_cache_branch] = np.array([has_past], dtype=bool)
        with self._lock:
            ex = self._in_arena(feed, cache)
            outs = self.prepared.eval(feed)
            self.steps += 1
            if ex is not None:  # the arena holds the past fed, up to the cache's length now
                self._mirror = (cache, ex, ex.arena_runs, cache.length)
        by_name = dict(zip(sig.outputs, outs, strict=True))
        s = ids.shape[1]
        presents = {p.name: np.asarray(by_name[p.present]) for p in sig.past}
        if self.positions_from_mask:  # the whole cache, the new keys after each row's past
            cache.adopt(presents, cache.length + s)  # fresh arrays: no copy
        else:
            if not self.appends:
                cache.overwrite(presents)
            cache.append({k: v[:, :, -s:] for k, v in presents.items()})  # after the padding
        return np.asarray(by_name[sig.logits])[:, -1, :].astype(np.float32)
