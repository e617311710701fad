"""Prepare time: `Device.cpu().prepare` of the real-size models of `real_models.py` (random
weights, fixed shapes) against onnxruntime's `InferenceSession` creation, each in a fresh process.

    .venv/bin/python benchmarks/prepare_time.py [--cache /work/bigmodels] [--threads 2]
        [--repeat 3] [-k NAME ...] [--markdown FILE]

Per model and repetition, three fresh subprocesses (nothing cached in memory; the model file is
read once before, so all of them find it in the page cache):
- onnxruntime: `InferenceSession(path)` (intra-op N threads, as `real_models.ort_session`) and
  its first `run`;
- ours cold: `load_onnx` + `optimize` + `Device.cpu(N).prepare` (as `real_models.ours_prepared`:
  the plan, the compiled C steps, oneDNN's primitives and packed weights are all made there for
  a fixed-shape model) and the first `eval`, with the compile cache pointed at a new empty folder
  (`$KN_KERNEL_CACHE`, read by `kn_cuda_eval.cuda.kernels.compile.cache_dir`);
- ours warm: the same with that folder as the cold run left it (the C library on disk).
Imports are not counted on either side (onnxruntime loads its library when imported; ours loads
libdnnl and probes the compiler inside prepare, which is counted). Medians over --repeat.

Our warm prepare is also split into its parts, timed from outside by wrapping the functions
that do them (exclusive times: a part nested in another is not counted twice): load_onnx,
optimize, plan, compiler probes (`build.flags`: test compilations for -march=native, OpenMP
and _Float16, and `build._identity`: once per process), oneDNN load (libdnnl and its engine), C source (generating the kernels' source), compile / load .so (a cache hit only loads), oneDNN
primitives (descriptors and primitive creation, oneDNN's JIT), weight packing (reorders of
constant weights), and the rest of prepare (arena, constants, prebuilt calls). A function that
is not there any more (the backend changed) leaves its part empty and its time in the rest.

Prints the tables as Markdown (for `benchmarks/RESULTS.md`); --markdown also writes them to a file.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from _real_models import export_all, import_real_models

RESULT = "RESULT "
PARTS = (
    "load_onnx",
    "optimize",
    "plan",
    "compiler probes",
    "oneDNN load",
    "C source",
    "compile / load .so",
    "oneDNN primitives",
    "weight packing",
    "rest of prepare",
)


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cache", type=Path, default=Path("/work/bigmodels"), help="model exports")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes per side and model")
    ap.add_argument("-k", dest="only", action="append", help="only these models (repeatable)")
    ap.add_argument("--markdown", type=Path, help="also write the tables to this file")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per child process")
    ap.add_argument("--child", nargs=2, metavar=("SIDE", "NAME"), help=argparse.SUPPRESS)
    return ap.parse_args()


ARGS = _parse()
RM = import_real_models(ARGS.cache, ARGS.threads)


# ---------------------------------------------------------------- in the child process


class Parts:
    """Exclusive wall time per part: a wrapped call's time minus that of wrapped calls inside."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self._stack: list[float] = []

    def wrap(self, part: str, owner: Any, attr: str) -> None:
        f = getattr(owner, attr, None)
        if f is None:
            return
        stack, seconds = self._stack, self.seconds

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            stack.append(0.0)
            try:
                return f(*args, **kwargs)
            finally:
                inner = stack.pop()
                dt = time.perf_counter() - t0
                seconds[part] += dt - inner
                if stack:
                    stack[-1] += dt

        setattr(owner, attr, timed)


def child_ours(path: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    import kn_cuda_eval.planning.plan as plan_module
    import kn_graph.onnx
    import kn_graph.optimizer
    from kn_cuda_eval.cpu import build, executor, library
    from kn_runtime import Device

    onednn: ModuleType | None
    try:
        onednn = importlib.import_module("kn_cuda_eval.cpu.onednn")
    except ImportError:
        onednn = None
    t_import = time.perf_counter() - t0
    parts = Parts()
    wraps: list[tuple[str, Any, str]] = [
        ("load_onnx", kn_graph.onnx, "load_onnx"),
        ("optimize", kn_graph.optimizer, "optimize"),
        ("rest of prepare", Device, "prepare"),
        ("plan", executor, "make_plan"),
        ("plan", plan_module, "plan"),
        ("C source", library.HostLibrary, "__init__"),
        ("compile / load .so", build, "load_library"),
        ("compiler probes", build, "flags"),
        ("compiler probes", build, "_identity"),
    ]
    if onednn is not None:
        wraps += [
            ("oneDNN load", onednn, "available"),
            ("oneDNN primitives", onednn, "conv_desc"),
            ("oneDNN primitives", onednn, "conv_runner"),
            ("oneDNN primitives", onednn, "gemm_runner"),
            ("weight packing", onednn.conv, "pack"),  # bound by name where it is used
            ("weight packing", onednn.gemm, "pack"),
        ]
    for part, owner, attr in wraps:
        parts.wrap(part, owner, attr)
    feeds = RM.feeds_for(path)
    t0 = time.perf_counter()
    prepared = RM.ours_prepared(path)  # load_onnx, optimize, Device.cpu(N).prepare
    t_prepare = time.perf_counter() - t0
    t0 = time.perf_counter()
    prepared.eval(feeds)
    t_first = time.perf_counter() - t0
    return {"import": t_import, "prepare": t_prepare, "first": t_first, "parts": parts.seconds}


def child_ort(path: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    import onnxruntime  # noqa: F401

    t_import = time.perf_counter() - t0
    feeds = RM.feeds_for(path)
    t0 = time.perf_counter()
    sess = RM.ort_session(path)
    t_prepare = time.perf_counter() - t0
    t0 = time.perf_counter()
    sess.run(None, feeds)
    t_first = time.perf_counter() - t0
    return {"import": t_import, "prepare": t_prepare, "first": t_first, "parts": {}}


# ---------------------------------------------------------------- in the parent


def run_child(side: str, name: str, kernel_cache: Path | None) -> dict[str, Any]:
    env = dict(os.environ)
    if kernel_cache is not None:
        env["KN_KERNEL_CACHE"] = str(kernel_cache)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", side, name]
    cmd += ["--cache", str(ARGS.cache), "--threads", str(ARGS.threads)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=ARGS.timeout)
    for line in r.stdout.splitlines():
        if line.startswith(RESULT):
            out: dict[str, Any] = json.loads(line[len(RESULT) :])
            return out
    lines = [x for x in (r.stderr or r.stdout).strip().splitlines() if x.strip()]
    raise RuntimeError(lines[-1][:300] if lines else f"exit status {r.returncode}")


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _median_part(runs: list[dict[str, Any]], part: str) -> float | None:
    got = [r["parts"][part] for r in runs if part in r["parts"]]
    return statistics.median(got) if got else None


def measure(name: str) -> dict[str, list[dict[str, Any]]]:
    RM.model_path(name).read_bytes()  # into the page cache: no side pays the disk
    out: dict[str, list[dict[str, Any]]] = {"ort": [], "cold": [], "warm": []}
    for _ in range(ARGS.repeat):
        out["ort"].append(run_child("ort", name, None))
        folder = Path(tempfile.mkdtemp(prefix="kn_prepare_cache_"))
        try:
            out["cold"].append(run_child("ours", name, folder))
            out["warm"].append(run_child("ours", name, folder))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return out


def _s(x: float) -> str:
    return f"{x:.2f}"


def tables(rows: list[tuple[str, dict[str, list[dict[str, Any]]]]]) -> str:
    import numpy as np
    import onnxruntime as ort

    lines = [
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f} at the end; NumPy {np.__version__}, onnxruntime "
        f"{ort.__version__}; {ARGS.threads} threads each; a fresh process per measurement, "
        f"median of {ARGS.repeat}; ours = load_onnx + optimize + Device.cpu().prepare (cold: "
        "empty compile cache; warm: the C library on disk), onnxruntime = InferenceSession "
        "creation; imports not counted.",
        "",
        "| model | ours cold (s) | ours warm (s) | onnxruntime session (s) | warm / ort "
        "| ours first eval (ms) | ort first run (ms) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for n, m in rows:
        cold, warm, o = (_median(m[k], "prepare") for k in ("cold", "warm", "ort"))
        lines.append(
            f"| {n} | {_s(cold)} | {_s(warm)} | {_s(o)} | {warm / o:.2f} "
            f"| {_median(m['warm'], 'first') * 1e3:.1f} | {_median(m['ort'], 'first') * 1e3:.1f} |"
        )
    lines += [
        "",
        "Our warm prepare by part (s, exclusive times, median; the last column is the cold "
        "run's compilation):",
        "",
        "| model | " + " | ".join(PARTS) + " | compile (cold) |",
        "|---|" + "---:|" * (len(PARTS) + 1),
    ]
    for n, m in rows:
        cells = []
        for p in PARTS:
            v = _median_part(m["warm"], p)
            cells.append("" if v is None else _s(v))
        c = _median_part(m["cold"], "compile / load .so")
        cells.append("" if c is None else _s(c))
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    names = [n for n in RM.MODELS if not ARGS.only or n in ARGS.only]
    failures = export_all(RM, names)
    rows = []
    for n in names:
        if n in failures:
            continue
        try:
            m = measure(n)
        except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
            failures[n] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"{n}: {failures[n]}", flush=True)
            continue
        rows.append((n, m))
        cold, warm, o = (_median(m[k], "prepare") for k in ("cold", "warm", "ort"))
        print(
            f"{n:16s} ours cold {cold:6.2f} s  warm {warm:6.2f} s  ort session {o:6.2f} s  "
            f"warm/ort {warm / o:5.2f}",
            flush=True,
        )
    text = tables(rows)
    for n, why in failures.items():
        text += f"\n\nfailed: {n}: {why}"
    print()
    print(text)
    if ARGS.markdown is not None:
        ARGS.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    if ARGS.child:
        side, model = ARGS.child
        fn: Callable[[Path], dict[str, Any]] = child_ours if side == "ours" else child_ort
        print(RESULT + json.dumps(fn(RM.model_path(model))), flush=True)
    else:
        sys.exit(main())
