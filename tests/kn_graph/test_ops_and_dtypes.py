"""Element types and op dataclasses: DType properties, operand fields and `map_inputs`."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph import (
    BinaryOp,
    DType,
    Graph,
    GraphError,
    Value,
)
from kn_graph.ops import (
    Binary,
    Concat,
    Input,
)
from tests.conftest import graph_with


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


# -- ops: operands, map_inputs ---------------------------------------------------------------------
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
