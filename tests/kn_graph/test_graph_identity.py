"""The SSA graph's identity rules: hash-consing, constants, use counts and ownership of values."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph import (
    DType,
    Graph,
    GraphError,
    ReduceOp,
    Shape,
    Size,
    UnaryOp,
    Value,
)
from kn_graph.ops import (
    Constant,
    Input,
    Tensor,
)
from tests.conftest import graph_with

B = Size.sym("B")


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


# -- sizes, scalar values of constants, tensor content --------------------------------------------
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


def test_content_digest_is_the_bytes_dtype_and_shape() -> None:
    """Constants are one when their bytes, dtype and shape are: the digest (XXH3-128 where
    xxhash is installed) tells apart a flipped byte, a reinterpreted dtype and a reshape."""
    from kn_graph.ops import content_digest

    a = np.arange(12, dtype=np.float32)
    same = content_digest(a.copy())
    assert content_digest(a) == same
    b = a.copy()
    b.view(np.uint8)[5] ^= 1
    others = {content_digest(b), content_digest(a.view(np.int32)), content_digest(a.reshape(3, 4))}
    assert same not in others and len(others) == 3
    assert content_digest(a[::2]) == content_digest(np.ascontiguousarray(a[::2]))
