"""A seeded mutation fuzzer over the committed fixtures (tests/models/*.onnx): every case must
load and run, or fail with one `KnError` — never another exception, a hang or a crash.

    python -m tests.fuzz --cases 5000 [--seed N] [--workers 2]   # the long run
    python -m tests.fuzz --seed N --case I                        # one case, in this process

`tests/test_fuzz.py` runs a few hundred cases in CI.
"""

from tests.fuzz.runner import FIXTURES, Outcome, build_case, run_case, run_cases

__all__ = ["FIXTURES", "Outcome", "build_case", "run_case", "run_cases"]
