"""The SSA graph: hash-consing, use counts, ownership, builder validation and canonicalisation."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

import kn_graph.binding
import kn_graph.graph
import kn_graph.reference
import kn_graph.shape
import kn_graph.size
from kn_graph import (
    BinaryOp,
    DType,
    Graph,
    GraphError,
    ReduceOp,
    Shape,
    ShapeMismatchError,
    Size,
    UnaryOp,
    Value,
)
from kn_graph.ops import (
    Binary,
    Broadcast,
    Concat,
    Constant,
    Gather,
    Input,
    Permute,
    Reduce,
    Slice,
    Tensor,
    Unary,
    View,
)
from kn_graph.shape import broadcast_shapes
from tests.conftest import graph_with

B = Size.sym("B")
S = Size.sym("S")


# -- doctests ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "module",
    [kn_graph.size, kn_graph.shape, kn_graph.graph, kn_graph.reference, kn_graph.binding],
    ids=lambda m: m.__name__,
)
def test_module_doctests_pass(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


# -- hash-consing -----------------------------------------------------------------------------------
def test_identical_nodes_are_shared():
    g, x = graph_with([4])
    a = g.exp(x)
    n = len(g)
    assert g.exp(x) == a
    assert len(g) == n
    assert g.add(x, a) == g.add(x, a)


def test_identical_constants_are_shared_by_content():
    g = Graph()
    a = g.constant(np.array([1.0, 2.0], np.float32))
    b = g.constant(np.array([1.0, 2.0], np.float32))
    assert a == b
    assert len(g) == 1


@pytest.mark.parametrize(
    "other",
    [
        np.array([1.0, 2.0], np.float64),
        np.array([[1.0, 2.0]], np.float32),
        np.array([1.0, 3.0], np.float32),
    ],
    ids=["dtype", "shape", "content"],
)
def test_constants_differing_in_dtype_shape_or_content_are_distinct(other):
    g = Graph()
    a = g.constant(np.array([1.0, 2.0], np.float32))
    assert g.constant(other) != a


def test_inputs_are_never_shared():
    g = Graph()
    a = g.input([3], DType.F32, "a")
    b = g.input([3], DType.F32, "b")
    assert a != b
    assert g.inputs == [a, b]
    assert g.input_names == ["a", "b"]
    assert isinstance(g[b].op, Input) and g[b].op.index == 1


def test_input_names_are_unique():
    g = Graph()
    g.input([1], DType.F32, "input1")
    g.input([1], DType.F32)  # the default name skips the taken one
    g.input([1], DType.F32)
    assert g.input_names == ["input1", "input2", "input3"]
    with pytest.raises(
        GraphError, match="input: the name 'input2' is already taken by another input"
    ):
        g.input([1], DType.F32, "input2")


def test_nodes_differing_in_attribute_are_distinct():
    g, x = graph_with([4, 4])
    assert g.softmax(x, 0) != g.softmax(x, 1)
    assert g.reduce(x, [0], ReduceOp.SUM) != g.reduce(x, [0], ReduceOp.MAX)


def test_debug_name_is_not_part_of_identity_and_set_once():
    g, x = graph_with([2])
    y = g.exp(x)
    g.set_debug_name(y, "first")
    g.set_debug_name(y, "second")
    assert g[y].debug_name == "first"
    assert g.exp(x) == y


def test_constant_data_is_private_and_read_only():
    g = Graph()
    arr = np.array([1.0, 2.0], np.float32)
    c = g.constant(arr)
    arr[0] = 99.0
    data = g.const_value(c)
    assert data is not None
    assert data.tolist() == [1.0, 2.0]
    assert not data.flags.writeable
    with pytest.raises(ValueError):
        data[0] = 5.0


def test_constant_from_read_only_view_does_not_alias_caller_memory():
    g = Graph()
    base = np.array([1.0, 2.0], np.float32)
    view = base[:]
    view.flags.writeable = False
    c = g.constant(view)
    base[0] = 99.0
    assert g.const_value(c).tolist() == [1.0, 2.0]
    # the digest still matches the data, so hash-consing stays right
    assert g.constant(np.array([1.0, 2.0], np.float32)) == c


def test_constant_with_dtype_converts():
    g = Graph()
    c = g.constant([1, 2], DType.F16)
    assert g.dtype(c) is DType.F16
    assert g.shape(c) == Shape.of(2)


def test_constant_of_unsupported_dtype_raises():
    g = Graph()
    with pytest.raises(GraphError, match="unsupported element type complex128"):
        g.constant(np.array([1j]))


# -- use counts ----------------------------------------------------------------------------------
def test_use_counts_count_operand_slots_not_outputs():
    g, x = graph_with([3])
    assert g.use_count(x) == 0
    y = g.mul(x, x)
    assert g.use_count(x) == 2
    z = g.exp(y)
    g.add_output(z)
    g.add_output(y)
    assert g.use_count(y) == 1
    assert g.use_count(z) == 0


def test_hash_consed_hit_does_not_add_uses():
    g, x = graph_with([3])
    g.exp(x)
    g.exp(x)
    assert g.use_count(x) == 1


def test_is_hidden_with_uses():
    g, x = graph_with([3])
    y = g.exp(x)
    z = g.add(y, y)
    w = g.unary(UnaryOp.SIN, z)
    g.add_output(w)
    assert not g.is_hidden_with_uses(x, 1)  # an input
    assert g.is_hidden_with_uses(y, 2)
    assert not g.is_hidden_with_uses(y, 1)
    assert g.is_hidden_with_uses(z, 1)
    assert not g.is_hidden_with_uses(w, 0)  # an output


# -- ownership ------------------------------------------------------------------------------------
def test_value_of_another_graph_raises():
    _, x1 = graph_with([3])
    g2, _ = graph_with([3])
    with pytest.raises(GraphError, match="belongs to another graph"):
        g2.exp(x1)
    with pytest.raises(GraphError, match="belongs to another graph"):
        g2[x1]
    with pytest.raises(GraphError, match="belongs to another graph"):
        g2.add_output(x1)
    with pytest.raises(GraphError, match="belongs to another graph"):
        g2.use_count(x1)


@pytest.mark.parametrize("index", [-1, 1, 5])
def test_forged_value_of_this_graph_raises(index):
    g, _ = graph_with([3])
    with pytest.raises(
        GraphError, match=f"value %{index} does not exist in this graph of 1 values"
    ):
        g[Value(index, g.id)]


def test_non_value_operand_raises():
    g, _ = graph_with([3])
    with pytest.raises(GraphError, match="expected a Value, found int"):
        g.exp(3)  # type: ignore[arg-type]


def test_graph_repr_and_len():
    g, x = graph_with([3])
    g.add_output(g.exp(x))
    assert len(g) == 2
    assert repr(g) == "<Graph 2 values, 1 inputs, 1 outputs>"


# -- printing ---------------------------------------------------------------------------------------
def test_str_graph_golden():
    g = Graph()
    x = g.input(Shape.of(B, 3), DType.F32, "x")
    w = g.constant(np.arange(6, dtype=np.float32).reshape(3, 2))
    y = g.softmax(g.matmul_nd(x, w), -1)
    z = g.reduce(y, [1], ReduceOp.MAX)
    c = g.cast(g.slice(x, 1, 0, 2), DType.F16)
    k = g.conv(
        g.input([1, 2, 5, 5], DType.F32, "img"),
        g.constant(np.ones((4, 1, 3, 3), np.float32)),
        stride=(2, 1),
        padding=(1, 1),
        groups=2,
    )
    g.add_output(z, "z")
    g.add_output(c)
    g.add_output(k, "k")
    assert str(g) == "\n".join(
        [
            '%0: f32[B,3] = input #0 "x"',
            "%1: f32[3,2] = const <6 values>",
            "%2: f32[1,B,3] = view(%0)",
            "%3: f32[1,3,2] = view(%1)",
            "%4: f32[1,B,2] = matmul(%2, %3)",
            "%5: f32[B,2] = view(%4)",
            "%6: f32[B,2] = softmax(%5) axis=1",
            "%7: f32[B] = reduce_max(%6) axes=[1]",
            "%8: f32[B,2] = slice(%0) axis=1 start=0 step=1",
            "%9: f16[B,2] = cast_f16(%8)",
            '%10: f32[1,2,5,5] = input #1 "img"',
            "%11: f32[4,1,3,3] = const <36 values>",
            "%12: f32[1,4,3,5] = conv(%10, %11) s=2x1 p=1 g=2",
            'outputs: %7 "z", %9 "output1", %12 "k"',
        ]
    )


def test_constant_printing_small_and_scalar():
    g = Graph()
    assert g.format_value(g.constant(np.array([1, 2], np.int32))) == "%0: i32[2] = const [1,2]"
    assert g.format_value(g.scalar(True, DType.BOOL)) == "%1: bool[] = const True"


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


# -- conv and matmul --------------------------------------------------------------------------------
def test_conv_output_shape():
    g, x = graph_with([B, 4, 9, 8])
    w = g.constant(np.zeros((6, 2, 3, 2), np.float32))
    y = g.conv(x, w, stride=(2, 3), padding=(1, 0), dilation=(1, 2), groups=2)
    # (9 + 2 - 2 - 1) // 2 + 1 = 5 ; (8 - 2 - 1) // 3 + 1 = 2
    assert g.shape(y) == Shape.of(B, 6, 5, 2)


@pytest.mark.parametrize(
    ("xs", "ws", "kw", "match"),
    [
        ([1, 4, 8], [2, 4], {}, r"expected x \[N,C,\*spatial\] and w of equal rank"),
        ([1, 4], [2, 4], {}, r"expected x \[N,C,\*spatial\]"),
        ([1, 4, 8], [2, 3, 3], {}, "input channels 4 != 1 groups x 3"),
        ([1, 4, 8], [5, 2, 3], {"groups": 2}, "5 filters not divisible by the groups"),
        ([1, 4, 8], [6, 2, 3], {"groups": 3}, "input channels 4 != 3 groups x 2"),
        ([1, 4, 8], [2, 4, 3], {"stride": (1, 1)}, "stride/padding/dilation must have 1 entries"),
        ([1, 4, 8], [2, 4, 3], {"stride": (0,)}, "invalid stride"),
        ([1, 4, 8], [2, 4, 3], {"padding": (-1,)}, "invalid stride"),
        ([1, 4, 8], [2, 4, 3], {"groups": 0}, "invalid stride"),
        ([1, 4, 2], [2, 4, 3], {}, r"kernel \[2,4,3\] larger than padded input \[1,4,2\]"),
        ([1, 4, 8], [2, 4, 5], {"dilation": (2,)}, "larger than padded input"),
    ],
)
def test_conv_validation(xs, ws, kw, match):
    g, x = graph_with(xs)
    w = g.constant(np.zeros(ws, np.float32))
    with pytest.raises(GraphError, match=match):
        g.conv(x, w, **kw)


def test_conv_requires_equal_float_dtypes():
    g, x = graph_with([1, 1, 4], DType.I32)
    with pytest.raises(GraphError, match="conv: expected equal float dtypes, found i32 and i32"):
        g.conv(x, g.constant(np.zeros((1, 1, 1), np.int32)))
    g, x = graph_with([1, 1, 4])
    with pytest.raises(GraphError, match="found f32 and f64"):
        g.conv(x, g.constant(np.zeros((1, 1, 1), np.float64)))


def test_conv_symbolic_spatial_size():
    g, x = graph_with([1, 1, B])
    w = g.constant(np.zeros((1, 1, 3), np.float32))
    assert g.shape(g.conv(x, w, padding=(1,))) == Shape.of(1, 1, B)
    assert g.shape(g.conv(x, w)) == Shape.of(1, 1, B - 2)
    assert str(g.shape(g.conv(x, w, stride=(2,), padding=(1,)))) == "[1,1,(B+1)//2]"
    g.check_bindings({"B": 3})
    with pytest.raises(ShapeMismatchError, match="must hold the kernel"):
        g.check_bindings({"B": 2})


@pytest.mark.parametrize(
    ("a", "b", "match"),
    [
        (
            ([2, 3, 4], DType.F32),
            ([2, 5, 6], DType.F32),
            r"matmul: expected \[b,m,k\] @ \[b,k,n\], found \[2,3,4\] @ \[2,5,6\]",
        ),
        (([2, 3, 4], DType.F32), ([3, 4, 6], DType.F32), "expected"),
        (([3, 4], DType.F32), ([4, 6], DType.F32), "expected"),
        (([1, 3, 4], DType.F32), ([1, 4, 6], DType.F64), r"matmul: dtypes differ \(f32 and f64\)"),
        (([1, 3, 4], DType.BOOL), ([1, 4, 6], DType.BOOL), "matmul: bool operands"),
    ],
)
def test_matmul_validation(a, b, match):
    g = Graph()
    with pytest.raises(GraphError, match=match):
        g.matmul(g.input(*a), g.input(*b))


# -- unary, cast, bitcast ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("op", "dtype", "match"),
    [
        (UnaryOp.EXP, DType.I32, "exp: expected a float operand, found i32"),
        (UnaryOp.FLOOR, DType.I64, "floor: expected a float operand, found i64"),
        (UnaryOp.NOT, DType.F32, "not: expected a bool operand, found f32"),
        (UnaryOp.BIT_NOT, DType.F32, "bit_not: expected an integer operand, found f32"),
        (UnaryOp.BIT_NOT, DType.BOOL, "bit_not: expected an integer operand, found bool"),
        (UnaryOp.NEG, DType.BOOL, "neg: bool operand"),
        (UnaryOp.ABS, DType.BOOL, "abs: bool operand"),
        (UnaryOp.CAST, DType.F32, r"cast: use cast\(\)/bitcast\(\)"),
        (UnaryOp.BITCAST, DType.F32, r"bitcast: use cast\(\)/bitcast\(\)"),
    ],
)
def test_unary_validation(op, dtype, match):
    g, x = graph_with([2], dtype)
    with pytest.raises(GraphError, match=match):
        g.unary(op, x)


def test_same_dtype_cast_and_bitcast_vanish():
    g, x = graph_with([2])
    assert g.cast(x, DType.F32) == x
    assert g.bitcast(x, DType.F32) == x


def test_cast_and_bitcast_nodes():
    g, x = graph_with([2])
    c = g.cast(x, DType.I8)
    assert g[c].op == Unary(x, UnaryOp.CAST) and g.dtype(c) is DType.I8
    b = g.bitcast(x, DType.U32)
    assert g[b].op == Unary(x, UnaryOp.BITCAST) and g.dtype(b) is DType.U32
    # casts to different types are different nodes
    assert g.cast(x, DType.I16) != c


def test_bitcast_between_sizes_raises():
    g, x = graph_with([2])
    with pytest.raises(GraphError, match="bitcast: f32 and f64 differ in size"):
        g.bitcast(x, DType.F64)


# -- binary -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("build", "dtype"),
    [
        (lambda g, x: g.add(x, 0), DType.F32),
        (lambda g, x: g.add(0.0, x), DType.F32),
        (lambda g, x: g.sub(x, 0), DType.I32),
        (lambda g, x: g.mul(x, 1), DType.F16),
        (lambda g, x: g.mul(1, x), DType.I64),
        (lambda g, x: g.div(x, 1), DType.F64),
        (lambda g, x: g.pow(x, 1.0), DType.F32),
        (lambda g, x: g.add(x, g.full(0.0, [2, 3], DType.F32)), DType.F32),
        (lambda g, x: g.mul(x, g.constant(np.ones((1, 3), np.float32))), DType.F32),
        (lambda g, x: g.add(x, -0.0), DType.F32),
    ],
    ids=["x+0", "0+x", "x-0", "x*1", "1*x", "x/1", "x**1", "x+full0", "x*ones", "x+-0"],
)
def test_identity_binary_ops_vanish(build, dtype):
    g, x = graph_with([2, 3], dtype)
    assert build(g, x) == x


@pytest.mark.parametrize(
    "build",
    [
        lambda g, x: g.sub(0, x),
        lambda g, x: g.div(1, x),
        lambda g, x: g.pow(1, x),
        lambda g, x: g.add(x, g.constant(np.zeros((4, 2, 3), np.float32))),  # broadcasts x
        lambda g, x: g.mul(x, g.constant(np.array([1.0, 1.0, 2.0], np.float32))),
        lambda g, x: g.add(x, float("nan")),
    ],
    ids=["0-x", "1/x", "1**x", "x+zeros-bigger", "x*[1,1,2]", "x+nan"],
)
def test_non_identity_binary_ops_stay(build):
    g, x = graph_with([2, 3])
    y = build(g, x)
    assert y != x
    assert isinstance(g[y].op, Binary)


def test_binary_broadcasts_numpy_style():
    g, x = graph_with([B, 1, 3])
    y = g.input([4, 1], DType.F32)
    z = g.add(x, y)
    assert g.shape(z) == Shape.of(B, 4, 3)
    op = g[z].op
    assert isinstance(op, Binary)
    assert g.shape(op.a) == g.shape(op.b) == Shape.of(B, 4, 3)


def test_python_scalar_takes_the_other_operands_dtype():
    g, x = graph_with([2], DType.I16)
    y = g.add(x, 3)
    assert g.dtype(y) is DType.I16
    assert g.scalar_value(g[y].op.b) == 3


@pytest.mark.parametrize(
    ("dtype", "value"),
    [(DType.I32, 0.5), (DType.U8, 300), (DType.U8, -1), (DType.I8, float("inf")), (DType.BOOL, 2)],
)
def test_python_scalar_not_representable_in_the_dtype_raises(dtype, value):
    g, x = graph_with([2], dtype)
    with pytest.raises(GraphError, match=f"{value!r}"):
        g.binary(BinaryOp.EQ, x, value)


def test_comparison_gives_bool():
    g, x = graph_with([2])
    for op in (BinaryOp.EQ, BinaryOp.LT, BinaryOp.LE, BinaryOp.GT, BinaryOp.GE):
        assert g.dtype(g.binary(op, x, 1.0)) is DType.BOOL


@pytest.mark.parametrize(
    ("op", "dtype", "match"),
    [
        (BinaryOp.AND, DType.I32, "and: expected bool operands, found i32"),
        (BinaryOp.XOR, DType.F32, "xor: expected bool operands, found f32"),
        (BinaryOp.BIT_AND, DType.F32, "bit_and: expected integer operands, found f32"),
        (BinaryOp.SHL, DType.BOOL, "shl: expected integer operands, found bool"),
        (BinaryOp.ADD, DType.BOOL, "add: not defined on bool operands"),
        (BinaryOp.LT, DType.BOOL, "lt: not defined on bool operands"),
    ],
)
def test_binary_dtype_validation(op, dtype, match):
    g, x = graph_with([2], dtype)
    with pytest.raises(GraphError, match=match):
        g.binary(op, x, x)


def test_binary_operand_dtypes_must_match():
    g, x = graph_with([2])
    with pytest.raises(GraphError, match=r"add: operand dtypes differ \(f32 and f64\)"):
        g.add(x, g.input([2], DType.F64))


def test_binary_shapes_must_broadcast():
    g, x = graph_with([2, 3])
    with pytest.raises(GraphError, match=r"cannot broadcast shapes \[2,3\], \[4\]"):
        g.mul(x, g.input([4], DType.F32))


def test_binary_needs_a_value():
    with pytest.raises(GraphError, match="mul: at least one operand must be a Value"):
        Graph().mul(2, 3)


# -- select, iota ------------------------------------------------------------------------------------
def test_select_broadcasts_all_three():
    g, x = graph_with([2, 1])
    c = g.input([3], DType.BOOL)
    s = g.select(c, x, 0.0)
    assert g.shape(s) == Shape.of(2, 3)
    assert all(g.shape(v) == Shape.of(2, 3) for v in g[s].op.inputs)


def test_select_with_equal_branches_vanishes():
    g, x = graph_with([2, 3])
    c = g.input([2, 3], DType.BOOL)
    assert g.select(c, x, x) == x


@pytest.mark.parametrize(
    ("cond", "b", "match"),
    [
        (DType.F32, DType.F32, "select: condition must be bool, found f32"),
        (DType.BOOL, DType.F64, r"select: branch dtypes differ \(f32 and f64\)"),
    ],
)
def test_select_validation(cond, b, match):
    g, x = graph_with([2])
    with pytest.raises(GraphError, match=match):
        g.select(g.input([2], cond), x, g.input([2], b))


def test_select_needs_a_value_branch():
    g = Graph()
    with pytest.raises(GraphError, match="select: at least one of the branches must be a Value"):
        g.select(g.input([2], DType.BOOL), 1.0, 2.0)


def test_iota_validation_and_shape():
    g = Graph()
    v = g.iota([B, 4], -1, DType.I32)
    assert g.shape(v) == Shape.of(B, 4) and g.dtype(v) is DType.I32
    assert g[v].op.axis == 1
    with pytest.raises(GraphError, match="iota: bool dtype"):
        g.iota([3], 0, DType.BOOL)
    with pytest.raises(GraphError, match="axis 2 out of range for rank 2"):
        g.iota([3, 3], 2)


# -- softmax, layernorm, reduce ------------------------------------------------------------------------
@pytest.mark.parametrize("builder", ["softmax", "layernorm"])
def test_normalisations_need_floats(builder):
    g, x = graph_with([2, 3], DType.I32)
    args = (x, 1) if builder == "softmax" else (x, 1, 1e-5)
    with pytest.raises(GraphError, match=f"{builder}: expected a float operand, found i32"):
        getattr(g, builder)(*args)


def test_softmax_normalises_axis():
    g, x = graph_with([2, 3])
    assert g.softmax(x, -1) == g.softmax(x, 1)
    with pytest.raises(GraphError, match="axis 2 out of range for rank 2"):
        g.softmax(x, 2)


@pytest.mark.parametrize("builder", ["softmax", "reduce", "iota", "layernorm"])
def test_axis_zero_of_a_rank_zero_value_is_out_of_range(builder):
    g, x = graph_with([])
    calls = {
        "softmax": lambda: g.softmax(x, 0),
        "reduce": lambda: g.reduce(x, [0], ReduceOp.SUM),
        "iota": lambda: g.iota([], 0),
        "layernorm": lambda: g.layernorm(x, 0, 1e-5),
    }
    with pytest.raises(GraphError, match="axis 0 out of range for rank 0"):
        calls[builder]()


def test_reduce_removes_sorted_unique_axes():
    g, x = graph_with([2, 3, 4, 5])
    y = g.reduce(x, [-1, 1, 3], ReduceOp.SUM)
    assert g[y].op == Reduce(x, (1, 3), ReduceOp.SUM)
    assert g.shape(y) == Shape.of(2, 4)


def test_reduce_keepdims_views_back():
    g, x = graph_with([2, 3, 4])
    y = g.reduce(x, [1], ReduceOp.MAX, keepdims=True)
    assert g.shape(y) == Shape.of(2, 1, 4)
    assert isinstance(g[y].op, View)


def test_reduce_over_no_axes_is_identity():
    g, x = graph_with([2, 3])
    assert g.reduce(x, [], ReduceOp.SUM) == x


def test_arg_reduce_gives_i64():
    g, x = graph_with([2, 3])
    y = g.reduce(x, [1], ReduceOp.ARGMAX)
    assert g.dtype(y) is DType.I64 and g.shape(y) == Shape.of(2)


@pytest.mark.parametrize(
    ("dtype", "axes", "op", "match"),
    [
        (DType.F32, [0, 1], ReduceOp.ARGMIN, r"reduce argmin: exactly one axis, found \[0, 1\]"),
        (DType.F32, [], ReduceOp.ARGMAX, "reduce argmax: exactly one axis"),
        (DType.BOOL, [0], ReduceOp.SUM, "reduce sum: bool operand"),
        (DType.I32, [0], ReduceOp.MEAN, "reduce mean: expected a float operand, found i32"),
        (DType.F32, [2], ReduceOp.SUM, "axis 2 out of range for rank 2"),
    ],
)
def test_reduce_validation(dtype, axes, op, match):
    g, x = graph_with([2, 3], dtype)
    with pytest.raises(GraphError, match=match):
        g.reduce(x, axes, op)


# -- misc -------------------------------------------------------------------------------------------
def test_negative_size_is_rejected():
    g = Graph()
    with pytest.raises(GraphError, match=r"input: negative size -1 in shape \[2,-1\]"):
        g.input([2, -1], DType.F32)


def test_scalar_value_looks_through_views_and_broadcasts():
    g, x = graph_with([2, 3])
    assert g.scalar_value(g.full(2.5, [2, 3], DType.F32)) == 2.5
    assert g.scalar_value(g.constant(np.full((2, 2), 7, np.int32))) == 7
    assert g.scalar_value(g.constant(np.array([1, 2], np.int32))) is None
    assert g.scalar_value(g.constant(np.zeros((0,), np.float32))) is None
    assert g.scalar_value(x) is None
    assert g.const_value(x) is None


def test_full_costs_one_element():
    g = Graph()
    f = g.full(3, [B, 1000], DType.I32)
    assert g.shape(f) == Shape.of(B, 1000)
    src = g[g[f].op.x].op.x  # broadcast(view(const))
    assert isinstance(g[src].op, Constant) and g.const_value(src).size == 1


def test_slice_raw_negative_start_on_symbolic_axis_raises():
    g, x = graph_with([B])
    with pytest.raises(GraphError, match=r"slice: negative start -1 on axis 0 \(B\)"):
        g.slice_raw(x, 0, -1, 1, 1)


# -- dtypes -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", list(DType), ids=str)
def test_dtype_round_trips_through_numpy(dtype):
    assert DType.from_np(dtype.np) is dtype
    assert dtype.size == np.dtype(dtype.np).itemsize
    assert str(dtype) == dtype.value and repr(dtype) == f"DType.{dtype.name}"


@pytest.mark.parametrize("dtype", list(DType), ids=str)
def test_dtype_kinds_partition_the_types(dtype):
    kinds = [dtype.is_float, dtype.is_int, dtype.is_bool]
    assert sum(kinds) == 1
    assert dtype.is_float == (dtype.np.kind == "f")
    assert dtype.is_signed == (dtype.np.kind in "fi")


def test_dtype_c_types():
    assert [DType.F32.c, DType.F16.c, DType.I64.c, DType.U8.c, DType.BOOL.c] == [
        "float",
        "half",
        "long long",
        "unsigned char",
        "bool",
    ]


@pytest.mark.parametrize("bad", [np.float32, "f32", None])
def test_builders_refuse_a_dtype_that_is_not_a_dtype(bad):
    g = Graph()
    with pytest.raises(GraphError, match="expected a DType"):
        g.input([3], bad)
    x = g.input([3], DType.F32)
    with pytest.raises(GraphError, match="expected a DType"):
        g.cast(x, bad)


# -- ops: operands, map_inputs, printing of attributes ----------------------------------------------
def test_inputs_and_map_inputs_follow_the_operand_fields():
    g, x = graph_with([2, 3])
    y = g.input([2, 3], DType.F32)
    c = g[g.concat([x, y, x], 0)].op
    assert c.inputs == (x, y, x)
    swapped = c.map_inputs(lambda v: y if v == x else x)
    assert swapped == Concat((y, x, y), 0)
    b = Binary(x, y, BinaryOp.SUB)
    assert b.map_inputs(lambda v: Value(v.index + 10, v.graph_id)).inputs == (
        Value(x.index + 10, g.id),
        Value(y.index + 10, g.id),
    )
    assert Input(0).inputs == () and Input(0).map_inputs(lambda v: v) == Input(0)


def test_attention_without_mask_has_three_operands():
    g = Graph()
    q, k, v = (g.input([1, 2, 4], DType.F32) for _ in range(3))
    op = g[g.attention(q, k, v)].op
    assert op.inputs == (q, k, v)
    assert op.map_inputs(lambda t: t).mask is None


@pytest.mark.parametrize(
    ("build", "text"),
    [
        (
            lambda g, x: g.conv(
                x, g.constant(np.zeros((4, 2, 3, 3), np.float32)), (1, 1), (0, 0), (2, 2), 2
            ),
            "s=1 p=0 d=2 g=2",
        ),
        (
            lambda g, x: g.conv(x, g.constant(np.zeros((2, 4, 1, 3), np.float32)), (2, 2), (0, 1)),
            "s=2 p=0x1",
        ),
        (lambda g, x: g.slice(x, 2, 1, None, 2), "axis=2 start=1 step=2"),
        (lambda g, x: g.reduce(x, [3, 1], ReduceOp.MEAN), "axes=[1, 3]"),
        (lambda g, x: g.permute(x, [0, 2, 3, 1]), "perm=[0, 2, 3, 1]"),
        (lambda g, x: g.layernorm(x, 3, 1e-5), "axis=3 eps=1e-05"),
        (lambda g, x: g.iota([2, 3], 1), "axis=1"),
    ],
)
def test_op_attributes_print(build, text):
    g, x = graph_with([1, 4, 8, 8])
    v = build(g, x)
    assert g.format_value(v).endswith(" " + text)


def test_tensor_identity_is_its_content():
    a = Tensor(np.arange(3, dtype=np.int32))
    b = Tensor(np.arange(3, dtype=np.int32))
    assert a == b and hash(a) == hash(b)
    assert a != Tensor(np.arange(3, dtype=np.int64))
    assert a != Tensor(np.arange(3, dtype=np.int32).reshape(3, 1))
    assert Tensor(np.array([-0.0])) != Tensor(np.array([0.0]))  # bits, not values
    assert Tensor(np.array([np.nan])) == Tensor(np.array([np.nan]))
    assert repr(a).startswith("Tensor(int32[3], ")


def test_tensor_of_a_non_contiguous_array_is_contiguous():
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = Tensor(base.T)
    assert t.array.flags.c_contiguous and not t.array.flags.writeable
    np.testing.assert_array_equal(t.array, base.T)
    assert t == Tensor(np.ascontiguousarray(base.T))
