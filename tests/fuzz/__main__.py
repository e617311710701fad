"""`python -m tests.fuzz --cases 5000 [--seed N]`: counts per outcome (disagreements between
`Device.cpu()` and the reference included) and the first failures."""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

from tests.fuzz import runner
from tests.fuzz.runner import CORPORA, FAILURES, FIXTURES, Outcome, build_case, run_case, run_cases


def describe(seed: int, index: int, corpus: str, max_fixtures: int) -> list[str]:
    """What case `index` does (rebuilt here: a hung or crashed worker could not say)."""
    with tempfile.TemporaryDirectory() as d:
        return build_case(seed, index, Path(d), corpus, max_fixtures).description


def report(
    outcomes: list[Outcome], seed: int, corpus: str, max_fixtures: int, show: int = 5
) -> str:
    counts = collections.Counter(o.label for o in outcomes)
    lines = [f"{label:<55} {n:>6}" for label, n in sorted(counts.items())]
    for kind in FAILURES:
        if kind not in counts:
            lines.append(f"{kind:<55} {0:>6}")
    flags = "" if corpus == "all" else f" --corpus {corpus}"
    flags += "" if max_fixtures == len(FIXTURES) else f" --fixtures {max_fixtures}"
    bad = [o for o in outcomes if o.kind in FAILURES]
    wrapped = [o for o in outcomes if o.kind == "KnError" and " <- " in o.detail]
    lenient = [o for o in outcomes if o.kind in ("lenient", "refused")]
    round_off = [o for o in outcomes if o.kind == "round-off"]
    groups = (
        ("failures", bad),
        ("executor-wrapped NumPy errors", wrapped),
        ("product runs the reference refuses, or refused for memory", lenient),
        ("round-off a discrete op or a wider cast made visible (not failures)", round_off),
    )
    for title, group in groups:
        if not group:
            continue
        lines.append(f"\nfirst {min(show, len(group))} of {len(group)} {title}:")
        for o in group[:show]:
            lines.append(
                f"- case {o.index} ({o.kind}): python -m tests.fuzz --seed {seed} --case {o.index}{flags}"
            )
            for d in o.description or describe(seed, o.index, corpus, max_fixtures):
                lines.append(f"    {d}")
            lines.append("    " + o.detail.rstrip().replace("\n", "\n    "))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    p.add_argument("--cases", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--first", type=int, default=0, help="index of the first case")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per case")
    p.add_argument("--corpus", choices=CORPORA, default="all", help="models to mutate")
    p.add_argument("--fixtures", type=int, default=len(FIXTURES), help="use the N smallest")
    p.add_argument("--case", type=int, help="run one case in this process and print it")
    p.add_argument("--show", type=int, default=5, help="failures to print")
    p.add_argument(
        "--threads", type=int, default=runner.THREADS, help="threads of the product Device.cpu()"
    )
    p.add_argument(
        "--save",
        type=Path,
        help="with --case: write the mutated model (DIR/model.onnx) and its inputs (DIR/inputs.npz)",
    )
    a = p.parse_args(argv)
    runner.THREADS = a.threads
    if a.case is not None:
        with tempfile.TemporaryDirectory() as d:
            o = run_case(a.seed, a.case, Path(d), a.corpus, a.fixtures, save=a.save)
        print("\n".join(o.description))
        print(f"-> {o.label} ({o.seconds:.2f} s)")
        if o.detail and o.kind != "KnError":
            print(o.detail)
        return 1 if o.kind in FAILURES else 0
    start = time.perf_counter()
    cases = range(a.first, a.first + a.cases)
    outcomes = run_cases(a.seed, cases, a.workers, a.timeout, a.corpus, a.fixtures)
    took = time.perf_counter() - start
    print(
        f"{len(outcomes)} cases (seed {a.seed}, from {a.first}) in {took:.1f} s "
        f"on {a.workers} workers (Device.cpu(threads={a.threads}) against the reference)"
    )
    print(report(outcomes, a.seed, a.corpus, a.fixtures, a.show))
    return 1 if any(o.kind in FAILURES for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
