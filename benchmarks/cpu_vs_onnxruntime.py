"""CPU latency of our NumPy executor against onnxruntime on the fixture corpus, in one run.

    python benchmarks/cpu_vs_onnxruntime.py [--threads N] [--runs 20] [--no-append] [-k NAME]
    python benchmarks/cpu_vs_onnxruntime.py --backend host [--optimize] [--threads N]

`--backend host` runs the CPU backend (`Device.cpu()`: the CUDA plan on the CPU, fused steps
compiled as C, convolutions and GEMMs through oneDNN; graphs with data-dependent ops in
segments) beside the reference executor and onnxruntime (host and onnxruntime in alternating
blocks of `--block` calls, the reference timed before them on its own), and prints both ratios
(host / onnxruntime, reference / onnxruntime), their geometric means and the per-evaluation
overhead of a plan of 1,000 tiny elementwise steps.

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
        "--block", type=int, default=5, help="--backend host: consecutive calls per turn (5)"
    )
    ap.add_argument(
        "--pause", type=float, default=0.05, help="--backend host: seconds before each turn"
    )
    ap.add_argument(
        "-k", dest="filter", default=None, help="only fixtures whose name contains this"
    )
    ap.add_argument("--no-append", action="store_true", help="do not append to RESULTS.md")
    ap.add_argument(
        "--optimize", action="store_true", help="run our optimizer first (when available)"
    )
    ap.add_argument(
        "--backend",
        choices=("reference", "host"),
        default="reference",
        help="ours: the NumPy reference executor (default), or the host plan executor beside it",
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
from collections.abc import Iterator  # noqa: E402
from functools import partial  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

from kn_graph.onnx import load_onnx  # noqa: E402
from kn_graph.reference import evaluate  # noqa: E402

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


def _fixtures() -> Iterator[tuple[dict[str, Any], Path, Any]]:
    """(manifest entry, model path, reference data) of each fixture that `-k` selects."""
    for fx in json.loads((MODELS / "manifest.json").read_text())["fixtures"]:
        if not ARGS.filter or ARGS.filter in fx["name"]:
            yield fx, MODELS / fx["file"], np.load(MODELS / fx["reference"])


def _ort_session(path: Path, data: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """An onnxruntime CPU session with our thread count, and its feed (first data set)."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = ARGS.threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return sess, {i.name: data[f"in0:{i.name}"] for i in sess.get_inputs()}


def _interleaved(fs: dict[str, object], runs: int, warmup: int) -> dict[str, float]:
    """Median seconds of each callable, called in turn (one of each per round)."""
    for _ in range(warmup):
        for f in fs.values():
            f()  # type: ignore[operator]
    ts: dict[str, list[float]] = {k: [] for k in fs}
    for _ in range(runs):
        for k, f in fs.items():
            t0 = time.perf_counter()
            f()  # type: ignore[operator]
            ts[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in ts.items()}


def _blocks(fs: dict[str, object], runs: int, warmup: int, block: int) -> dict[str, float]:
    """Median seconds of each callable, timed in blocks of `block` consecutive calls, the
    contenders taking turns block by block, `--pause` seconds between turns; the first call of
    each block is not timed. A contender then runs as it would alone (its pools warm), while
    the two still share the machine over time. Why the pause: onnxruntime's workers spin after
    a run (its default, kept) and on 2 cores slow whatever runs next, in some processes for
    good: our tiny Llama took 2.9 ms a call after onnxruntime blocks in one of three processes
    and 0.15 ms in the others; with the pause (or onnxruntime not spinning) 0.16-0.23 ms in
    every one."""
    for _ in range(warmup):
        for f in fs.values():
            f()  # type: ignore[operator]
    ts: dict[str, list[float]] = {k: [] for k in fs}
    for _ in range(max(1, -(-runs // block))):
        for k, f in fs.items():
            time.sleep(ARGS.pause)  # the other side's workers stop spinning
            f()  # type: ignore[operator]
            for _ in range(block):
                t0 = time.perf_counter()
                f()  # type: ignore[operator]
                ts[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in ts.items()}


def step_overhead(n_steps: int = 1000, runs: int = 20) -> tuple[int, float]:
    """(steps, median seconds per evaluation) of a plan of `n_steps` elementwise steps over 16
    elements each: what the host executor costs beyond the arithmetic."""
    from kn_cuda_eval import plan
    from kn_cuda_eval.cpu.executor import HostExecutor
    from kn_graph import DType, Graph, Shape

    g = Graph()
    y = g.input(Shape.of(16), DType.F32, "x")
    for k in range(n_steps):  # every value used twice: materialised, one step each
        y = g.add(g.mul(y, y), g.exp(y)) if k % 2 else g.sub(g.exp(y), y)
    g.add_output(y, "y")
    p = plan(g)
    ex = HostExecutor(p, threads=ARGS.threads)
    xs = [np.zeros(16, np.float32)]
    t = _median_time(partial(ex.eval, xs), runs, ARGS.warmup)
    return len(p.steps), t


def main_host() -> int:
    from kn_runtime import Device

    rows = []
    for fx, path, data in _fixtures():
        try:
            graph = load_onnx(path)
        except Exception as e:  # a fixture the loader refuses: say so, go on
            print(f"{fx['name']:28s} skipped: {type(e).__name__}: {str(e)[:100]}")
            continue
        if not hasattr(graph, "has_dynamic"):
            print(f"{fx['name']:28s} skipped: shapes decided by input values")
            continue
        if ARGS.optimize:
            from kn_graph.optimizer import optimize

            graph = optimize(graph)
        feed = {n: data[f"in0:{n}"] for n in graph.input_names}
        sess, ort_feed = _ort_session(path, data)
        host = Device.cpu(ARGS.threads).prepare(graph)
        host.eval(feed)  # plan, compile (cached on disk) and allocate outside the timing
        # the reference first, on its own: OpenBLAS's idle workers keep spinning after its
        # GEMMs and would slow whatever runs next (measured: onnxruntime 0.15 -> 0.36 ms and the
        # host executor 0.16 -> 1.9 ms on GPT-2); host and onnxruntime then alternate
        t = _interleaved({"ref": partial(evaluate, graph, feed)}, ARGS.runs, ARGS.warmup)
        time.sleep(0.2)
        t |= _blocks(
            {"host": partial(host.eval, feed), "ort": partial(sess.run, None, ort_feed)},
            ARGS.runs,
            ARGS.warmup,
            ARGS.block,
        )
        rows.append((fx["name"], t["ref"], t["host"], t["ort"]))
        print(
            f"{fx['name']:28s} reference {t['ref'] * 1e3:8.2f} ms  host {t['host'] * 1e3:8.2f} ms  "
            f"onnxruntime {t['ort'] * 1e3:8.2f} ms   host/ort {t['host'] / t['ort']:6.2f}  "
            f"ref/ort {t['ref'] / t['ort']:6.2f}",
            flush=True,
        )
    if not rows:
        print("no fixtures matched")
        return 1

    def geo(i: int) -> float:
        return math.exp(sum(math.log(r[i] / r[3]) for r in rows) / len(rows))

    n, t_over = step_overhead()
    print(
        f"geometric-mean ratio host / onnxruntime: {geo(2):.2f}  reference / onnxruntime: {geo(1):.2f}"
    )
    print(
        f"per-evaluation time of a {n}-step elementwise plan (16 elements a step): {t_over * 1e3:.3f} ms"
    )
    if not ARGS.no_append:
        today = datetime.date.today().isoformat()
        lines = [
            f"\n## Host plan executor vs onnxruntime — {today}\n",
            f"Machine: {platform.machine()}, {os.cpu_count()} cores, NumPy {np.__version__}, "
            f"onnxruntime {ort.__version__}; {ARGS.threads} thread(s) each; median of {ARGS.runs} "
            f"runs in alternating blocks of {ARGS.block} after {ARGS.warmup} warm-ups; "
            f"{'optimized' if ARGS.optimize else 'unoptimized'} graphs; first data set.\n",
            "| fixture | reference (ms) | host (ms) | onnxruntime (ms) | host/ort | ref/ort |",
            "|---|---:|---:|---:|---:|---:|",
            *[
                f"| {nm} | {a * 1e3:.2f} | {h * 1e3:.2f} | {o * 1e3:.2f} | {h / o:.2f} | {a / o:.2f} |"
                for nm, a, h, o in rows
            ],
            f"| **geometric mean** | | | | **{geo(2):.2f}** | **{geo(1):.2f}** |\n",
            f"Per-evaluation time of a {n}-step elementwise plan: {t_over * 1e3:.3f} ms.\n",
        ]
        with open(ROOT / "benchmarks" / "RESULTS.md", "a") as f:
            f.write("\n".join(lines) + "\n")
    return 0


def main() -> int:
    if ARGS.backend == "host":
        return main_host()
    rows = []
    for fx, path, data in _fixtures():
        graph = load_onnx(path)
        if ARGS.optimize:
            from kn_graph.optimizer import optimize

            graph = optimize(graph)
        feed = {n: data[f"in0:{n}"] for n in graph.input_names}
        sess, ort_feed = _ort_session(path, data)
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
