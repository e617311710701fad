"""Nodes in the order they can run: the ONNX spec wants a graph's nodes topologically sorted,
but exporters do not always keep it (float16 converters append their input casts at the end of
the node list), and onnxruntime sorts before it runs. So does the loader: a node runs after every
node whose output it reads, its subgraphs' reads of outer names included; a list already in
order is kept as it is; a real cycle is a clear error naming the nodes on it.

>>> from onnx import helper
>>> late = helper.make_node("Relu", ["a"], ["b"], name="late")
>>> early = helper.make_node("Neg", ["x"], ["a"], name="early")
>>> [n.name for n in topological_order([late, early])]
['early', 'late']
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

import onnx

from kn_graph.errors import OnnxImportError

__all__ = ["topological_order"]


def _subgraphs(node: onnx.NodeProto) -> Iterable[onnx.GraphProto]:
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            yield a.g
        elif a.type == onnx.AttributeProto.GRAPHS:
            yield from a.graphs


def _free_names(g: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads that it does not define: its captures of enclosing scopes."""
    defined = {i.name for i in g.input} | {t.name for t in g.initializer}
    defined |= {s.values.name for s in g.sparse_initializer}
    used: set[str] = {o.name for o in g.output}
    for n in g.node:
        defined.update(o for o in n.output if o)
        used.update(reads(n))
    return used - defined


def reads(node: onnx.NodeProto) -> set[str]:
    """The names `node` reads: its inputs, and what its subgraphs capture."""
    out = {i for i in node.input if i}
    for g in _subgraphs(node):
        out |= _free_names(g)
    return out


def topological_order(nodes: Sequence[onnx.NodeProto]) -> Sequence[onnx.NodeProto]:
    """`nodes` with every producer before its readers, ties kept in list order (a sorted list
    comes back unchanged). Names no node produces (graph inputs, initializers, outer scopes, or
    undefined ones, which the loader reports) impose no order. OnnxImportError on a cycle."""
    producer: dict[str, int] = {}
    for k, n in enumerate(nodes):
        for o in n.output:
            if o:
                producer.setdefault(o, k)
    needs = [{producer[r] for r in reads(n) if r in producer} - {k} for k, n in enumerate(nodes)]
    if all(all(p < k for p in ps) for k, ps in enumerate(needs)):
        return nodes
    users: list[list[int]] = [[] for _ in nodes]
    waiting = [len(ps) for ps in needs]
    for k, ps in enumerate(needs):
        for p in ps:
            users[p].append(k)
    ready = [k for k, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        k = heapq.heappop(ready)
        order.append(k)
        for u in users[k]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) < len(nodes):
        stuck = [k for k in range(len(nodes)) if waiting[k] > 0]
        where = ", ".join(
            f"'{nodes[k].name or nodes[k].output[0]}' ({nodes[k].op_type}) waits for "
            + ", ".join(sorted(f"'{r}'" for r in reads(nodes[k]) if producer.get(r) in stuck))
            for k in stuck[:4]
        )
        raise OnnxImportError(
            f"the graph has a cycle: {len(stuck)} nodes wait for each other's outputs "
            f"({where}{', ...' if len(stuck) > 4 else ''})"
        )
    return [nodes[k] for k in order]
