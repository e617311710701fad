"""CUDA planning time against graph size: long elementwise chains and general graphs (conv, matmul,
softmax, reduce, views, elementwise) of 1k, 5k and 20k values, and what `Plan.validate()` costs
against planning on the fixture corpus.

    python benchmarks/plan_scaling.py [--sizes 1000 5000 20000] [--repeat 3] [--nvrtc]
        [--json OUT.json] [--before BEFORE.json] [--no-append]
    PYTHONPATH=/path/to/other/checkout python benchmarks/plan_scaling.py --kinds chain \\
        --sizes 1000 3000 --json before.json --no-append          # the other side

Each time is the median of --repeat plans of the graph at batch 2. `--before` adds the columns
of an earlier run (e.g. of the parent commit through PYTHONPATH); `--nvrtc` also times NVRTC on
one fused kernel of 64..2048 ops (what the `max_kernel_ops` cap is chosen from). The tables are
printed and, unless --no-append, appended to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # appended: a PYTHONPATH checkout (the "before" side) wins

from timing import median_time  # noqa: E402  (benchmarks/ is the script folder)

import kn_cuda_eval  # noqa: E402
from kn_cuda_eval import plan  # noqa: E402
from kn_cuda_eval.cuda.kernels.dispatch import plan_launches  # noqa: E402


def _big_graphs():  # type: ignore[no-untyped-def]
    """tests/kn_cuda_eval/big_graphs.py of this checkout, by path (the other side may lack it)."""
    spec = importlib.util.spec_from_file_location(
        "big_graphs", ROOT / "tests" / "cuda_eval" / "big_graphs.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def scaling(kinds: list[str], sizes: list[int], repeat: int) -> list[dict]:
    bg = _big_graphs()
    rows = []
    for kind in kinds:
        for n in sizes:
            g = bg.chain_graph(n) if kind == "chain" else bg.general_graph(n)
            t, p = median_time(lambda g=g: plan(g, 2), repeat)
            tv, _ = median_time(p.validate, repeat)  # type: ignore[attr-defined]
            rows.append(
                {
                    "kind": kind,
                    "n": n,
                    "values": len(g),
                    "plan_s": t,
                    "validate_s": tv,
                    "steps": len(p.steps),  # type: ignore[attr-defined]
                    "buffers": len(p.buffers),  # type: ignore[attr-defined]
                }
            )
            print(
                f"{kind:8} {n:>6} values {len(g):>6}: plan {t:8.3f} s, validate {tv:7.3f} s, "
                f"{rows[-1]['steps']} steps",
                flush=True,
            )
    return rows


def corpus_validate(repeat: int) -> dict:
    """Planning and validation time over the corpus (every data set, as given and optimized)."""
    from kn_graph.optimizer import optimize
    from tests.kn_cuda_eval.corpus import FIXTURES, cases

    t_plan = t_val = 0.0
    n = 0
    worst = (0.0, "")
    for fx in FIXTURES:
        try:
            cs = cases(fx["name"])
        except Exception:
            continue
        for graph, _, binds in cs:
            for g in (graph, optimize(graph)):
                tp, p = median_time(lambda g=g, b=binds: plan(g, bindings=b), repeat)
                tv, _ = median_time(p.validate, repeat)  # type: ignore[attr-defined]
                t_plan += tp
                t_val += tv
                n += 1
                worst = max(worst, (tv / tp, fx["name"]))
    print(f"corpus: {n} plans, plan {t_plan:.3f} s, validate {t_val:.3f} s", flush=True)
    return {"plans": n, "plan_s": t_plan, "validate_s": t_val, "worst": list(worst)}


def nvrtc_costs() -> list[tuple[int, float, float]]:
    from kn_cuda_eval import PlanSettings
    from kn_cuda_eval.cuda.kernels import distinct_kernels
    from kn_cuda_eval.cuda.kernels.compile import _compile

    bg = _big_graphs()
    out = []
    for n in (64, 128, 256, 512, 1024, 2048):
        p = plan(bg.chain_graph(n), 2, settings=PlanSettings(max_kernel_ops=10**9))
        (k,) = distinct_kernels(plan_launches(p))
        ts = []
        for arch in (80, 90):
            t0 = time.perf_counter()
            _compile(k, arch)  # uncached
            ts.append(time.perf_counter() - t0)
        out.append((n, ts[0], ts[1]))
        print(f"nvrtc {n:5} ops: sm_80 {ts[0]:.3f} s, sm_90 {ts[1]:.3f} s", flush=True)
    return out


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x * 1000:,.0f}" if x >= 1 else f"{x * 1000:.1f}"


def tables(res: dict, before: dict | None) -> str:
    old = {(r["kind"], r["n"]): r for r in (before or {}).get("rows", [])}
    lines = [
        "| graph | values | steps | plan ms before | plan ms after | validate ms before "
        "| validate ms after | plan µs per value after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["kind"], r["n"]) for r in res["rows"]} | set(old))
    new = {(r["kind"], r["n"]): r for r in res["rows"]}
    for key in keys:
        r, o = new.get(key), old.get(key)
        ref = r or o
        assert ref is not None
        per_value = "—" if r is None else f"{r['plan_s'] / r['values'] * 1e6:.0f}"
        steps = f"{r['steps']:,}" if r else f"{o['steps']:,} (before)" if o else "—"
        lines.append(
            f"| {key[0]} {key[1]:,} | {ref['values']:,} | {steps} "
            f"| {_fmt(o['plan_s'] if o else None)} | {_fmt(r['plan_s'] if r else None)} "
            f"| {_fmt(o['validate_s'] if o else None)} | {_fmt(r['validate_s'] if r else None)} "
            f"| {per_value} |"
        )
    c = res.get("corpus")
    if c:
        lines += [
            "",
            f"Fixture corpus, {c['plans']} plans (every data set, as given and optimized): "
            f"planning {c['plan_s'] * 1000:,.0f} ms, `validate()` {c['validate_s'] * 1000:,.0f} ms "
            f"({100 * c['validate_s'] / c['plan_s']:.1f} % of planning; worst fixture "
            f"{c['worst'][1]} at {100 * c['worst'][0]:.0f} %).",
        ]
        cb = (before or {}).get("corpus")
        if cb:
            lines[-1] += (
                f" Before: planning {cb['plan_s'] * 1000:,.0f} ms, `validate()` "
                f"{cb['validate_s'] * 1000:,.0f} ms ({100 * cb['validate_s'] / cb['plan_s']:.1f} %)."
            )
    if res.get("nvrtc"):
        lines += ["", "| fused kernel ops | NVRTC sm_80 s | NVRTC sm_90 s |", "|---|---|---|"]
        lines += [f"| {n:,} | {a:.3f} | {b:.3f} |" for n, a, b in res["nvrtc"]]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 20000])
    ap.add_argument("--kinds", nargs="+", default=["chain", "general"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-corpus", action="store_true")
    ap.add_argument("--nvrtc", action="store_true")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--before", type=Path, help="results of an earlier run to compare with")
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--date", default=datetime.date.today().isoformat(), help="section date")
    args = ap.parse_args()

    print(f"kn_cuda_eval from {Path(kn_cuda_eval.__file__).parent}", flush=True)
    res: dict = {"rows": scaling(args.kinds, args.sizes, args.repeat)}
    if not args.no_corpus:
        res["corpus"] = corpus_validate(args.repeat)
    if args.nvrtc:
        res["nvrtc"] = nvrtc_costs()
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    before = json.loads(args.before.read_text()) if args.before else None
    text = tables(res, before)
    print(text)
    if not args.no_append:
        machine = (
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        )
        cmd = "python benchmarks/plan_scaling.py " + " ".join(sys.argv[1:])
        section = (
            f"\n## Planning time vs graph size — {args.date}\n\n"
            f"Command: `{cmd}` on {machine}. Median of {args.repeat} per graph, batch 2.\n\n"
            f"{text}\n"
        )
        with open(ROOT / "benchmarks" / "RESULTS.md", "a") as f:
            f.write(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
