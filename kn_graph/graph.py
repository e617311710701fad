"""The SSA graph: append-only, hash-consed, with validating and canonicalising builders.

`Graph` is the top of a stack of layers, each its own module importing only the one below:
`GraphBase` (values, guards, constants, printing), `LayoutBuilders` (view, broadcast, slice,
concat, ...), `ComputeBuilders` (conv, matmul, elementwise, reductions, dynamic ops) and
`NNBuilders` (conveniences lowered to those). The builders need a graph to build into, and the
graph is made of builders: stacking them keeps every import one-way.

>>> from kn_graph import DType, Shape, Size
>>> g = Graph()
>>> x = g.input(Shape.of(Size.sym("B"), 4), DType.F32, "x")
>>> y = g.relu(g.add(x, 1.0))
>>> g.add_output(y, "y")
>>> print(g)
%0: f32[B,4] = input #0 "x"
%1: f32[] = const 1.0
%2: f32[1,1] = view(%1)
%3: f32[B,4] = broadcast(%2)
%4: f32[B,4] = add(%0, %3)
%5: f32[] = const 0.0
%6: f32[1,1] = view(%5)
%7: f32[B,4] = broadcast(%6)
%8: f32[B,4] = max(%4, %7)
outputs: %8 "y"
"""

from __future__ import annotations

from kn_graph.graph_base import ValueInfo
from kn_graph.nn import NNBuilders

__all__ = ["Graph", "ValueInfo"]


class Graph(NNBuilders):
    """An append-only SSA graph. Index order is topological order."""
