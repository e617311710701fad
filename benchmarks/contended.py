"""Speed under CPU contention: the real-size models of `real_models.py` on `Device.cpu(threads=N)`
and on onnxruntime (intra-op N threads), quiet, beside a competing busy process pinned to one
core, and under a CPU quota (a cgroup's CFS bandwidth limit, as a container's `--cpus`).

    .venv/bin/python benchmarks/contended.py [--cache /work/bigmodels] [--threads 2]
        [--rounds 5] [--block 3] [--warmup 2] [--pause 0.05] [--quota 1.5 | --no-quota]
        [--env NAME=VALUE ...] [-k NAME ...] [--markdown FILE]

Per model, both sides are prepared in this process (`real_models.ours_prepared`, `ort_session`,
`feeds_for`) and measured side by side, conditions and sides interleaved so that a drift of the
shared machine touches all of them alike: --rounds rounds, each going through every condition;
in a condition, a block of --block calls of one side, then of the other (the first side
alternating between rounds). Before each timed call the script sleeps --pause seconds, as
`real_models.py` does: onnxruntime's workers spin after a run and would take the cores of
whatever runs next. --warmup calls of each side precede the rounds.

Conditions:
- quiet: nothing else started by this script (the machine's own load is printed);
- busy core: a Python busy loop in a subprocess pinned to one core (`os.sched_setaffinity`),
  started once and stopped (SIGSTOP) outside its condition;
- quota: this process moved into a new cgroup whose CPU bandwidth is --quota CPUs (cgroup v2
  `cpu.max`, or v1 `cpu.cfs_quota_us`), and back out after each block; skipped, saying why,
  where no cpu controller is writable (not root, a read-only cgroupfs).

Prints per model and contended condition: the median ms quiet and contended and the slowdown
factor (contended / quiet) of each side, and the ratio of the slowdown factors (ours / ort;
<= 1 means ours degrades no more than onnxruntime). --env sets variables before the backend
loads (e.g. `--env GOMP_SPINCOUNT=0`, `--env OMP_DYNAMIC=true`) to try thread-pool settings;
onnxruntime does not read them.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from _real_models import export_all, import_real_models


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cache", type=Path, default=Path("/work/bigmodels"), help="model exports")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--block", type=int, default=3, help="calls of one side in a row")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls of each side first")
    ap.add_argument("--pause", type=float, default=0.05, help="seconds before each timed call")
    ap.add_argument("--quota", type=float, default=1.5, help="CPUs of the quota condition")
    ap.add_argument("--no-quota", action="store_true", help="skip the quota condition")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("-k", dest="only", action="append", help="only these models (repeatable)")
    ap.add_argument("--markdown", type=Path, help="also write the table to this file")
    return ap.parse_args()


ARGS = _parse()
for _kv in ARGS.env:  # before the backend (libgomp reads its variables when it loads)
    _k, _sep, _v = _kv.partition("=")
    if not _sep or not _k:
        sys.exit(f"contended.py: --env must look like NAME=VALUE, found '{_kv}'")
    os.environ[_k] = _v
RM = import_real_models(ARGS.cache, ARGS.threads)


# ---------------------------------------------------------------- conditions


class Competitor:
    """A busy loop in a subprocess pinned to one core; stopped (SIGSTOP) until `enter`. It ends
    by itself when this process does (it polls its parent)."""

    def __init__(self, core: int) -> None:
        self.core = core
        code = (
            "import os\n"
            f"os.sched_setaffinity(0, {{{core}}})\n"
            "parent = os.getppid()\n"
            "while os.getppid() == parent:\n"
            "    for _ in range(1_000_000):\n"
            "        pass\n"
        )
        self.proc = subprocess.Popen([sys.executable, "-c", code])
        time.sleep(0.2)
        os.kill(self.proc.pid, signal.SIGSTOP)

    def enter(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)
        time.sleep(0.05)  # running, and the scheduler has seen it

    def exit(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def close(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.terminate()
        self.proc.wait()


def _cpu_cgroup() -> tuple[Path, int]:
    """(this process's cgroup folder with a cpu controller, cgroup version); OSError saying
    why when there is none."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    entries = [line.split(":", 2) for line in lines]
    for _, controllers, rel in entries:  # v1: a hierarchy with the cpu controller
        if "cpu" in controllers.split(","):
            for m in Path("/proc/self/mountinfo").read_text().splitlines():
                left, _, right = m.partition(" - ")
                fields, rfields = left.split(), right.split()
                if rfields[0] == "cgroup" and "cpu" in rfields[-1].split(","):
                    return Path(fields[4]) / rel.lstrip("/"), 1
    for _, controllers, rel in entries:  # v2: the unified hierarchy
        if controllers == "":
            for m in Path("/proc/self/mountinfo").read_text().splitlines():
                left, _, right = m.partition(" - ")
                if right.split()[0] == "cgroup2":
                    base = Path(left.split()[4]) / rel.lstrip("/")
                    if "cpu" in (base / "cgroup.controllers").read_text().split():
                        return base, 2
    raise OSError("no cgroup hierarchy with the cpu controller")


class Quota:
    """This process in a child cgroup limited to `cpus` CPUs while entered."""

    PERIOD_US = 100_000

    def __init__(self, cpus: float) -> None:
        self.base, self.version = _cpu_cgroup()
        self.group = self.base / f"kn_contended_{os.getpid()}"
        quota = int(cpus * self.PERIOD_US)
        if self.version == 2:
            ctl = (self.base / "cgroup.subtree_control").read_text().split()
            if "cpu" not in ctl:
                (self.base / "cgroup.subtree_control").write_text("+cpu")
            self.group.mkdir()
            (self.group / "cpu.max").write_text(f"{quota} {self.PERIOD_US}")
        else:
            self.group.mkdir()
            (self.group / "cpu.cfs_period_us").write_text(str(self.PERIOD_US))
            (self.group / "cpu.cfs_quota_us").write_text(str(quota))

    def enter(self) -> None:
        (self.group / "cgroup.procs").write_text(str(os.getpid()))

    def exit(self) -> None:
        (self.base / "cgroup.procs").write_text(str(os.getpid()))

    def throttled(self) -> str:
        for line in (self.group / "cpu.stat").read_text().splitlines():
            if line.startswith("nr_throttled"):
                return line.split()[1]
        return "?"

    def close(self) -> None:
        self.exit()
        for _ in range(50):  # the kernel drops a moved-out process's reference lazily
            try:
                self.group.rmdir()
                return
            except OSError:
                time.sleep(0.02)


# ---------------------------------------------------------------- measuring

Condition = tuple[str, Callable[[], None], Callable[[], None]]


def measure(name: str, conditions: list[Condition]) -> dict[str, dict[str, float]]:
    """{condition: {side: median seconds}}."""
    path = RM.model_path(name)
    feeds = RM.feeds_for(path)
    ours = RM.ours_prepared(path)
    sess = RM.ort_session(path)
    sides: dict[str, Callable[[], object]] = {
        "ours": lambda: ours.eval(feeds),
        "ort": lambda: sess.run(None, feeds),
    }
    for _ in range(ARGS.warmup):
        for f in sides.values():
            f()
    ts: dict[str, dict[str, list[float]]] = {c: {s: [] for s in sides} for c, _, _ in conditions}
    for r in range(ARGS.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for cond, enter, leave in conditions:
            enter()
            try:
                for side in order:
                    for _ in range(ARGS.block):
                        time.sleep(ARGS.pause)  # the other side's pool stops spinning
                        t0 = time.perf_counter()
                        sides[side]()
                        ts[cond][side].append(time.perf_counter() - t0)
            finally:
                leave()
    return {c: {s: statistics.median(v) for s, v in per.items()} for c, per in ts.items()}


def main() -> int:
    import numpy as np
    import onnxruntime as ort

    names = [n for n in RM.MODELS if not ARGS.only or n in ARGS.only]
    failures = export_all(RM, names)
    cores = sorted(os.sched_getaffinity(0))
    load0 = os.getloadavg()[0]
    competitor = Competitor(cores[-1])
    nothing: Callable[[], None] = lambda: None  # noqa: E731
    conditions: list[Condition] = [
        ("quiet", nothing, nothing),
        (f"busy core {cores[-1]}", competitor.enter, competitor.exit),
    ]
    quota: Quota | None = None
    why_no_quota = None
    if not ARGS.no_quota:
        try:
            quota = Quota(ARGS.quota)
            conditions.append((f"quota {ARGS.quota:g} CPUs", quota.enter, quota.exit))
        except OSError as e:
            why_no_quota = f"{type(e).__name__}: {e}"
            print(f"no quota condition: {why_no_quota}", flush=True)
    rows = []
    try:
        for n in names:
            if n in failures:
                continue
            try:
                m = measure(n, conditions)
            except Exception as e:  # record and go on
                failures[n] = f"{type(e).__name__}: {str(e)[:200]}"
                print(f"{n}: {failures[n]}", flush=True)
                continue
            rows.append((n, m))
            q = m["quiet"]
            for cond, _, _ in conditions[1:]:
                c = m[cond]
                so, sr = c["ours"] / q["ours"], c["ort"] / q["ort"]
                print(
                    f"{n:16s} {cond:16s} ours {q['ours'] * 1e3:8.2f} -> {c['ours'] * 1e3:8.2f} ms"
                    f" (x{so:.2f})  ort {q['ort'] * 1e3:8.2f} -> {c['ort'] * 1e3:8.2f} ms "
                    f"(x{sr:.2f})  ratio {so / sr:.2f}",
                    flush=True,
                )
    finally:
        competitor.close()
        if quota is not None:
            print(f"(quota cgroup throttled {quota.throttled()} periods)", flush=True)
            quota.close()
    env = " ".join(ARGS.env) or "none"
    lines = [
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, load average {load0:.1f} "
        f"before; NumPy {np.__version__}, onnxruntime {ort.__version__}; {ARGS.threads} "
        f"threads each; median of {ARGS.rounds} x {ARGS.block} calls per side and condition "
        f"(conditions and sides interleaved in blocks, {ARGS.pause:g} s before each call, "
        f"{ARGS.warmup} warm-up calls); busy core: a busy process pinned to core {cores[-1]}; "
        + (f"quota: {ARGS.quota:g} CPUs (cgroup v{quota.version})" if quota else "no quota")
        + f"; --env {env}.",
        "",
        "| model | condition | ours quiet (ms) | ours contended (ms) | ours slowdown "
        "| ort quiet (ms) | ort contended (ms) | ort slowdown | slowdown ratio ours/ort |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, m in rows:
        q = m["quiet"]
        for cond, _, _ in conditions[1:]:
            c = m[cond]
            so, sr = c["ours"] / q["ours"], c["ort"] / q["ort"]
            lines.append(
                f"| {n} | {cond} | {q['ours'] * 1e3:.2f} | {c['ours'] * 1e3:.2f} | {so:.2f} "
                f"| {q['ort'] * 1e3:.2f} | {c['ort'] * 1e3:.2f} | {sr:.2f} | {so / sr:.2f} |"
            )
    if rows:
        import math

        for cond, _, _ in conditions[1:]:
            ratios = [
                (m[cond]["ours"] / m["quiet"]["ours"]) / (m[cond]["ort"] / m["quiet"]["ort"])
                for _, m in rows
            ]
            geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
            lines.append(f"| **geometric mean** | {cond} | | | | | | | **{geo:.2f}** |")
    if why_no_quota is not None:
        lines.append(f"\nno quota condition: {why_no_quota}")
    for n, why in failures.items():
        lines.append(f"\nfailed: {n}: {why}")
    text = "\n".join(lines)
    print()
    print(text)
    if ARGS.markdown is not None:
        ARGS.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
