"""Sampling (`kn_runtime.generate.sampling`) on fixed logits, against distributions computed here
independently (plain Python over sorted probabilities) and Hugging Face's documented rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from kn_graph.errors import ArgumentTypeError, ArgumentValueError
from kn_runtime.generate.sampling import (
    SamplingParams,
    choose,
    filter_top_k,
    filter_top_p,
    penalize_repetition,
    probabilities,
)

LOGITS = np.array([[2.0, -1.0, 0.5, 3.0, 1.0, -2.0, 0.0, 2.5]], np.float32)
NONE_SEEN = np.zeros(LOGITS.shape, bool)


def _softmax(xs: list[float]) -> list[float]:
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    return [v / sum(e) for v in e]


def _expected(logits: list[float], temperature: float, k: int, p: float) -> list[float]:
    """Top-k then top-p, renormalized, by sorting in plain Python."""
    scaled = [x / temperature for x in logits]
    ranked = sorted(range(len(scaled)), key=lambda i: -scaled[i])
    kept = ranked[:k] if k else ranked
    probs = _softmax([scaled[i] for i in kept])
    nucleus, mass = [], 0.0
    for i, q in zip(kept, probs, strict=True):
        if mass >= p:
            break
        nucleus.append(i)
        mass += q
    z = sum(math.exp(scaled[i]) for i in nucleus)
    return [math.exp(scaled[i]) / z if i in nucleus else 0.0 for i in range(len(logits))]


def test_greedy_is_the_argmax() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 50)).astype(np.float32)
    got = choose(logits, SamplingParams(), np.zeros_like(logits, bool), rng)
    np.testing.assert_array_equal(got, np.argmax(logits, axis=-1))


def test_top_k_keeps_exactly_the_k_largest() -> None:
    out = filter_top_k(LOGITS, 3)
    assert set(np.flatnonzero(np.isfinite(out[0]))) == {0, 3, 7}
    np.testing.assert_array_equal(out[0, [0, 3, 7]], LOGITS[0, [0, 3, 7]])
    assert filter_top_k(LOGITS, 0) is LOGITS


def test_top_k_sampling_never_leaves_the_top_k() -> None:
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(200, 30)).astype(np.float32) * 3
    params = SamplingParams(temperature=2.0, top_k=4)
    top4 = np.argsort(-logits, axis=-1)[:, :4]
    for _ in range(20):
        got = choose(logits, params, np.zeros_like(logits, bool), rng)
        assert all(g in row for g, row in zip(got, top4, strict=True))


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = _softmax(LOGITS[0].tolist())  # ranks: 3 (.39), 7 (.24), 0 (.14), 4 (.05)...
    order = np.argsort(-np.array(probs))
    for p in (0.1, 0.39, 0.5, 0.7, 0.9, 0.999):
        cum = np.cumsum(np.array(probs)[order])
        want = set(order[: int(np.searchsorted(cum, p)) + 1].tolist())
        got = set(np.flatnonzero(np.isfinite(filter_top_p(LOGITS, p)[0])).tolist())
        assert got == want, p
        assert sum(probs[i] for i in got) >= p - 1e-12
    assert set(np.flatnonzero(np.isfinite(filter_top_p(LOGITS, 1e-9)[0]))) == {3}


def test_temperature_scales_the_logits() -> None:
    for t in (0.5, 1.0, 3.0):
        got = probabilities(LOGITS, SamplingParams(temperature=t), NONE_SEEN)[0]
        np.testing.assert_allclose(got, _softmax([x / t for x in LOGITS[0].tolist()]), rtol=1e-12)


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    seen = np.zeros(LOGITS.shape, bool)
    seen[0, [0, 1, 6]] = True  # 2.0, -1.0, 0.0
    got = penalize_repetition(LOGITS, seen, 2.0)[0]
    want = LOGITS[0].copy()
    want[0], want[1], want[6] = 1.0, -2.0, 0.0
    np.testing.assert_array_equal(got, want)
    # greedy with the penalty: token 3 (3.0) seen becomes 1.5 < 2.5 (token 7)
    seen3 = np.zeros(LOGITS.shape, bool)
    seen3[0, 3] = True
    rng = np.random.default_rng(0)
    assert choose(LOGITS, SamplingParams(repetition_penalty=2.0), seen3, rng)[0] == 7


def test_sampling_is_reproducible_by_seed() -> None:
    logits = np.random.default_rng(3).normal(size=(4, 100)).astype(np.float32)
    params = SamplingParams(temperature=1.3, top_k=20, top_p=0.9)
    seen = np.zeros_like(logits, bool)

    def draws(seed: int) -> list[list[int]]:
        rng = np.random.default_rng(seed)
        return [choose(logits, params, seen, rng).tolist() for _ in range(50)]

    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


@pytest.mark.parametrize(
    ("temperature", "k", "p"), [(1.0, 4, 1.0), (0.7, 0, 0.8), (1.5, 5, 0.9), (1.0, 0, 1.0)]
)
def test_sampling_frequencies_match_the_renormalized_distribution(
    temperature: float, k: int, p: float
) -> None:
    """20,000 draws (one batch of identical rows, seed 0): no token outside the kept set, and a
    chi-square goodness of fit over the kept ones at the 0.1 % level (with the seed fixed the
    outcome is fixed; a wrong distribution — a top-k or top-p off by one token, the temperature
    not applied — gives p-values below 1e-10 here)."""
    n = 20_000
    want = np.array(_expected(LOGITS[0].tolist(), temperature, k, p))
    params = SamplingParams(temperature=temperature, top_k=k, top_p=p)
    logits = np.repeat(LOGITS, n, axis=0)
    got = choose(logits, params, np.zeros_like(logits, bool), np.random.default_rng(0))
    counts = np.bincount(got, minlength=LOGITS.shape[1])
    assert counts[want == 0].sum() == 0
    kept = want > 0
    assert stats.chisquare(counts[kept], want[kept] * n).pvalue > 1e-3
    # the same test rejects the same set at 1.5 times the temperature
    wrong = np.array(_softmax((LOGITS[0, kept] / (temperature * 1.5)).tolist()))
    if kept.sum() > 1:
        assert stats.chisquare(counts[kept], wrong * n).pvalue < 1e-6


def test_bad_sampling_arguments_are_our_errors() -> None:
    with pytest.raises(ArgumentValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ArgumentValueError, match="temperature"):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ArgumentTypeError, match="top_k"):
        SamplingParams(top_k=1.5)  # type: ignore[arg-type]
