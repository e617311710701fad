"""Choosing the next token from a step's logits, in NumPy, in Hugging Face's order: repetition
penalty, temperature, top-k, top-p, then a draw from the renormalized distribution (or the
argmax when the temperature is 0). Every function takes logits [batch, vocab] and is pure; the
randomness is one seeded `np.random.Generator` per generation, so a seed reproduces a run."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kn_graph.errors import ArgumentTypeError, ArgumentValueError

__all__ = [
    "SamplingParams",
    "choose",
    "filter_top_k",
    "filter_top_p",
    "penalize_repetition",
    "probabilities",
]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """`temperature` 0 is greedy; `top_k` 0 and `top_p` 1.0 keep every token;
    `repetition_penalty` 1.0 changes nothing (> 1 discourages tokens already in the row)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "repetition_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v):
                raise ArgumentTypeError(f"{name} must be a finite number, found {v!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int | np.integer):
            raise ArgumentTypeError(f"top_k must be an int, found {self.top_k!r}")
        if self.temperature < 0 or self.top_k < 0 or self.repetition_penalty <= 0:
            raise ArgumentValueError(
                f"temperature and top_k must be >= 0 and repetition_penalty > 0, found "
                f"{self.temperature}, {self.top_k}, {self.repetition_penalty}"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ArgumentValueError(f"top_p must be in (0, 1], found {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def penalize_repetition(logits: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """As Hugging Face's `RepetitionPenaltyLogitsProcessor`: the logit of every token already in
    the row (`seen`, bool [batch, vocab]) divided by `penalty` when positive, multiplied by it
    when negative, so that penalty > 1 always makes it less likely."""
    if penalty == 1.0:
        return logits
    scaled = np.where(logits > 0, logits / penalty, logits * penalty)
    return np.where(seen, scaled, logits).astype(logits.dtype)


def filter_top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """Logits with all but the k largest of each row at -inf (ties at the k-th value broken
    toward the lower token id, so exactly k stay); k = 0 or >= vocab keeps them all."""
    vocab = logits.shape[-1]
    if k == 0 or k >= vocab:
        return logits
    order = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    out = np.full_like(logits, -np.inf)
    np.put_along_axis(out, order, np.take_along_axis(logits, order, axis=-1), axis=-1)
    return out


def filter_top_p(logits: np.ndarray, p: float) -> np.ndarray:
    """Nucleus filtering: per row, the smallest set of most likely tokens whose probability
    sums to at least p keeps its logits, the rest go to -inf (the most likely token always
    stays); p = 1 keeps them all."""
    if p >= 1.0:
        return logits
    probs = _softmax(logits)
    order = np.argsort(-logits, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(probs, order, axis=-1)
    before = np.cumsum(sorted_p, axis=-1) - sorted_p  # mass of the tokens ranked above
    keep_sorted = before < p
    keep_sorted[:, 0] = True
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return np.where(keep, logits, -np.inf)


def _softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(axis=-1, keepdims=True)


def probabilities(logits: np.ndarray, params: SamplingParams, seen: np.ndarray) -> np.ndarray:
    """The distribution a sampling step draws from (float64 [batch, vocab]): penalty,
    temperature, top-k, top-p, softmax. Not for greedy (temperature 0)."""
    x = penalize_repetition(logits.astype(np.float64), seen, params.repetition_penalty)
    x = x / params.temperature
    return _softmax(filter_top_p(filter_top_k(x, params.top_k), params.top_p))


def choose(
    logits: np.ndarray, params: SamplingParams, seen: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """The next token of each row (int64 [batch]): the argmax of the penalized logits when
    greedy, else one draw per row (one uniform number each, in row order) from
    `probabilities`."""
    if params.greedy:
        x = penalize_repetition(logits, seen, params.repetition_penalty)
        return np.argmax(x, axis=-1).astype(np.int64)
    probs = probabilities(logits, params, seen)
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random(len(probs)) * cdf[:, -1]
    picks = np.array([np.searchsorted(c, x, side="right") for c, x in zip(cdf, u, strict=True)])
    # a draw that lands exactly on the total (rounding) takes the last token with mass
    last = probs.shape[-1] - 1 - np.argmax(probs[:, ::-1] > 0, axis=-1)
    return np.minimum(picks, last).astype(np.int64)
