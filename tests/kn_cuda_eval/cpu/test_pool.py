"""The host thread pool (`kn_cuda_eval/cpu/pool.c`, `build.pool`) that runs the parallel loops of
the generated C steps: bit-identical results whatever the thread count (every unit of work is
computed by one thread, as alone), steps with fewer units than threads, two executors on two
Python threads at once, a forked child, and the spin bounded in time (the pool's and
libgomp's `GOMP_SPINCOUNT`, from the CPU's pause latency)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from kn_cuda_eval import PlanSettings, plan
from kn_cuda_eval.cpu import build, runtime
from kn_cuda_eval.cpu.executor import HostExecutor
from kn_graph import DType, Graph, ReduceOp, Shape, UnaryOp
from kn_graph.reference import evaluate
from tests.kn_cuda_eval.helpers import assert_close

pytestmark = pytest.mark.skipif(build.pool() is None, reason="no C compiler or no futex")


@functools.cache
def _every_kernel() -> tuple[Graph, dict[str, np.ndarray]]:
    """One graph with each parallel kernel kind past the parallel threshold: elementwise (rows
    split into inner chunks, an odometer over permuted axes, a tabulated per-channel sigmoid),
    gathers, softmax, layernorm, row and column reductions, fused attention (a head dim under
    `attention.MIN_HEAD_DIM`: not split into GEMMs)."""
    rng = np.random.default_rng(7)
    g = Graph()
    x = g.input(Shape.of(3, 40000), DType.F32, "x")
    y = g.input(Shape.of(70, 30, 40), DType.F32, "y")
    z = g.input(Shape.of(300, 512), DType.F32, "z")
    s = g.input(Shape.of(1, 512), DType.F32, "s")
    hwc = g.input(Shape.of(40, 40, 48), DType.F32, "hwc")
    idx = g.input(Shape.of(500), DType.I64, "i")
    g.add_output(g.unary(UnaryOp.GELU, g.mul(x, 0.5)), "gelu")
    g.add_output(g.exp(g.permute(g.flip(y, 1), [2, 0, 1])), "perm")
    g.add_output(g.mul(z, g.unary(UnaryOp.SIGMOID, s)), "excite")
    g.add_output(g.softmax(g.mul(y, 0.25), 2), "softmax")
    g.add_output(g.layernorm(g.permute(y, [0, 2, 1]), 2, 1e-5), "layernorm")
    g.add_output(g.reduce(y, [2], ReduceOp.MAX), "max")
    g.add_output(g.reduce(y, [1], ReduceOp.MAX), "max_columns")
    g.add_output(g.reduce(g.permute(y, [2, 1, 0]), [1, 2], ReduceOp.SUM), "sum")
    g.add_output(g.reduce(g.permute(hwc, [2, 0, 1]), [1, 2], ReduceOp.MEAN), "columns")
    g.add_output(g.gather(x, 1, idx), "gather_inner")
    g.add_output(g.gather(g.permute(x, [1, 0]), 0, idx), "gather_outer")
    q = g.input(Shape.of(6, 70, 8), DType.F32, "q")
    k = g.input(Shape.of(6, 90, 8), DType.F32, "k")
    v = g.input(Shape.of(6, 90, 12), DType.F32, "v")
    g.add_output(g.attention(q, k, v, None, 0.25, True), "attention")
    shapes = {"x": (3, 40000), "y": (70, 30, 40), "z": (300, 512), "s": (1, 512)}
    shapes |= {"hwc": (40, 40, 48), "q": (6, 70, 8), "k": (6, 90, 8), "v": (6, 90, 12)}
    feed: dict[str, np.ndarray] = {
        n: rng.standard_normal(sh).astype(np.float32) for n, sh in shapes.items()
    }
    feed["y"][3, 4, :7] = np.nan  # NaN positions must come out alike too
    feed["i"] = rng.integers(0, 3, 500)
    return g, feed


def _executor(g: Graph, threads: int) -> HostExecutor:
    return HostExecutor(plan(g, settings=PlanSettings(fused_attention=True)), threads=threads)


def _bits(arrays: list[np.ndarray]) -> list[bytes]:
    return [a.tobytes() for a in arrays]


@functools.cache
def _serial() -> list[bytes]:
    g, feed = _every_kernel()
    return _bits(_executor(g, 1).eval(feed))


def test_every_parallel_kernel_kind_is_in_the_graph() -> None:
    g, _ = _every_kernel()
    ex = _executor(g, 2)
    kinds = {c.kernel.name.rsplit("_", 1)[0] for c in ex.calls if c is not None}
    want = {"kn_ew", "kn_gather", "kn_softmax", "kn_layernorm", "kn_reduce", "kn_reduce_cols"}
    assert want | {"kn_attention"} <= kinds, kinds
    assert any("hv0" in c.kernel.source for c in ex.calls if c is not None)  # a table


@pytest.mark.parametrize("threads", [2, 3, 5, 8])
def test_the_pool_gives_the_serial_bits_at_any_thread_count(threads: int) -> None:
    g, feed = _every_kernel()
    ex = _executor(g, threads)
    for _ in range(3):  # the chunks go to different threads from one call to the next
        assert _bits(ex.eval(feed)) == _serial()
    if runtime.wait_policy() == "passive":  # active: the C steps run on OpenMP's team
        assert 1 <= build.pool().workers() <= 1023  # type: ignore[union-attr]


def test_the_results_match_the_reference() -> None:
    g, feed = _every_kernel()
    for name, a, b in zip(
        g.output_names, _executor(g, 3).eval(feed), evaluate(g, feed), strict=True
    ):
        assert_close(a, b, name)


@pytest.mark.parametrize("threads", [1, 2, 16])
def test_steps_with_fewer_units_than_threads(threads: int) -> None:
    """Two rows of an expensive elementwise step (two units: rows short enough not to be split
    into inner chunks), three query rows of a long attention: the work passes the threshold,
    the units are fewer than the threads."""
    rng = np.random.default_rng(2)
    g = Graph()
    x = g.input(Shape.of(2, 8000), DType.F32, "x")
    g.add_output(g.unary(UnaryOp.TANH, g.exp(g.mul(x, 0.1))), "ew")
    q = g.input(Shape.of(1, 3, 8), DType.F32, "q")
    kv = g.input(Shape.of(1, 4000, 8), DType.F32, "kv")
    g.add_output(g.attention(q, kv, kv, None, 0.2, False), "att")
    feed = {
        "x": rng.standard_normal((2, 8000)).astype(np.float32),
        "q": rng.standard_normal((1, 3, 8)).astype(np.float32),
        "kv": rng.standard_normal((1, 4000, 8)).astype(np.float32),
    }
    want = _bits(_executor(g, 1).eval(feed))
    ex = _executor(g, threads)
    assert "attention" in " ".join(ex.names)  # fused, not GEMMs
    for _ in range(3):
        got = ex.eval(feed)
        assert _bits(got) == want
    for name, a, b in zip(g.output_names, got, evaluate(g, feed), strict=True):
        assert_close(a, b, name)


def test_two_executors_on_two_python_threads() -> None:
    """Two executors evaluated at once from two Python threads: one gets the pool, the other
    runs its steps alone; neither waits for the other nor sees its chunks."""
    g, feed = _every_kernel()
    rng = np.random.default_rng(9)
    g2 = Graph()
    a = g2.input(Shape.of(400, 600), DType.F32, "a")
    g2.add_output(g2.softmax(g2.exp(g2.mul(a, 0.01)), 1), "sm")
    feed2 = {"a": rng.standard_normal((400, 600)).astype(np.float32)}
    want2 = _bits(_executor(g2, 1).eval(feed2))
    exs = [_executor(g, 2), _executor(g2, 3)]
    errors: list[str] = []

    def run(k: int) -> None:
        ex, f, want = exs[k], (feed, feed2)[k], (_serial(), want2)[k]
        for i in range(40):
            if _bits(ex.eval(f)) != want:
                errors.append(f"executor {k}, call {i}: other bits than alone")
                return

    ts = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in ts), "an evaluation hangs"
    assert not errors, errors


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_evaluates_without_the_parents_workers() -> None:
    g, feed = _every_kernel()
    ex = _executor(g, 3)
    ex.eval(feed)  # the pool has workers now; a child has none of them
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: evaluate, report, leave without pytest's teardown
        ok = False
        try:
            ok = _bits(ex.eval(feed)) == _serial()
        finally:
            os.write(w, b"1" if ok else b"0")
            os._exit(0)
    os.close(w)
    try:
        got = os.read(r, 1)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert got == b"1"


def test_spins_are_bounded_in_time() -> None:
    """The pause is timed (a plausible latency), and the spin counts follow from it: a spin of
    `ns` nanoseconds is about ns / pause_ns pauses, on any CPU."""
    tp = build.pool()
    assert tp is not None
    assert 0.1 <= tp.pause_ns < 2000
    assert tp.spins(build.POOL_SPIN_NS) == round(build.POOL_SPIN_NS / tp.pause_ns)


def test_the_gomp_spin_count_is_set_from_the_timed_pause_before_libgomp_loads() -> None:
    """In a fresh process under the passive wait policy: preparing a graph sets GOMP_SPINCOUNT
    to the pauses that take `build.GOMP_SPIN_NS` on this CPU (30 µs here, whatever the
    default; the active policy: tests/kn_cuda_eval/cpu/test_wait_policy.py), timed by the pool
    library, which does not load libgomp; then oneDNN (and libgomp, which reads the variable
    when it loads) comes."""
    code = (
        "import os\n"
        "from kn_cuda_eval.cpu import build\n"
        "from kn_runtime import Device\n"
        "from kn_graph import DType, Graph, Shape\n"
        "build.GOMP_SPIN_NS = 30_000\n"
        "tp = build.pool()\n"
        "assert 'libgomp' not in open('/proc/self/maps').read(), 'the pool loaded libgomp'\n"
        "g = Graph()\n"
        "x = g.input(Shape.of(1, 2, 8), DType.F32, 'x')\n"
        "g.add_output(g.matmul(x, g.input(Shape.of(1, 8, 4), DType.F32, 'w')), 'y')\n"
        "Device.cpu(threads=2).prepare(g)\n"
        "print(os.environ['GOMP_SPINCOUNT'], tp.pause_ns)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env["KN_CPU_WAIT"] = "passive"
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert r.returncode == 0, r.stderr
    count, pause_ns = r.stdout.split()
    assert int(count) == round(30_000 / float(pause_ns))
