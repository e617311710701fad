"""The NumPy reference executor's layout ops (slice, view, permute, broadcast, concat, gather),
iota and select, against NumPy indexing."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph import BinaryOp, DType, EvaluationError, Graph, Size
from kn_graph.reference import evaluate
from tests.conftest import graph_with, random_array, run

B = Size.sym("B")


# -- shape ops --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("start", "end", "step"),
    [
        (None, None, -1),
        (None, None, -2),
        (5, 1, -1),
        (6, None, -3),
        (-2, 0, -2),
        (0, None, 3),
        (2, 7, 2),
        (None, -8, -1),
        (3, 3, -1),
    ],
)
def test_slice_matches_python_slicing(start, end, step):
    a = np.arange(7 * 3, dtype=np.int32).reshape(7, 3)
    g, x = graph_with([7, 3], DType.I32)
    np.testing.assert_array_equal(run(g, g.slice(x, 0, start, end, step), a), a[start:end:step])


def test_slice_symbolic_start(rng):
    a = rng.standard_normal((4, 6)).astype(np.float32)
    g, x = graph_with([2 * B, 6])
    y = g.slice(x, 0, B, None)
    np.testing.assert_array_equal(run(g, y, a), a[2:])


def test_flip_and_strided_slices_compose():
    a = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    g, x = graph_with([2, 3, 4], DType.I64)
    y = g.slice(g.flip(g.flip(x, 2), 0), 2, 1, None, 2)
    np.testing.assert_array_equal(run(g, y, a), a[::-1, :, ::-1][:, :, 1::2])


def test_view_permute_broadcast(rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    g, x = graph_with([2, 3, 4])
    y = g.broadcast(g.view(g.permute(x, [2, 0, 1]), [4, 1, 6]), [4, 5, 6])
    np.testing.assert_array_equal(
        run(g, y, a), np.broadcast_to(a.transpose(2, 0, 1).reshape(4, 1, 6), (4, 5, 6))
    )


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_matches_numpy(axis, rng):
    parts = [rng.standard_normal(s).astype(np.float32) for s in ([2, 3, 4], [2, 3, 4], [2, 3, 4])]
    g = Graph()
    xs = [g.input([2, 3, 4], DType.F32) for _ in parts]
    np.testing.assert_array_equal(
        run(g, g.concat(xs, axis), *parts), np.concatenate(parts, axis=axis)
    )


def test_concat_unequal_parts_and_empty(rng):
    a = rng.standard_normal((2, 1)).astype(np.float32)
    b = rng.standard_normal((2, 3)).astype(np.float32)
    g = Graph()
    x, y, e = g.input([2, 1], DType.F32), g.input([2, 3], DType.F32), g.input([2, 0], DType.F32)
    got = run(g, g.concat([x, e, y, x], 1), a, b, np.zeros((2, 0), np.float32))
    np.testing.assert_array_equal(got, np.concatenate([a, b, a], axis=1))


@pytest.mark.parametrize("dtype", [DType.I64, DType.I32, DType.U8, DType.I8])
def test_gather_with_runtime_indices(dtype, rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    i = np.array([4, 0, 0, 2], dtype.np)
    g, x = graph_with([3, 5])
    y = g.gather(x, 1, g.input([4], dtype, "i"))
    np.testing.assert_array_equal(run(g, y, a, i), np.take(a, i, axis=1))


def test_gather_with_irregular_constant_indices_including_negative(rng):
    a = rng.standard_normal((5, 2)).astype(np.float32)
    g, x = graph_with([5, 2])
    y = g.gather(x, 0, g.constant(np.array([0, -1, 1, 1], np.int64)))
    np.testing.assert_array_equal(run(g, y, a), a[[0, 4, 1, 1]])


@pytest.mark.parametrize("indices", [[0, 5], [-1, 0], [7]])
def test_gather_out_of_range_runtime_index_raises(indices):
    g, x = graph_with([2, 5])
    i = g.input([len(indices)], DType.I64, "i")
    g.add_output(g.gather(x, 1, i))
    with pytest.raises(EvaluationError) as e:
        evaluate(g, [np.zeros((2, 5), np.float32), np.array(indices, np.int64)])
    bad = next(v for v in indices if not 0 <= v < 5)
    assert f"gather: index {bad} out of range [0, 5) on axis 1" in str(e.value)
    assert "%2: f32[2," in str(e.value)  # names the value being computed


@pytest.mark.parametrize("dtype", [DType.F32, DType.I32, DType.I64, DType.F16, DType.U8])
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_iota(axis, dtype):
    g = Graph()
    y = g.iota([2, 3, 4], axis, dtype)
    shape = [1, 1, 1]
    shape[axis] = [2, 3, 4][axis]
    ref = np.broadcast_to(np.arange(shape[axis]).reshape(shape), (2, 3, 4)).astype(dtype.np)
    out = run(g, y)
    assert out.dtype == dtype.np
    np.testing.assert_array_equal(out, ref)


def test_iota_with_symbolic_length():
    g = Graph()
    x = g.input([B], DType.F32)
    y = g.add(g.cast(g.iota([B], 0, DType.I32), DType.F32), x)
    np.testing.assert_array_equal(run(g, y, np.full(4, 0.5, np.float32)), [0.5, 1.5, 2.5, 3.5])


def test_causal_mask_from_two_iotas():
    g = Graph()
    y = g.binary(BinaryOp.LE, g.iota([3, 4], 1), g.iota([3, 4], 0))
    np.testing.assert_array_equal(run(g, y), np.tril(np.ones((3, 4), bool)))


@pytest.mark.parametrize("dtype", [DType.F32, DType.I16, DType.BOOL])
def test_select_matches_np_where(dtype, rng):
    c = rng.random((3, 1)) < 0.5
    a = random_array(rng, (3, 4), dtype)
    b = random_array(rng, (4,), dtype)
    g = Graph()
    y = g.select(g.input([3, 1], DType.BOOL), g.input([3, 4], dtype), g.input([4], dtype))
    np.testing.assert_array_equal(run(g, y, c, a, b), np.where(c, a, b))


def test_select_with_python_scalar_branch():
    g = Graph()
    c = g.input([3], DType.BOOL)
    x = g.input([3], DType.F32)
    got = run(
        g, g.select(c, x, -1.0), np.array([True, False, True]), np.array([1, 2, 3], np.float32)
    )
    np.testing.assert_array_equal(got, [1, -1, 3])
