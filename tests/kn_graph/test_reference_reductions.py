"""The NumPy reference executor's reductions, softmax and layernorm, against NumPy formulas."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph import DType, ReduceOp, Size
from tests.conftest import graph_with, run
from tests.kn_graph.reference_tables import FLOATS, INTS, assert_close

B = Size.sym("B")


# -- reduce -----------------------------------------------------------------------------------------
REDUCERS = {
    ReduceOp.SUM: np.sum,
    ReduceOp.MEAN: np.mean,
    ReduceOp.PROD: np.prod,
    ReduceOp.MIN: np.min,
    ReduceOp.MAX: np.max,
}


@pytest.mark.parametrize("axes", [(0,), (1,), (2,), (0, 2), (0, 1, 2)])
@pytest.mark.parametrize("op", list(REDUCERS), ids=lambda o: o.value)
@pytest.mark.parametrize("dtype", FLOATS)
def test_float_reductions(op, dtype, axes, rng):
    a = rng.uniform(0.5, 1.5, (3, 4, 5)).astype(dtype.np)
    g, x = graph_with([3, 4, 5], dtype)
    ref = REDUCERS[op](a.astype(np.float64), axis=axes).astype(dtype.np)
    assert_close(run(g, g.reduce(x, axes, op), a), ref, dtype)


@pytest.mark.parametrize(
    "op", [ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX], ids=lambda o: o.value
)
@pytest.mark.parametrize("dtype", INTS)
def test_int_reductions_stay_in_the_dtype(op, dtype, rng):
    a = rng.integers(0, 4, (3, 4, 5)).astype(dtype.np)
    g, x = graph_with([3, 4, 5], dtype)
    with np.errstate(over="ignore"):
        ref = REDUCERS[op](
            a, axis=(0, 2), **({} if op in (ReduceOp.MIN, ReduceOp.MAX) else {"dtype": dtype.np})
        )
    assert_close(run(g, g.reduce(x, [0, 2], op), a), ref, dtype)


@pytest.mark.parametrize(("op", "ref"), [(ReduceOp.MIN, np.all), (ReduceOp.MAX, np.any)])
def test_bool_min_max_are_all_any(op, ref, rng):
    a = rng.random((4, 5)) < 0.7
    g, x = graph_with([4, 5], DType.BOOL)
    np.testing.assert_array_equal(run(g, g.reduce(x, [1], op), a), ref(a, axis=1))


@pytest.mark.parametrize("dtype", [DType.F32, DType.F16, DType.I32, DType.U8])
@pytest.mark.parametrize(
    ("op", "ref"), [(ReduceOp.ARGMIN, np.argmin), (ReduceOp.ARGMAX, np.argmax)]
)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_arg_reductions_pick_the_first_extreme(op, ref, dtype, axis):
    a = np.array([[3, 1, 3, 0], [1, 1, 5, 5], [0, 2, 5, 0]], dtype.np)
    g, x = graph_with([3, 4], dtype)
    got = run(g, g.reduce(x, [axis], op), a)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, ref(a, axis=axis))


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MEAN])
def test_f16_reductions_accumulate_in_f32_on_every_axis(op):
    # f16 accumulation would stall at 256 (spacing 0.25 > 0.1) when reducing a leading axis,
    # and a product of 2000 x 1.001 would end near 5.8 instead of 7.0
    n, value = (2000, 1.001) if op is ReduceOp.PROD else (5000, 0.1)
    a = np.full((n, 2), value, np.float16)
    g, x = graph_with([n, 2], DType.F16)
    ref = REDUCERS[op](a.astype(np.float32), axis=0).astype(np.float16)
    np.testing.assert_array_equal(run(g, g.reduce(x, [0], op), a), ref)


def test_reductions_over_an_empty_axis():
    a = np.zeros((2, 0), np.float32)
    expected = {ReduceOp.SUM: 0.0, ReduceOp.PROD: 1.0, ReduceOp.MIN: np.inf, ReduceOp.MAX: -np.inf}
    for op, value in expected.items():
        g, x = graph_with([2, 0])
        np.testing.assert_array_equal(run(g, g.reduce(x, [1], op), a), [value, value])
    g, x = graph_with([2, 0], DType.I16)
    np.testing.assert_array_equal(
        run(g, g.reduce(x, [1], ReduceOp.MAX), a.astype(np.int16)), [-32768, -32768]
    )


def test_reduce_with_symbolic_batch(rng):
    a = rng.standard_normal((3, 4)).astype(np.float32)
    g, x = graph_with([B, 4])
    y = g.reduce(x, [0], ReduceOp.SUM, keepdims=True)
    np.testing.assert_allclose(run(g, y, a), a.sum(axis=0, keepdims=True), rtol=1e-6)


# -- softmax, layernorm ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_matches_formula(axis, dtype, rng):
    a = (rng.standard_normal((3, 4, 5)) * 4).astype(dtype.np)
    g, x = graph_with([3, 4, 5], dtype)
    e = np.exp(a.astype(np.float64))
    ref = e / e.sum(axis=axis, keepdims=True)
    assert_close(run(g, g.softmax(x, axis), a), ref.astype(dtype.np), dtype)


def test_softmax_is_stable_for_large_and_masked_inputs():
    a = np.array([[1000.0, 1000.0, -np.inf], [-1e4, 0.0, -np.inf]], np.float32)
    g, x = graph_with([2, 3])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        got = run(g, g.softmax(x, 1), a)
    np.testing.assert_allclose(got, [[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]], atol=1e-7)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_layernorm_matches_formula(axis, dtype, rng):
    a = (rng.standard_normal((3, 4, 6)) * 3 + 1).astype(dtype.np)
    g, x = graph_with([3, 4, 6], dtype)
    f = a.astype(np.float64)
    mean = f.mean(axis=axis, keepdims=True)
    ref = (f - mean) / np.sqrt(((f - mean) ** 2).mean(axis=axis, keepdims=True) + 1e-3)
    assert_close(run(g, g.layernorm(x, axis, 1e-3), a), ref.astype(dtype.np), dtype)


def test_layernorm_of_a_constant_row_is_zero():
    g, x = graph_with([2, 4])
    got = run(g, g.layernorm(x, 1, 1e-5), np.full((2, 4), 3.0, np.float32))
    np.testing.assert_array_equal(got, np.zeros((2, 4), np.float32))
