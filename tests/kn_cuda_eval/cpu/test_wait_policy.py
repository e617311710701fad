"""How the host executor's threads wait between parallel regions (`runtime.wait_policy`): the
active policy (libgomp's team spins and also runs the C steps, `ompool.c`) and the passive one
(the team sleeps at once, the C steps on `pool.c`), each in a fresh process because libgomp reads
its spin count when it loads: bit-identical results to one thread at any thread count, two
Python threads at once, a forked child, a convolution through oneDNN next to C steps; and the
choice itself (what the user set wins; auto follows the idle cores)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kn_cuda_eval.cpu import build, runtime

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(build.pool() is None, reason="no C compiler or no futex")

_SCRIPT = """
import os, threading
import numpy as np
from kn_cuda_eval.cpu import build, onednn, runtime
from kn_graph import DType, Graph, Shape, UnaryOp
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_cuda_eval.cpu.test_pool import _bits, _every_kernel, _executor
from tests.kn_cuda_eval.helpers import assert_close

g, feed = _every_kernel()
serial = _bits(_executor(g, 1).eval(feed))
for threads in (2, 3, 5):
    ex = _executor(g, threads)
    for _ in range(3):
        assert _bits(ex.eval(feed)) == serial, threads
for name, a, b in zip(g.output_names, _executor(g, 2).eval(feed), evaluate(g, feed)):
    assert_close(a, b, name)

# two Python threads at once, each with its own team (active) or taking turns on the pool
ex = _executor(g, 2)
errors = []
def run():
    try:
        for _ in range(5):
            assert _bits(ex.eval(feed)) == serial
    except BaseException as e:
        errors.append(e)
ts = [threading.Thread(target=run) for _ in range(2)]
[t.start() for t in ts]
[t.join() for t in ts]
assert not errors, errors

# a forked child evaluates on its own thread (libgomp's team stayed in the parent)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    ok = False
    try:
        ok = _bits(ex.eval(feed)) == serial
    finally:
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
os.close(w)
assert os.read(r, 1) == b"1", "the forked child"
os.waitpid(pid, 0)

# a convolution through oneDNN between C steps
rng = np.random.default_rng(3)
c = Graph()
x = c.input(Shape.of(1, 8, 40, 40), DType.F32, "x")
w = c.constant(rng.standard_normal((16, 8, 3, 3)).astype(np.float32))
y = c.unary(UnaryOp.TANH, c.conv(c.exp(c.mul(x, 0.1)), w, [1, 1], [1, 1], [1, 1], 1))
c.add_output(c.mul(y, y), "y")
xs = {"x": rng.standard_normal((1, 8, 40, 40)).astype(np.float32)}
p = Device.cpu(threads=2).prepare(c)
for _ in range(3):
    (got,) = p.eval([xs["x"]])
assert_close(got, evaluate(c, xs)[0], "y")
tp = build.pool()
print(runtime.wait_policy(), os.environ["GOMP_SPINCOUNT"], tp.pause_ns, tp.workers(),
      onednn.available() is None)
"""


def _run(policy: str) -> tuple[str, int, float, int, bool]:
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env["KN_CPU_WAIT"] = policy
    r = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        check=False,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    chosen, count, pause_ns, workers, has_onednn = r.stdout.split()
    return chosen, int(count), float(pause_ns), int(workers), has_onednn == "True"


def test_active_runs_the_c_steps_on_the_spinning_openmp_team() -> None:
    chosen, count, pause_ns, workers, _ = _run("active")
    assert chosen == "active"
    assert count == round(build.ACTIVE_SPIN_NS / pause_ns) > 0
    if "-fopenmp" in build.flags():
        assert workers == 0, "the C steps ran on pool.c, beside OpenMP's spinning team"


def test_passive_runs_the_c_steps_on_the_pool_and_libgomp_sleeps_at_once() -> None:
    chosen, count, pause_ns, workers, _ = _run("passive")
    assert chosen == "passive"
    assert count == round(build.GOMP_SPIN_NS / pause_ns)
    assert workers >= 1


@pytest.mark.parametrize(
    ("spin", "policy", "spins"),
    [
        ("0", None, False),
        ("10000", None, True),
        ("10k", None, True),
        ("infinite", None, True),
        (None, "passive", False),
        (None, "ACTIVE", True),
        (None, None, True),  # libgomp's default: 300000 pauses
        ("0", "active", False),  # GOMP_SPINCOUNT wins
    ],
)
def test_what_libgomp_does_with_the_users_settings(
    spin: str | None, policy: str | None, spins: bool
) -> None:
    assert runtime._libgomp_spins(spin, policy) is spins


@pytest.mark.parametrize(
    ("asked", "idle", "threads", "want"),
    [
        ("auto", 1.9, 2, "active"),
        ("auto", 0.8, 2, "passive"),  # another process keeps a core busy
        ("auto", 0.9, 1, "active"),
        ("auto", None, 2, "active"),  # no /proc/stat
        ("passive", 2.0, 2, "passive"),
        ("active", 0.0, 2, "active"),
        ("bogus", 2.0, 2, "active"),  # a warning, then auto
    ],
)
def test_the_choice(
    monkeypatch: pytest.MonkeyPatch, asked: str, idle: float | None, threads: int, want: str
) -> None:
    """`_choose_policy` alone (the process's own policy is chosen once and kept): KN_CPU_WAIT,
    else the idle cores against the threads; GOMP_SPINCOUNT set to the policy's spin."""
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setenv("KN_CPU_WAIT", asked)
    monkeypatch.setattr(runtime, "_mapped", lambda fragment: False)
    monkeypatch.setattr(runtime, "_idle_cores", lambda: idle)
    assert runtime._choose_policy(threads) == want
    spin_ns = build.ACTIVE_SPIN_NS if want == "active" else build.GOMP_SPIN_NS
    tp = build.pool()
    assert tp is not None
    assert int(os.environ["GOMP_SPINCOUNT"]) == tp.spins(spin_ns)


def test_a_users_libgomp_setting_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOMP_SPINCOUNT", "0")
    monkeypatch.setenv("KN_CPU_WAIT", "active")
    assert runtime._choose_policy(2) == "passive"
    assert os.environ["GOMP_SPINCOUNT"] == "0"


def test_idle_cores_is_a_count_of_this_process_cpus() -> None:
    idle = runtime._idle_cores()
    assert idle is None or 0.0 <= idle <= len(os.sched_getaffinity(0)) + 1e-9
