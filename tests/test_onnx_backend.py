"""The ONNX backend node tests shipped in the `onnx` package, through our loader and CPU executor.

The committed list `onnx_backend/passing.txt` may only grow: each listed test must still pass. No
test may end in a wrong answer (mismatch) or in an exception that is not ours (internal).
"""

from __future__ import annotations

import collections

import pytest

from tests.onnx_backend.runner import PASSING, Outcome, run_all


@pytest.fixture(scope="module")
def outcomes() -> dict[str, Outcome]:
    return {o.name: o for o in run_all()}


def test_every_listed_test_still_passes(outcomes: dict[str, Outcome]) -> None:
    listed = PASSING.read_text().split()
    regressed = [
        f"{n}: {outcomes[n].status} {outcomes[n].detail}"
        for n in listed
        if outcomes.get(n, Outcome(n, "missing")).status != "pass"
    ]
    assert not regressed, "\n".join(regressed)


def test_no_wrong_answers(outcomes: dict[str, Outcome]) -> None:
    bad = [f"{o.name}: {o.detail}" for o in outcomes.values() if o.status == "mismatch"]
    assert not bad, "\n".join(bad)


def test_no_internal_errors(outcomes: dict[str, Outcome]) -> None:
    bad = [f"{o.name}: {o.detail}" for o in outcomes.values() if o.status == "internal"]
    assert not bad, "\n".join(bad)


def test_pass_count_reported(outcomes: dict[str, Outcome]) -> None:
    counts = collections.Counter(o.status for o in outcomes.values())
    print(f"\nONNX backend node tests: {dict(counts)}")
    assert len(outcomes) == 1884  # onnx 1.23 (pinned in the test extra)
    assert counts["pass"] >= len(PASSING.read_text().split())
