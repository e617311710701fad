"""CUDA plan memory and planning time on the fixture corpus, with the generated kernels compiled.

    python benchmarks/plan_memory.py [--no-append] [--no-compile] [-k NAME] [--batch 3]

For each fixture (optimized graph, the manifest's larger binding, or `--batch`): steps, constants,
the packed workspace against its lower bound (max over steps of live bytes) and against a naive
plan that gives every tensor its own buffer, and the planning time (median of 3). Then the number
of distinct generated kernels over the corpus (both bindings, optimized and not) and the
registers/spills of the largest, compiled with NVRTC for sm_80 and sm_90. The tables are printed
and appended to benchmarks/RESULTS.md with the date.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kn_cuda_eval import plan  # noqa: E402
from kn_cuda_eval.cuda.kernels import distinct_kernels  # noqa: E402
from kn_cuda_eval.cuda.kernels.dispatch import plan_launches  # noqa: E402
from kn_graph.optimizer import optimize  # noqa: E402
from tests.kn_cuda_eval.corpus import FIXTURES, datasets, load  # noqa: E402


def _kb(n: int) -> str:
    return f"{n / 1024:,.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("-k", dest="filter", default=None)
    ap.add_argument(
        "--batch", type=int, default=None, help="plan at this batch size instead of the manifest's"
    )
    ap.add_argument("--no-append", action="store_true")
    ap.add_argument("--no-compile", action="store_true", help="skip the NVRTC kernel statistics")
    args = ap.parse_args()

    rows = []
    kernels = {}
    skipped = []
    for fx in FIXTURES:
        name = fx["name"]
        if args.filter and args.filter not in name:
            continue
        try:
            g = load(name)
        except Exception as e:
            skipped.append(f"{name} ({type(e).__name__})")
            continue
        og = optimize(g)
        sets = datasets(name)
        for graph in (g, og):
            for _, binds in sets:
                for k in distinct_kernels(plan_launches(plan(graph, bindings=binds))):
                    kernels.setdefault(k.source, k)
        binds = dict(sets[-1][1])
        if args.batch is not None and "B" in binds:
            binds["B"] = args.batch
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            p = plan(og, bindings=binds)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        plan(g, bindings=binds)
        t_unopt = time.perf_counter() - t0
        p.validate()
        r = p.memory_report()
        rows.append(
            (
                name,
                ",".join(f"{k}={v}" for k, v in sorted(binds.items())),
                len(og),
                len(p.steps),
                _kb(r.const_size),
                _kb(r.workspace_size),
                _kb(r.lower_bound),
                f"{r.ratio:.3f}",
                _kb(r.naive_size),
                f"{r.naive_size / max(r.workspace_size, 1):.2f}x",
                f"{statistics.median(times) * 1000:.0f}",
                f"{t_unopt * 1000:.0f} ({len(g)})",
            )
        )
    head = (
        "| fixture | bindings | values | steps | constants KiB | workspace KiB | lower bound KiB | ratio | "
        "naive KiB | naive/packed | plan ms | plan ms unoptimized (values) |"
    )
    lines = [head, "|" + "---|" * 12]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    worst = max((float(r[7]) for r in rows), default=1.0)
    lines.append("")
    lines.append(
        f"Worst workspace/lower-bound ratio: {worst:.3f}. Slowest planning: "
        f"{max((int(r[10]) for r in rows), default=0)} ms (optimized graphs)."
    )
    if skipped:
        lines.append(f"Not loadable yet (skipped): {', '.join(skipped)}.")
    if not args.no_compile:
        from kn_cuda_eval.cuda.kernels.compile import compile_kernel, nvrtc_version

        stats = []
        t0 = time.perf_counter()
        for k in kernels.values():
            c80, c90 = compile_kernel(k, 80), compile_kernel(k, 90)
            stats.append(
                (
                    max(c80.registers, c90.registers),
                    k.name,
                    c80.registers,
                    c90.registers,
                    max(c80.spill_bytes, c90.spill_bytes),
                )
            )
        dt = time.perf_counter() - t0
        stats.sort(reverse=True)
        lines.append("")
        lines.append(
            f"Distinct generated kernels over the corpus (both bindings, optimized and not): {len(kernels)}; "
            f"compiled for sm_80 and sm_90 with NVRTC {'.'.join(map(str, nvrtc_version()))} in {dt:.1f} s "
            f"(cache: $KN_KERNEL_CACHE). Spilling kernels: {sum(1 for s in stats if s[4])}."
        )
        lines.append("")
        lines.append(
            "| kernel (most registers) | registers sm_80 | registers sm_90 | spill bytes |"
        )
        lines.append("|---|---|---|---|")
        for _, name, r80, r90, sp in stats[:8]:
            lines.append(f"| {name} | {r80} | {r90} | {sp} |")
    text = "\n".join(lines)
    print(text)
    if not args.no_append:
        stamp = datetime.date.today().isoformat()
        section = (
            f"\n## CUDA plan memory and planning time — {stamp}\n\n"
            f"Command: `python benchmarks/plan_memory.py{' --batch ' + str(args.batch) if args.batch else ''}`. "
            f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()} "
            "(no GPU: planning, packing and NVRTC compilation only). Optimized graphs at the manifest's "
            "larger binding; workspace = packed inputs and intermediates (constants apart); naive = one "
            "buffer per tensor.\n\n" + text + "\n"
        )
        with open(ROOT / "benchmarks" / "RESULTS.md", "a") as f:
            f.write(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
