"""The mutation fuzzer in CI: a few hundred seeded cases over the committed fixtures and the ONNX
backend node models (some fed edge values: INT_MIN, -1, 0, max, NaN, ±Inf); each must run on the
reference and on `Device.cpu()` with the same outputs, or fail with one KnError — no other
exception, no disagreement, no hang, no crash. The long run is
`python -m tests.fuzz --cases 5000 [--seed N]`."""

from __future__ import annotations

import collections

import numpy as np

from kn_graph import DType, Graph
from kn_graph.ops import ReduceOp, UnaryOp
from tests.fuzz.__main__ import report
from tests.fuzz.compare import difference, graph_tolerance, localize, with_edge_values
from tests.fuzz.runner import FAILURES, FIXTURES, Outcome, run_case, run_cases

CASES = 400
SEED = 20240601


def test_fuzzed_models_agree_on_both_executors_or_raise_one_kn_error() -> None:
    outcomes = run_cases(SEED, range(CASES), workers=2, timeout=30.0)
    counts = collections.Counter(o.kind for o in outcomes)
    assert len(outcomes) == CASES
    bad = [o for o in outcomes if o.kind in FAILURES]
    assert not bad, report(bad, SEED, "all", len(FIXTURES))
    # the fuzzer must still reach evaluation and our errors, not fail everything in one place
    assert counts["ran"] > CASES // 10 and counts["KnError"] > CASES // 3, counts
    edges = [o for o in outcomes if any("edge values" in d for d in o.description)]
    assert sum(o.kind == "ran" for o in edges) > CASES // 50, counts


def _patch_product(monkeypatch, change) -> None:
    """`Device.cpu()`'s evaluations (not the reference's) return `change(outputs)`."""
    from kn_runtime import PreparedGraph

    real = PreparedGraph.eval

    def patched(self: PreparedGraph, inputs: object, **kw: bool) -> list[np.ndarray]:
        outs = real(self, inputs, **kw)  # type: ignore[arg-type]
        return change(outs) if self.device.fast else outs

    monkeypatch.setattr(PreparedGraph, "eval", patched)


def test_a_product_that_drops_an_output_or_raises_disagrees(monkeypatch, tmp_path) -> None:
    from kn_graph.errors import PlanError

    def case(i: int) -> Outcome:
        workdir = tmp_path / str(len(list(tmp_path.iterdir())))  # a fresh one, as a worker's
        workdir.mkdir()
        return run_case(SEED, i, workdir, "fixtures")

    ran = next(i for i in range(50) if case(i).kind == "ran")
    _patch_product(monkeypatch, lambda outs: outs[:-1])
    o = case(ran)
    assert o.kind == "disagree" and "values != reference" in o.detail, o

    def refuse(outs: object) -> list[np.ndarray]:
        raise PlanError("no")

    _patch_product(monkeypatch, refuse)
    o = case(ran)
    assert o.kind == "disagree" and "raised PlanError: no where the reference ran" in o.detail


def _perturbed(monkeypatch, dtype: type, factor: float) -> None:
    """Device.cpu() returns its positive outputs of `dtype` scaled by `factor`."""

    def scaled(outs: list[np.ndarray]) -> list[np.ndarray]:
        return [o * factor if o.dtype == dtype and (o > 0).all() else o for o in outs]

    _patch_product(monkeypatch, scaled)


def _exp_sum_as_f64() -> tuple[Graph, dict[str, np.ndarray]]:
    """cast_f64(sum(exp(x))) on x < 0 (so only exp, its sum and the cast are positive)."""
    g = Graph()
    x = g.input([4], DType.F32, "x")
    g.add_output(g.cast(g.reduce(g.unary(UnaryOp.EXP, x), [0], ReduceOp.SUM), DType.F64))
    return g, {"x": -np.arange(1, 5, dtype=np.float32)}


def test_localize_finds_the_first_differing_value(monkeypatch) -> None:
    what, round_off = localize(*_exp_sum_as_f64())
    assert "no value differs" in what and not round_off
    _perturbed(monkeypatch, np.float32, 1.01)  # exp is off by 1%: a real disagreement
    what, round_off = localize(*_exp_sum_as_f64())
    assert "first differing value %1: f32[4] = exp(%0)" in what and not round_off


def test_an_f64_output_of_f32_math_is_judged_at_f32_tolerance() -> None:
    g, _ = _exp_sum_as_f64()
    assert graph_tolerance(g) == 1e-4
    want, got = np.array([0.5]), np.array([0.5 * (1 + 1e-7)])
    assert "> 1e-09 (float64)" in str(difference([got], [want]))  # f64's own tolerance
    assert difference([got], [want], graph_tolerance(g)) is None


def test_a_value_recomputed_from_the_products_operands() -> None:
    from tests.fuzz.compare import _recomputed

    g, _ = _exp_sum_as_f64()
    total = g.value(2)  # sum(exp(x))
    again = _recomputed(g, total, {1: np.array([1.0, 2.0, 4.0, 8.0], np.float32)})
    assert again is not None and again.dtype == np.float32 and float(again) == 15.0
    assert _recomputed(g, g.value(0), {}) is None  # an input is not an op to redo


def test_difference_is_exact_for_integers_and_tolerant_for_floats() -> None:
    i = np.array([1, -(2**31), 2**31 - 1], np.int32)
    assert difference([i], [i.copy()]) is None
    off = i.copy()
    off[2] -= 1
    diff = difference([off], [i])
    assert diff is not None and "1 of 3 elements differ" in diff and "(2,)" in diff
    assert "shape [3] != reference [1, 3]" in str(difference([i], [i[None]]))
    assert "dtype int64 != reference int32" in str(difference([i.astype(np.int64)], [i]))
    assert "1 values != reference 2" in str(difference([i], [i, i]))
    f = np.array([1.0, 1000.0, -3.0], np.float32)
    assert difference([f * (1 + 1e-6)], [f]) is None  # within f32's tolerance
    assert "> 0.0001 (float32)" in str(difference([f + 1.0], [f]))
    assert difference([f.astype(np.float16) + 1], [f.astype(np.float16)]) is None  # 1e-3 of 1000
    seq = [[f, f], i]
    assert difference([[f, f + 1], i], seq) is not None and difference(seq, seq) is None


def test_difference_wants_nan_and_infinities_where_the_reference_has_them() -> None:
    want = np.array([np.nan, np.inf, -np.inf, 0.0], np.float32)
    assert difference([want.copy()], [want]) is None
    for k, v in [(0, 0.0), (3, np.nan), (1, -np.inf), (2, 3.0), (3, np.inf)]:
        got = want.copy()
        got[k] = v
        diff = difference([got], [want])
        assert diff is not None and f"first at ({k},)" in diff, (k, v, diff)


def test_edge_values_are_the_extremes_of_the_dtype() -> None:
    rng = np.random.default_rng(0)
    i8 = with_edge_values(np.zeros(400, np.int8), rng, 1.0)
    assert set(i8.tolist()) == {-128, -1, 0, 1, 127}
    u16 = with_edge_values(np.full(400, 7, np.uint16), rng, 0.25)
    assert {0, 1, 65535, 7} == set(u16.tolist())
    f = with_edge_values(np.ones(400, np.float16), rng, 0.5)
    assert np.isnan(f).any() and (f == np.inf).any() and (f == -np.inf).any() and (f == 1).any()
    assert with_edge_values(np.ones(3, bool), rng, 1.0).all()


def _misbehave(seed: int, index: int, workdir, corpus: str = "all", max_fixtures: int = 0):
    """A stand-in for run_case (the forked workers inherit it): case 0 hangs, case 1 crashes."""
    import os
    import signal
    import time

    from tests.fuzz.runner import Outcome

    if index == 0:
        time.sleep(60)
    if index == 1:
        os.kill(os.getpid(), signal.SIGSEGV)
    return Outcome(index, "ran", "", [f"case {index}"])


def test_the_pool_reports_hangs_and_crashes_and_goes_on(monkeypatch) -> None:
    import tests.fuzz.runner as runner

    monkeypatch.setattr(runner, "run_case", _misbehave)
    outcomes = runner.run_cases(0, range(5), workers=2, timeout=1.0, corpus="fixtures")
    assert [o.kind for o in outcomes] == ["hang", "crash", "ran", "ran", "ran"]
    assert "exit code -11" in outcomes[1].detail
