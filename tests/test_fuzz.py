"""The mutation fuzzer in CI: a few hundred seeded cases over the committed fixtures and the ONNX
backend node models; each must run or fail with one KnError — no other exception, no hang, no
crash. The long run is `python -m tests.fuzz --cases 5000 [--seed N]`."""

from __future__ import annotations

import collections

from tests.fuzz.__main__ import report
from tests.fuzz.runner import FIXTURES, run_cases

CASES = 400
SEED = 20240601


def test_fuzzed_models_run_or_raise_one_kn_error() -> None:
    outcomes = run_cases(SEED, range(CASES), workers=2, timeout=30.0)
    counts = collections.Counter(o.kind for o in outcomes)
    assert len(outcomes) == CASES
    bad = [o for o in outcomes if o.kind in ("internal", "hang", "crash")]
    assert not bad, report(bad, SEED, "all", len(FIXTURES))
    # the fuzzer must still reach evaluation and our errors, not fail everything in one place
    assert counts["ran"] > CASES // 10 and counts["KnError"] > CASES // 3, counts


def _misbehave(seed: int, index: int, workdir, corpus: str = "all", max_fixtures: int = 0):
    """A stand-in for run_case (the forked workers inherit it): case 0 hangs, case 1 crashes."""
    import os
    import signal
    import time

    from tests.fuzz.runner import Outcome

    if index == 0:
        time.sleep(60)
    if index == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    return Outcome(index, "ran", "", [f"case {index}"])


def test_the_pool_reports_hangs_and_crashes_and_goes_on(monkeypatch) -> None:
    import tests.fuzz.runner as runner

    monkeypatch.setattr(runner, "run_case", _misbehave)
    outcomes = runner.run_cases(0, range(5), workers=2, timeout=1.0, corpus="fixtures")
    assert [o.kind for o in outcomes] == ["hang", "crash", "ran", "ran", "ran"]
    assert "exit code -11" in outcomes[1].detail
