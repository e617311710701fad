"""The layout builders (view, broadcast, permute, slice, gather, concat): how they canonicalise
and what they reject."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph import (
    DType,
    Graph,
    GraphError,
    Shape,
    ShapeMismatchError,
    Size,
)
from kn_graph.ops import (
    Broadcast,
    Concat,
    Gather,
    Permute,
    Slice,
    View,
)
from kn_graph.shape import broadcast_shapes
from tests.conftest import graph_with

B = Size.sym("B")
S = Size.sym("S")


# -- view ---------------------------------------------------------------------------------------------
def test_view_to_same_shape_is_identity():
    g, x = graph_with([2, 3])
    assert g.view(x, [2, 3]) == x


def test_nested_views_collapse():
    g, x = graph_with([2, 3, 4])
    v = g.view(g.view(x, [6, 4]), [24])
    assert g[v].op == View(x)
    assert g.view(g.view(x, [6, 4]), [2, 3, 4]) == x


def test_view_with_different_element_count_raises():
    g, x = graph_with([2, 3])
    with pytest.raises(GraphError, match=r"view: cannot reshape \[2,3\] to \[7\]"):
        g.view(x, [7])


def test_symbolic_view():
    g, x = graph_with([B, 4])
    assert g.shape(g.view(x, [4, B])) == Shape.of(4, B)
    with pytest.raises(GraphError, match="element counts differ"):
        g.view(x, [B, 2])


# -- broadcast ---------------------------------------------------------------------------------------
def test_broadcast_to_same_shape_is_identity():
    g, x = graph_with([2, 3])
    assert g.broadcast(x, [2, 3]) == x


def test_broadcast_adds_leading_axes_through_a_view():
    g, x = graph_with([3])
    y = g.broadcast(x, [2, 3])
    assert isinstance(g[y].op, Broadcast)
    inner = g[y].op.x
    assert g[inner].op == View(x) and g.shape(inner) == Shape.of(1, 3)


def test_nested_broadcasts_collapse():
    g, x = graph_with([1, 1])
    y = g.broadcast(g.broadcast(x, [1, 3]), [4, 3])
    assert g[y].op == Broadcast(x)


@pytest.mark.parametrize(("src", "dst"), [([2, 3], [3]), ([2, 3], [4, 3]), ([3], [2, 4])])
def test_invalid_broadcast_raises(src, dst):
    g, x = graph_with(src)
    with pytest.raises(GraphError, match="broadcast: cannot broadcast"):
        g.broadcast(x, dst)


@pytest.mark.parametrize(
    ("a", "b", "out"),
    [
        ([1, 3], [2, 1], [2, 3]),
        ([3], [4, 1, 3], [4, 1, 3]),
        ([], [2], [2]),
        ([0], [1], [0]),
        ([B, 1], [1, 5], [B, 5]),
    ],
)
def test_broadcast_shapes(a, b, out):
    assert broadcast_shapes(Shape.from_seq(a), Shape.from_seq(b)) == Shape.from_seq(out)


def test_broadcast_shapes_mismatch_names_axis_and_sizes():
    with pytest.raises(
        GraphError, match=r"cannot broadcast shapes \[B,3\], \[2,3\]: axis 0 has sizes B and 2"
    ):
        broadcast_shapes(Shape.of(B, 3), Shape.of(2, 3))


# -- permute -----------------------------------------------------------------------------------------
def test_identity_permute_vanishes():
    g, x = graph_with([2, 3, 4])
    assert g.permute(x, [0, 1, 2]) == x


def test_nested_permutes_compose():
    g, x = graph_with([2, 3, 4])
    p = g.permute(g.permute(x, [1, 2, 0]), [2, 0, 1])
    assert p == x  # the two are inverse
    q = g.permute(g.permute(x, [1, 0, 2]), [0, 2, 1])
    assert g[q].op == Permute(x, (1, 2, 0))
    assert g.shape(q) == Shape.of(3, 4, 2)


@pytest.mark.parametrize("perm", [[0, 1], [0, 0, 1], [0, 1, 3]])
def test_invalid_permutation_raises(perm):
    g, x = graph_with([2, 3, 4])
    with pytest.raises(GraphError, match="is not a permutation of rank 3"):
        g.permute(x, perm)


def test_transpose_swaps_last_two_axes_by_default():
    g, x = graph_with([2, 3, 4])
    assert g[g.transpose(x)].op == Permute(x, (0, 2, 1))
    with pytest.raises(GraphError, match="axis 3 out of range for rank 3"):
        g.transpose(x, 3, 0)


# -- slice -------------------------------------------------------------------------------------------
def test_full_slice_vanishes():
    g, x = graph_with([4, 5])
    assert g.slice(x, 1) == x
    assert g.slice(x, 1, 0, 5) == x
    assert g.slice(x, 1, -100, 100) == x


def test_reversing_a_length_one_axis_vanishes():
    g, x = graph_with([1, 3])
    assert g.slice(x, 0, None, None, -1) == x
    assert g.flip(x, 0) == x


def test_slice_normalises_python_bounds():
    g, x = graph_with([10])
    y = g.slice(x, 0, -3, None)
    assert g[y].op == Slice(x, 0, Size(7), 1) and g.shape(y) == Shape.of(3)
    y = g.slice(x, 0, None, None, -2)
    assert g[y].op == Slice(x, 0, Size(9), -2) and g.shape(y) == Shape.of(5)


def test_empty_slice_is_canonical():
    g, x = graph_with([10])
    a = g.slice(x, 0, 5, 5)
    b = g.slice(x, 0, 8, 2)
    c = g.slice(x, 0, 2, 8, -1)
    assert a == b == c
    assert g.shape(a) == Shape.of(0)


def test_length_one_slices_share_one_node_whatever_the_step():
    g, x = graph_with([10])
    assert g.slice_raw(x, 0, 4, 3, 1) == g.slice_raw(x, 0, 4, -1, 1) == g.slice(x, 0, 4, 5)


def test_symbolic_slice():
    g, x = graph_with([2 * B, 3])
    y = g.slice(x, 0, B)
    assert g.shape(y) == Shape.of(B, 3)
    assert g[y].op == Slice(x, 0, B, 1)
    z = g.slice(x, 0, None, None, 2)
    assert g.shape(z) == Shape.of(B, 3)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"step": 0}, "step must not be zero"),
    ],
)
def test_invalid_symbolic_slice_raises(kwargs, match):
    g, x = graph_with([B])
    with pytest.raises(GraphError, match=match):
        g.slice(x, 0, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "length", "guard_fails_at"),
    [
        ({"step": -1}, B, None),  # x[::-1]
        ({"start": -1}, Size(1), 0),  # x[-1:] assumes B >= 1
        ({"start": 2}, B - 2, 1),  # x[2:] assumes B >= 2
        ({"end": 5}, Size(5), 4),  # x[:5] assumes B >= 5
        ({"start": 1, "end": -1}, B - 2, 1),
        ({"end": 10**9}, B, None),  # an exporter's "to the end"
        ({"start": 1, "step": 2}, B // 2, 0),
    ],
)
def test_symbolic_slice_assumes_in_range_bounds_with_guards(kwargs, length, guard_fails_at):
    g, x = graph_with([B])
    y = g.slice(x, 0, **kwargs)
    assert g.shape(y) == Shape.of(length)
    sl = slice(kwargs.get("start"), kwargs.get("end"), kwargs.get("step"))
    for b in range(0, 9):
        if guard_fails_at is not None and b <= guard_fails_at:
            with pytest.raises(ShapeMismatchError, match="slice"):
                g.check_bindings({"B": b})
            continue
        g.check_bindings({"B": b})
        assert length.eval({"B": b}) == len(range(b)[sl])


@pytest.mark.parametrize(
    ("start", "step", "length"), [(0, 1, 11), (10, 1, 1), (5, 2, 4), (2, -1, 4), (-1, 1, 1)]
)
def test_slice_raw_out_of_range_raises(start, step, length):
    g, x = graph_with([10])
    with pytest.raises(
        GraphError,
        match=f"slice: start {start}, step {step}, length {length} out of range for axis 0 of size 10",
    ):
        g.slice_raw(x, 0, start, step, length)


def test_slice_axis_out_of_range_raises():
    g, x = graph_with([10])
    with pytest.raises(GraphError, match="axis 1 out of range for rank 1"):
        g.slice(x, 1)
    with pytest.raises(GraphError, match="axis -2 out of range for rank 1"):
        g.slice(x, -2)


def test_flip_is_a_negative_step_slice():
    g, x = graph_with([3, 4])
    y = g.flip(x, -1)
    assert g[y].op == Slice(x, 1, Size(3), -1)
    gb, xb = graph_with([B])
    assert gb[gb.flip(xb, 0)].op == Slice(xb, 0, B - 1, -1)


def test_slice_raw_negative_start_on_symbolic_axis_raises():
    g, x = graph_with([B])
    with pytest.raises(GraphError, match=r"slice: negative start -1 on axis 0 \(B\)"):
        g.slice_raw(x, 0, -1, 1, 1)


# -- gather -------------------------------------------------------------------------------------------
def idx(g, values):
    return g.constant(np.array(values, np.int64))


def test_gather_single_constant_index_becomes_slice():
    g, x = graph_with([4, 5])
    y = g.gather(x, 1, idx(g, [3]))
    assert g[y].op == Slice(x, 1, Size(3), 1)
    assert g.shape(y) == Shape.of(4, 1)


def test_gather_repeated_constant_index_becomes_slice_and_broadcast():
    g, x = graph_with([4, 5])
    y = g.gather(x, 1, idx(g, [-1, 4, 4]))
    assert isinstance(g[y].op, Broadcast)
    s = g[y].op.x
    assert g[s].op == Slice(x, 1, Size(4), 1)
    assert g.shape(y) == Shape.of(4, 3)


@pytest.mark.parametrize(
    ("indices", "start", "step"),
    [([0, 2, 4], 0, 2), ([3, 2, 1, 0], 3, -1), ([-4, -3], 1, 1), ([4, 1], 4, -3)],
)
def test_gather_arithmetic_progression_becomes_slice(indices, start, step):
    g, x = graph_with([5, 2])
    y = g.gather(x, 0, idx(g, indices))
    assert g[y].op == Slice(x, 0, Size(start), step)
    assert g.shape(y) == Shape.of(len(indices), 2)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16])
def test_gather_constant_narrow_index_types_on_a_long_axis(dtype):
    g, x = graph_with([1000])
    i = g.constant(np.array([1, 2, 5], dtype))
    y = g.gather(x, 0, i)
    assert g[y].op == Gather(x, 0, i)
    j = g.constant(np.array([-1, 2, 5], dtype)) if dtype != np.uint8 else i
    op = g[g.gather(x, 0, j)].op
    assert g.const_value(op.indices).tolist() == ([999, 2, 5] if dtype != np.uint8 else [1, 2, 5])


def test_gather_with_irregular_indices_stays_gather():
    g, x = graph_with([5, 2])
    i = idx(g, [0, 1, 3])
    y = g.gather(x, 0, i)
    assert g[y].op == Gather(x, 0, i)
    assert g.shape(y) == Shape.of(3, 2)


def test_gather_normalises_negative_constant_indices():
    g, x = graph_with([5])
    y = g.gather(x, 0, idx(g, [0, -1, 1]))
    op = g[y].op
    assert isinstance(op, Gather)
    assert g.const_value(op.indices).tolist() == [0, 4, 1]


@pytest.mark.parametrize("bad", [5, -6])
def test_gather_constant_index_out_of_range_raises(bad):
    g, x = graph_with([5])
    with pytest.raises(GraphError, match=f"gather: index {bad} out of range for axis 0 of size 5"):
        g.gather(x, 0, idx(g, [0, bad]))


@pytest.mark.parametrize(
    ("shape", "dtype"), [([2, 2], DType.I64), ([2], DType.F32), ([2], DType.BOOL)]
)
def test_gather_indices_must_be_rank_one_integers(shape, dtype):
    g, x = graph_with([5])
    with pytest.raises(GraphError, match="gather: indices must be a rank-1 integer tensor"):
        g.gather(x, 0, g.input(shape, dtype))


def test_gather_with_runtime_indices_has_index_count_on_axis():
    g, x = graph_with([5, B])
    i = g.input([7], DType.I32, "i")
    y = g.gather(x, 1, i)
    assert g.shape(y) == Shape.of(5, 7)


# -- concat --------------------------------------------------------------------------------------------
def test_concat_sums_the_axis():
    g, x = graph_with([B, 2])
    y = g.input([B, 3], DType.F32)
    c = g.concat([x, y, x], 1)
    assert g.shape(c) == Shape.of(B, 7)
    assert g[c].op == Concat((x, y, x), 1)


def test_concat_drops_empty_operands_and_single_operand_vanishes():
    g, x = graph_with([2, 3])
    e = g.input([2, 0], DType.F32)
    assert g.concat([e, x, e], 1) == x
    assert g.concat([x], 0) == x
    assert g.concat([e, e], 1) == e


@pytest.mark.parametrize(
    ("other", "match"),
    [
        (([2, 3], DType.F64), r"concat: operand 1 is f64\[2,3\], expected f32 of rank 2"),
        (([2, 3, 1], DType.F32), r"concat: operand 1 is f32\[2,3,1\], expected f32 of rank 2"),
        (
            ([3, 3], DType.F32),
            r"concat: operand 1 has shape \[3,3\], which differs from \[2,3\] off the concat axis 1",
        ),
    ],
)
def test_concat_validation(other, match):
    g, x = graph_with([2, 3])
    y = g.input(*other)
    with pytest.raises(GraphError, match=match):
        g.concat([x, y], 1)


def test_concat_of_nothing_raises():
    with pytest.raises(GraphError, match="concat: no operands"):
        Graph().concat([], 0)


def test_concat_symbolic_axis_sums_the_sizes():
    g, x = graph_with([B])
    y = g.concat([x, g.input([3], DType.F32)], 0)
    assert g.shape(y) == Shape.of(B + 3)
    assert str(g.shape(y)) == "[B+3]"


def test_concat_off_axis_sizes_that_differ_raise_without_an_equate_policy():
    g, x = graph_with([B, 2])
    with pytest.raises(GraphError, match="differs"):
        g.concat([x, g.input([S, 2], DType.F32)], 1)
