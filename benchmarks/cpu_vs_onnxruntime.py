"""CPU latency of our NumPy executor against onnxruntime on the fixture corpus, in one run.

    python benchmarks/cpu_vs_onnxruntime.py [--threads N] [--runs 20] [--no-append] [-k NAME]

Both sides get the same thread count (BLAS threads for NumPy, intra-op threads for onnxruntime,
set before NumPy is imported). For each fixture and its first data set: the median latency of
each, their ratio (ours / onnxruntime), and the geometric mean of the ratios. The table is printed
and appended to benchmarks/RESULTS.md with the date and the machine.
"""

from __future__ import annotations

import argparse
import os
import sys


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument(
        "-k", dest="filter", default=None, help="only fixtures whose name contains this"
    )
    ap.add_argument("--no-append", action="store_true", help="do not append to RESULTS.md")
    ap.add_argument(
        "--optimize", action="store_true", help="run our optimizer first (when available)"
    )
    return ap.parse_args()


ARGS = _parse()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(ARGS.threads)

import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

from kn_graph.cpu import evaluate  # noqa: E402
from kn_graph.onnx import load_onnx  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "models"


def _median_time(f, runs: int, warmup: int) -> float:
    for _ in range(warmup):
        f()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> int:
    manifest = json.loads((MODELS / "manifest.json").read_text())
    rows = []
    for fx in manifest["fixtures"]:
        if ARGS.filter and ARGS.filter not in fx["name"]:
            continue
        path = MODELS / fx["file"]
        data = np.load(MODELS / fx["reference"])
        graph = load_onnx(path)
        if ARGS.optimize:
            from kn_graph.optimizer import optimize

            graph = optimize(graph)
        feed = {n: data[f"in0:{n}"] for n in graph.input_names}
        so = ort.SessionOptions()
        so.intra_op_num_threads = ARGS.threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        ort_feed = {i.name: data[f"in0:{i.name}"] for i in sess.get_inputs()}
        t_ours = _median_time(partial(evaluate, graph, feed), ARGS.runs, ARGS.warmup)
        t_ort = _median_time(partial(sess.run, None, ort_feed), ARGS.runs, ARGS.warmup)
        rows.append((fx["name"], t_ours, t_ort, t_ours / t_ort))
        print(
            f"{fx['name']:28s} ours {t_ours * 1e3:9.2f} ms   onnxruntime {t_ort * 1e3:9.2f} ms   ratio {t_ours / t_ort:6.2f}",
            flush=True,
        )
    if not rows:
        print("no fixtures matched")
        return 1
    geo = math.exp(sum(math.log(r[3]) for r in rows) / len(rows))
    print(f"geometric-mean ratio (ours / onnxruntime): {geo:.2f}")
    if not ARGS.no_append:
        today = datetime.date.today().isoformat()
        lines = [
            f"\n## CPU executor vs onnxruntime — {today}\n",
            f"Machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} "
            f"{platform.python_version()}, NumPy {np.__version__}, onnxruntime {ort.__version__}; "
            f"{ARGS.threads} thread(s) each; median of {ARGS.runs} runs after {ARGS.warmup} warm-ups; "
            f"{'optimized' if ARGS.optimize else 'unoptimized'} graphs; first data set of each fixture.\n",
            "| fixture | ours (ms) | onnxruntime (ms) | ratio |",
            "|---|---:|---:|---:|",
            *[f"| {n} | {a * 1e3:.2f} | {b * 1e3:.2f} | {r:.2f} |" for n, a, b, r in rows],
            f"| **geometric mean** | | | **{geo:.2f}** |\n",
        ]
        with open(ROOT / "benchmarks" / "RESULTS.md", "a") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
