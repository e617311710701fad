r"""Lowering the integer products (IntMatMul, IntConv) to float64 MatMul / Conv for a device that
has no integer GEMM or convolution step.

Exact, not approximate: the shifted 8-bit operands are integers below 2^8 in magnitude, so every
product is below 2^16 and every sum of fewer than 2^37 of them is an integer float64 represents
exactly; the result then converts to int32 as the accumulator would hold it. It costs a float64
GEMM (cuBLAS DGEMM, or the host's) where an int8 one would do: a device adds a native step when
speed matters (the CPU backend's oneDNN int8 steps).

>>> import numpy as np
>>> from kn_graph import DType, Graph, Shape
>>> g = Graph()
>>> a = g.input(Shape.of(1, 2, 3), DType.U8, "a")
>>> b = g.constant(np.full((1, 3, 2), -2, np.int8))
>>> zero_a, zero_b = g.scalar(1, DType.U8), g.scalar(0, DType.I8)
>>> y = g.int_matmul(a, b, zero_a, zero_b)
>>> g.add_output(y, "y")
>>> print(*str(lower_integer_products(g)).splitlines()[-4:], sep="\n")
%15: f64[1,3,2] = sub(%12, %14)
%16: f64[1,2,2] = matmul(%11, %15)
%17: i32[1,2,2] = cast_i32(%16)
outputs: %17 "y"
"""

from __future__ import annotations

import weakref

from kn_graph.dtype import DType
from kn_graph.graph import Graph, ValueInfo
from kn_graph.ops import IntConv, IntMatMul, Op, Value
from kn_graph.shape import Shape

__all__ = ["has_integer_products", "lower_integer_products"]

_LOWERED: weakref.WeakKeyDictionary[Graph, Graph] = weakref.WeakKeyDictionary()


def has_integer_products(graph: Graph) -> bool:
    return any(isinstance(graph[v].op, IntMatMul | IntConv) for v in graph.values())


def _shifted(g: Graph, q: Value, zero: Value) -> Value:
    return g.sub(g.cast(q, DType.F64), g.cast(zero, DType.F64))


def lower_integer_products(graph: Graph) -> Graph:
    """A copy of `graph` with IntMatMul and IntConv computed in float64 (exact; see the module
    docstring) and converted to int32; everything else rebuilt as it is. Cached per graph."""
    from kn_graph.optimizer.core import rebuild_with

    done = _LOWERED.get(graph)
    if done is None:
        done = _LOWERED[graph] = rebuild_with(graph, _lowered)
    return done


def _lowered(g: Graph, info: ValueInfo, op: Op) -> Value | None:
    match op:
        case IntMatMul(a, b, za, zb):
            return g.cast(g.matmul(_shifted(g, a, za), _shifted(g, b, zb)), DType.I32)
        case IntConv(x, w, zx, zw, d):
            zw_k = g.view(zw, Shape.of(*g.shape(zw).dims, *[1] * (g[w].rank - 1)))
            acc = g.conv(
                _shifted(g, x, zx), _shifted(g, w, zw_k), d.stride, d.padding, d.dilation, d.groups
            )
            return g.cast(acc, DType.I32)
    return None
