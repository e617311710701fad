"""Work no machine can do (issue 19), on the fast CPU backend `Device.cpu()` against the
reference `Device.cpu(reference=True)`: a reduction over an `Expand` is answered from one copy
(as the reference's `_reduce` does); `Range` and `Tile` of 2^40 elements are an
`EvaluationError` naming the step and the bytes, raised before anything is allocated — never an
hour-long loop, a raw `OSError` from the arena's mmap or a NumPy `MemoryError`.

The ONNX cases run in a worker process under a time limit, so that a regression fails instead of
hanging CI; the small cases check the one-copy rewrite's numbers (emulator, CUDA kernels,
Device.cpu()) against the reference in process.
"""

from __future__ import annotations

import doctest
import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kn_cuda_eval.planning.limits as limits
from kn_cuda_eval import plan
from kn_cuda_eval.planning import steps as st
from kn_graph import DType, Graph, ReduceOp, Shape, UnaryOp
from kn_graph.errors import EvaluationError, PlanError
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_cuda_eval.helpers import assert_close, check_plan
from tests.paths import ROOT

N = 2**20  # Expand to [N, N]: 2^40 elements
BIG = 2**40
HANG = 60.0
"""Seconds a case may take in the worker before it counts as a hang (the regressions this file
guards against compute 2^40 elements: many minutes)."""
FAST = 1.0
"""Seconds an evaluation may take: every case here answers or refuses at once."""


# -- the ONNX cases -----------------------------------------------------------------------------
def _model(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], ins: list, outs: list):
    g = helper.make_graph(nodes, "impossible", ins, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _f32(name: str, shape: list[object]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _expand_then(*ops: str) -> bytes:
    """x f32[1] → Expand [2^20, 2^20] → ops (each with one input; Reduce* keep no dims)."""
    nodes = [helper.make_node("Expand", ["x", "shape"], ["v0"])]
    for k, op in enumerate(ops):
        attrs = {"keepdims": 0} if op.startswith("Reduce") else {}
        nodes.append(helper.make_node(op, [f"v{k}"], [f"v{k + 1}"], **attrs))
    nodes[-1].output[0] = "y"
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [N, N])
    return _model(nodes, [shape], [_f32("x", [1])], [_f32("y", [])]).SerializeToString()


def _range(then: str | None) -> bytes:
    """Range(0, 2^40, 1) in i64, as the output or reduced by `then`."""
    inits = [
        helper.make_tensor("start", TensorProto.INT64, [], [0]),
        helper.make_tensor("limit", TensorProto.INT64, [], [BIG]),
        helper.make_tensor("delta", TensorProto.INT64, [], [1]),
    ]
    nodes = [helper.make_node("Range", ["start", "limit", "delta"], ["r" if then else "y"])]
    shape: list[object] = [None]
    if then:
        nodes.append(helper.make_node(then, ["r"], ["y"], keepdims=0))
        shape = []
    out = helper.make_tensor_value_info("y", TensorProto.INT64, shape)
    return _model(nodes, inits, [], [out]).SerializeToString()


def _tile(n: int) -> bytes:
    """x f32[n] tiled 2^40 times."""
    reps = helper.make_tensor("reps", TensorProto.INT64, [1], [BIG])
    node = helper.make_node("Tile", ["x", "reps"], ["y"])
    return _model([node], [reps], [_f32("x", [n])], [_f32("y", [None])]).SerializeToString()


HALF = np.float32(0.5)
CASES: dict[str, tuple[Callable[[], bytes], Callable[[], list[np.ndarray]]]] = {
    "ReduceMax(Expand)": (lambda: _expand_then("ReduceMax"), lambda: [np.array([HALF])]),
    "ReduceSum(Expand)": (lambda: _expand_then("ReduceSum"), lambda: [np.array([HALF])]),
    "ReduceMean(Expand)": (lambda: _expand_then("ReduceMean"), lambda: [np.array([HALF])]),
    "ReduceSum(Exp(Expand))": (
        lambda: _expand_then("Exp", "ReduceSum"),
        lambda: [np.array([HALF])],
    ),
    "ReduceMax(Neg(Exp(Expand)))": (
        lambda: _expand_then("Exp", "Neg", "ReduceMax"),
        lambda: [np.array([HALF])],
    ),
    "Range": (lambda: _range(None), list),
    "ReduceMax(Range)": (lambda: _range("ReduceMax"), list),
    "Tile([3])": (lambda: _tile(3), lambda: [np.ones(3, np.float32)]),
    "Tile([1])": (lambda: _tile(1), lambda: [np.ones(1, np.float32)]),
}

_WORKER = """
import json, sys, time
import numpy as np
from kn_graph.errors import KnError
from kn_graph.onnx import load_onnx
from kn_runtime import Device
from tests.kn_cuda_eval.cpu.test_impossible_work import CASES
print("READY", flush=True)
for line in sys.stdin:
    name, device = json.loads(line)
    make, inputs = CASES[name]
    graph = load_onnx(make())
    dev = Device.cpu(reference=True) if device == "reference" else Device.cpu()
    res = {}
    t0 = time.perf_counter()
    try:
        prepared = dev.prepare(graph)
        t1 = time.perf_counter()
        outs = prepared.eval(inputs())
        res["eval_s"] = time.perf_counter() - t1
        res["outputs"] = [[o.dtype.str, list(o.shape), o.tolist()] for o in outs]
    except BaseException as e:
        res["error"] = type(e).__module__ + "." + type(e).__qualname__
        res["ours"] = isinstance(e, KnError)
        res["message"] = str(e)
    res["total_s"] = time.perf_counter() - t0
    print("RESULT " + json.dumps(res), flush=True)
"""


class _Worker:
    """One Python process that runs cases on request; a case past its time limit kills it (the
    next case starts a fresh one)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        env = dict(os.environ, PYTHONPATH=path, PYTHONWARNINGS="ignore")
        proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        if self._line(proc, "READY", HANG) is None:
            proc.kill()
            proc.wait()
            raise AssertionError("the worker process did not start")
        return proc

    @staticmethod
    def _line(proc: subprocess.Popen[str], prefix: str, timeout: float) -> str | None:
        assert proc.stdout is not None
        end = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while (left := end - time.monotonic()) > 0:
                if not sel.select(left):
                    break
                line = proc.stdout.readline()
                if not line:
                    return None  # the process died
                if line.startswith(prefix):
                    return line[len(prefix) :].strip()
        return None

    def run(self, name: str, device: str) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps([name, device]) + "\n")
        self.proc.stdin.flush()
        got = self._line(self.proc, "RESULT ", HANG)
        if got is None:
            died = self.proc.poll()
            self.close()
            return {"hang": died is None, "died": died}
        return json.loads(got)  # type: ignore[no-any-return]

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture(scope="module")
def worker() -> Iterator[_Worker]:
    w = _Worker()
    yield w
    w.close()


def _answer(res: dict[str, Any]) -> list[np.ndarray]:
    return [np.array(v, dtype=np.dtype(dt)).reshape(shape) for dt, shape, v in res["outputs"]]


def _run(worker: _Worker, name: str, device: str) -> dict[str, Any]:
    res = worker.run(name, device)
    assert not res.get("hang"), f"{name} on {device}: no answer within {HANG:g} s (a hang)"
    assert "died" not in res, f"{name} on {device}: the process died ({res['died']})"
    if "outputs" in res:
        assert res["eval_s"] < FAST, f"{name} on {device}: took {res['eval_s']:.2f} s"
    return res


def _refused(res: dict[str, Any], where: str) -> str:
    """The message of an EvaluationError/PlanError (never a raw OSError or MemoryError)."""
    assert "error" in res, f"{where}: answered {res['outputs']}, expected a refusal"
    ours = {f"kn_graph.errors.{c.__name__}" for c in (EvaluationError, PlanError)}
    assert res["error"] in ours, f"{where}: {res['error']}: {res['message']}"
    assert "GiB" in res["message"] or "TiB" in res["message"], res["message"]
    return str(res["message"])


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("ReduceMax(Expand)", np.float32(0.5)),
        ("ReduceSum(Expand)", np.float32(0.5) * np.float32(BIG)),
        ("ReduceMean(Expand)", np.float32(0.5)),
    ],
)
def test_a_reduction_of_an_expand_answers_from_one_copy_as_the_reference(
    worker: _Worker, case: str, expected: np.float32
) -> None:
    ref = _answer(_run(worker, case, "reference"))
    got = _answer(_run(worker, case, "fast"))
    assert ref == [expected]
    assert got[0].dtype == ref[0].dtype and got[0].shape == ref[0].shape
    assert got == ref  # the same float semantics: r·n in f32, not a 2^40-term sum


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("ReduceSum(Exp(Expand))", np.exp(np.float32(0.5)) * np.float32(BIG)),
        ("ReduceMax(Neg(Exp(Expand)))", -np.exp(np.float32(0.5))),
    ],
)
def test_a_unary_op_over_an_expand_is_applied_before_the_broadcast(
    worker: _Worker, case: str, expected: np.float32
) -> None:
    # the reference materialises exp of all 2^40 copies and refuses for memory; the fast
    # backend applies exp to the one copy first and answers
    msg = _refused(_run(worker, case, "reference"), f"{case} on the reference")
    assert "exp(" in msg
    got = _answer(_run(worker, case, "fast"))
    assert got[0].dtype == np.float32 and got[0].shape == ()
    np.testing.assert_allclose(got[0], expected, rtol=1e-6)


@pytest.mark.parametrize(
    ("case", "where"),
    [
        ("Range", r"written by step 0"),
        ("ReduceMax(Range)", r"step 0 (reduce"),
        ("Tile([3])", r"written by step 0"),
    ],
)
def test_work_larger_than_memory_is_refused_by_both_naming_the_step_and_bytes(
    worker: _Worker, case: str, where: str
) -> None:
    _refused(_run(worker, case, "reference"), f"{case} on the reference")
    res = _run(worker, case, "fast")
    msg = _refused(res, f"{case} on Device.cpu()")
    assert where in msg, msg
    assert "bytes" in msg and "memory available" in msg, msg
    assert res["total_s"] < FAST, f"refused only after {res['total_s']:.2f} s"


def test_an_output_broadcast_from_one_element_is_refused_before_copying_it(
    worker: _Worker,
) -> None:
    # the plan's output is a free stride-0 view of the input; the executor's fresh copy of it
    # would be 4 TiB (the reference evaluator makes the same copy: kn_graph.reference.evaluate)
    msg = _refused(_run(worker, "Tile([1])", "fast"), "Tile([1]) on Device.cpu()")
    assert "output 'y' f32[1099511627776]" in msg and "4,398,046,511,104 bytes" in msg, msg


# -- the one-copy rewrite, numerically ------------------------------------------------------------
def _stretched(
    dtype: DType, small: tuple[int, ...], big: tuple[int, ...], axes: list[int], op: ReduceOp
) -> Graph:
    g = Graph()
    x = g.input(Shape.of(*small), dtype, "x")
    g.add_output(g.reduce(g.broadcast(x, Shape.of(*big)), axes, op), "y")
    return g


def _input(dtype: DType, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(7)
    if dtype.is_float:
        return rng.uniform(0.5, 1.5, shape).astype(dtype.np)
    return rng.integers(-3, 4, shape).astype(dtype.np)


def _host(g: Graph, xs: list[np.ndarray]) -> list[np.ndarray]:
    return Device.cpu().prepare(g).eval(xs)


SHAPES = [  # (input, broadcast to, reduced axes): all, some, only kept axes are copies
    ((1, 1), (5, 7), [0, 1]),
    ((1, 3), (6, 3), [0, 1]),
    ((1, 3), (6, 3), [1]),
    ((4, 1, 3), (4, 5, 3), [1]),
    ((1, 3, 1), (4, 3, 5), [0, 1]),
]


ALL = [ReduceOp.SUM, ReduceOp.MEAN, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX]
OPS = [
    *((DType.F32, op) for op in ALL),
    *((DType.F16, op) for op in ALL),
    *((DType.I32, op) for op in ALL if op is not ReduceOp.MEAN),
    (DType.I64, ReduceOp.SUM),
    (DType.I64, ReduceOp.PROD),
]


@pytest.mark.parametrize(("small", "big", "axes"), SHAPES)
@pytest.mark.parametrize(("dtype", "op"), OPS, ids=lambda v: getattr(v, "name", v))
def test_reducing_copies_matches_the_reference(
    dtype: DType, op: ReduceOp, small: tuple[int, ...], big: tuple[int, ...], axes: list[int]
) -> None:
    g = _stretched(dtype, small, big, axes, op)
    xs = [_input(dtype, small)]
    ref = evaluate(g, xs)
    check_plan(g, xs, expected=ref, optimized=False)
    assert_close(_host(g, xs)[0], ref[0], "Device.cpu()")


def test_a_sum_of_an_iota_over_its_copies_matches_the_reference() -> None:
    g = Graph()
    g.add_output(g.reduce(g.iota(Shape.of(6, 4), 1, DType.I64), [0], ReduceOp.SUM), "y")
    ref = evaluate(g, [])
    assert ref[0].tolist() == [0, 6, 12, 18]
    (p,) = check_plan(g, [], expected=ref, optimized=False)
    assert not any(isinstance(s, st.Reduce) for s in p.steps), p
    assert (_host(g, [])[0] == ref[0]).all()


@pytest.mark.parametrize("op", [ReduceOp.ARGMAX, ReduceOp.ARGMIN])
def test_the_arg_extreme_over_copies_is_the_first(op: ReduceOp) -> None:
    g = Graph()
    x = g.input(Shape.of(3, 1), DType.F32, "x")
    g.add_output(g.reduce(g.exp(g.broadcast(x, Shape.of(3, 6))), [1], op), "y")
    xs = [np.array([[1.0], [np.nan], [-2.0]], np.float32)]
    ref = evaluate(g, xs)
    assert ref[0].tolist() == [0, 0, 0]
    check_plan(g, xs, expected=ref, optimized=False)
    assert (_host(g, xs)[0] == ref[0]).all()


def test_integer_sums_and_products_of_copies_wrap_as_numpy_does() -> None:
    for op, x, n, want in [
        (ReduceOp.SUM, 2**30, 8, np.int32(0)),  # 2^33 wraps to 0
        (ReduceOp.SUM, 3, 2**31 + 5, np.int32(-2147483633)),  # (2^31 + 5)·3 mod 2^32
        (ReduceOp.PROD, 3, 2**31 + 5, np.int32(3) ** (2**30 + 5)),  # the exponent reduced
        (ReduceOp.PROD, 2, 2**31 + 5, np.int32(0)),
    ]:
        g = _stretched(DType.I32, (1,), (n,), [0], op)
        xs = [np.array([x], np.int32)]
        got = _host(g, xs)[0]
        assert got.dtype == np.int32 and got == want, (op, x, n, got, want)


def test_a_long_unary_chain_over_copies_is_computed_on_one_copy() -> None:
    g = Graph()
    x = g.input(Shape.of(1, 4), DType.F32, "x")
    y = g.broadcast(x, Shape.of(2**30, 4))
    for _ in range(12):  # longer than PlanSettings.max_recompute: materialised, one copy only
        y = g.unary(UnaryOp.TANH, y)
    g.add_output(g.reduce(y, [0, 1], ReduceOp.SUM), "s")
    p = plan(g)
    assert p.arena_size < 4096, p
    xs = [np.linspace(-1, 1, 4, dtype=np.float32).reshape(1, 4)]
    one = xs[0]
    for _ in range(12):
        one = np.tanh(one)
    want = np.float32(np.sum(one, dtype=np.float32)) * np.float32(2**30)
    np.testing.assert_allclose(_host(g, xs)[0], want, rtol=1e-5)


# -- the guard itself -------------------------------------------------------------------------------
def test_check_plan_counts_arena_outputs_and_reduce_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    g = Graph()
    x = g.input(Shape.of(1024), DType.F32, "x")
    g.add_output(
        g.reduce(g.add(g.iota(Shape.of(1024, 1024), 1, DType.F32), x), [1], ReduceOp.SUM), "s"
    )
    p = plan(g)
    limits.check_plan(p)  # plenty of memory
    monkeypatch.setattr(limits, "available_bytes", lambda: p.arena_size + 2**20)
    with pytest.raises(
        EvaluationError, match=r"step 0 \(reduce .*\) computes a value of 4 MiB \(4,194,304 bytes\)"
    ):
        limits.check_plan(p)  # the 4 MiB the reduction's prologue stands for
    monkeypatch.setattr(limits, "available_bytes", lambda: 2**10)
    with pytest.raises(EvaluationError, match=r"the plan needs [\d.]+ KiB \([\d,]+ bytes: arena"):
        limits.check_plan(p)
    with pytest.raises(
        EvaluationError, match=r"^the arena needs 2 KiB \(2,048 bytes\), have 1 KiB"
    ):
        limits.check_allocation("the arena", 2048)


def test_the_module_doctest_passes() -> None:
    result = doctest.testmod(limits, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
