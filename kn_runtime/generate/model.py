"""The decoder of an LLM folder on a device: one `PreparedGraph`, evaluated once per step with
the inputs fed by name. The KV cache is the NumPy arrays the last step returned (the growing
form: each step's `present` is the next step's `past`); every past length is a new binding of
the graph's size symbols, so a device plans (and on the CPU compiles) each length once and keeps
`max_bindings` of them. A merged Optimum decoder gets `use_cache_branch` False on its first
step (empty past) and True after; a model that takes one token per step is fed a prompt token
by token."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from kn_runtime.generate.signature import DecoderSignature

__all__ = ["Cache", "DecoderModel"]

Cache = dict[str, np.ndarray]
"""Past tensors by input name, [batch, kv heads, length, head size]."""


def positions_of(mask: np.ndarray, count: int) -> np.ndarray:
    """Position ids of the last `count` columns of an attention mask, counted from each row's
    first real token (left padding), as Hugging Face computes them (pads get 1)."""
    pos = np.cumsum(mask, axis=-1) - 1
    pos = np.where(mask == 0, 1, pos)
    return pos[:, -count:].astype(np.int64)


CACHE_BUCKET = 32
"""Decode steps feed the past padded to a multiple of this many positions (masked, zeros), so
the graph's past length takes one value per this many tokens: a device plans (and on the CPU
compiles) a new binding every 32 tokens instead of every token."""


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
    padded to a multiple of `bucket` positions — zeros the attention mask hides (0 in the mask:
    a masked key's softmax weight is exactly 0, so its zero key and value add nothing) — and the
    new key and value are taken back out of the present. Exact only where the model reads
    positions from `position_ids` (a model that counts them from the past length, or from the
    mask's row sums like GroupQueryAttention's seqlens, would see the padding), and where the
    mask masks past keys: so only models with both inputs, position_ids used, bucket."""

    def __init__(
        self, prepared: Any, signature: DecoderSignature, bucket: int | None = None
    ) -> None:
        self.prepared = prepared
        self.signature = signature
        exact = signature.attention_mask is not None and _reads(prepared, signature.position_ids)
        self.bucket = (CACHE_BUCKET if exact else 1) if bucket is None else max(1, int(bucket))
        self._lock = threading.Lock()
        self.steps = 0
        """Evaluations so far (a prompt fed token by token counts one per token)."""

    def empty_cache(self, batch: int) -> Cache:
        return {
            p.name: np.zeros((batch, p.heads, 0, p.head_dim), p.dtype) for p in self.signature.past
        }

    def forward(self, ids: np.ndarray, mask: np.ndarray, cache: Cache) -> tuple[np.ndarray, Cache]:
        """Run `ids` [batch, S] after the cache; `mask` [batch, past + S] covers both. Returns
        the logits of the last position [batch, vocab] (float32) and the cache with S more."""
        fixed = self.signature.step_tokens
        past = mask.shape[1] - ids.shape[1]
        if self.bucket > 1 and ids.shape[1] == 1 and past % self.bucket:
            return self._padded_step(ids, mask, cache, past)
        if fixed is None or fixed == ids.shape[1]:
            return self._step(ids, mask, cache)
        if fixed != 1:
            from kn_graph.errors import ModelFolderError

            raise ModelFolderError(
                f"the model takes exactly {fixed} tokens per step; only 1 (fed token by token) "
                "or any number is supported"
            )
        logits = np.empty((0,), np.float32)
        for j in range(ids.shape[1]):
            logits, cache = self._step(ids[:, j : j + 1], mask[:, : past + j + 1], cache)
        return logits, cache

    def _padded_step(
        self, ids: np.ndarray, mask: np.ndarray, cache: Cache, past: int
    ) -> tuple[np.ndarray, Cache]:
        """One decode token after a past padded to the next multiple of `bucket` (class
        docstring); the returned cache holds the real positions only."""
        pad = -past % self.bucket
        b = ids.shape[0]
        padded = {
            k: np.concatenate([v, np.zeros((*v.shape[:2], pad, v.shape[3]), v.dtype)], axis=2)
            for k, v in cache.items()
        }
        holes = np.zeros((b, pad), mask.dtype)
        logits, present = self._step(
            ids,
            np.concatenate([mask[:, :past], holes, mask[:, past:]], axis=1),
            padded,
            positions=positions_of(mask, 1),
        )
        return logits, {
            k: np.concatenate([v[:, :, :past], v[:, :, -1:]], axis=2) for k, v in present.items()
        }

    def _step(
        self, ids: np.ndarray, mask: np.ndarray, cache: Cache, positions: np.ndarray | None = None
    ) -> tuple[np.ndarray, Cache]:
        sig = self.signature
        feed: dict[str, np.ndarray] = {sig.input_ids: ids.astype(np.int64), **cache}
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
            outs = self.prepared.eval(feed)
            self.steps += 1
        by_name = dict(zip(sig.outputs, outs, strict=True))
        logits = np.asarray(by_name[sig.logits])[:, -1, :].astype(np.float32)
        return logits, {p.name: np.asarray(by_name[p.present]) for p in sig.past}
