"""Lazy elementwise values of the planner: a DAG of instruction nodes over leaf views.

Combining lazy values costs O(number of leaves), not O(program size): the new node points at
the operands' roots and nothing is copied. A value is flattened into a `Program` once, when a
kernel (or a row kernel's prologue) is emitted. Planning a chain of n elementwise ops is then
O(n); splicing whole operand programs at every op, as the planner once did, was O(n²).

A leaf (`Load`, `Index`) node does not hold its view: the `Lazy` maps it to one, so a view op
on a lazy value maps its few leaves and shares every node.

>>> from kn_graph.dtype import DType
>>> from kn_graph.ops import BinaryOp
>>> x = Lazy.of_view(StridedView.dense(256, (4,), DType.F32))
>>> one = Lazy.const((4,), 1.0, DType.F32)
>>> y = combine([x, one], (4,), Bin(BinaryOp.ADD, 0, 1, DType.F32))
>>> y.cost, y.to_expr().describe()
(1, '[add(ld0, 1.0) ld0=f32[4]:(1)@256]')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.program import Bin, Const, Index, Instr, Load, ProgramBuilder, Sel, Un
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType

__all__ = ["Lazy", "Node", "combine"]

Leaf = tuple["Node", StridedView]


@dataclass(frozen=True, slots=True, eq=False)
class Node:
    """One instruction. For `Un`/`Bin`/`Sel` the operand fields of `instr` are unused: `args`
    are the operands. Identity is the node itself (`eq=False`): DAGs are shared, never copied."""

    instr: Instr
    args: tuple[Node, ...] = ()


@dataclass(frozen=True, slots=True, eq=False)
class Lazy:
    """A lazy value read at every coordinate of `shape`: the DAG under `root`, with the views of
    its leaf nodes. `cost` counts arithmetic nodes (`Program.cost` of the flattened program, or
    more when two operands share an identical subexpression that flattening merges)."""

    shape: tuple[int, ...]
    root: Node
    loads: tuple[Leaf, ...]
    indices: tuple[Leaf, ...]
    cost: int

    @property
    def dtype(self) -> DType:
        return self.root.instr.dtype

    @staticmethod
    def of_view(view: StridedView) -> Lazy:
        node = Node(Load(0, view.dtype))
        return Lazy(view.shape, node, ((node, view),), (), 0)

    @staticmethod
    def const(shape: Sequence[int], value: float | int | bool, dtype: DType) -> Lazy:
        return Lazy(tuple(shape), Node(Const(value, dtype)), (), (), 0)

    @staticmethod
    def index(view: StridedView, dtype: DType) -> Lazy:
        """Element addresses of an index view as `dtype` (Iota)."""
        node = Node(Index(0, dtype))
        return Lazy(view.shape, node, (), ((node, view),), 0)

    @staticmethod
    def of_expr(e: st.Expr) -> Lazy:
        """The DAG of a flat expression (fresh nodes)."""
        nodes: list[Node] = []
        loads: dict[int, Node] = {}
        indices: dict[int, Node] = {}
        for ins in e.program.instrs:
            match ins:
                case Load(arg):
                    node = loads.setdefault(arg, Node(ins))
                case Index(arg):
                    node = indices.setdefault(arg, Node(ins))
                case _:
                    node = Node(ins, tuple(nodes[x] for x in ins.operands))
            nodes.append(node)
        return Lazy(
            e.shape,
            nodes[e.program.roots[0]],
            tuple((n, e.inputs[a]) for a, n in loads.items()),
            tuple((n, e.indices[a]) for a, n in indices.items()),
            e.program.cost,
        )

    def views(self) -> set[StridedView]:
        """The distinct arena views a kernel computing this value reads."""
        return {v for _, v in self.loads}

    def map(
        self, shape: Sequence[int], f: Callable[[StridedView], StridedView | None]
    ) -> Lazy | None:
        """A view op applied to every leaf (the nodes are shared); None when a leaf cannot
        follow."""
        loads = []
        for node, v in self.loads:
            w = f(v)
            if w is None:
                return None
            loads.append((node, w))
        indices = []
        for node, v in self.indices:
            w = f(v)
            if w is None:
                return None
            indices.append((node, w))
        return Lazy(tuple(shape), self.root, tuple(loads), tuple(indices), self.cost)

    def to_expr(self) -> st.Expr:
        """The flat expression: the nodes in post-order (operands in order), identical
        instructions merged, every distinct view loaded once. An explicit stack: chains are long."""
        leaf_view = {id(n): v for n, v in (*self.loads, *self.indices)}
        pb = ProgramBuilder()
        inputs: dict[StridedView, int] = {}
        indices: dict[StridedView, int] = {}
        done: dict[int, int] = {}  # id(node) -> instruction id
        stack: list[tuple[Node, bool]] = [(self.root, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in done:
                continue
            if not expanded and node.args:
                stack.append((node, True))
                stack.extend((a, False) for a in reversed(node.args) if id(a) not in done)
                continue
            ins = node.instr
            a = [done[id(x)] for x in node.args]
            match ins:
                case Load(_, dt):
                    v = leaf_view[id(node)]
                    ins = Load(inputs.setdefault(v, len(inputs)), dt)
                case Index(_, dt):
                    v = leaf_view[id(node)]
                    ins = Index(indices.setdefault(v, len(indices)), dt)
                case Const():
                    pass
                case Un(op, _, dt):
                    ins = Un(op, a[0], dt)
                case Bin(op, _, _, dt):
                    ins = Bin(op, a[0], a[1], dt)
                case Sel(_, _, _, dt):
                    ins = Sel(a[0], a[1], a[2], dt)
            done[id(node)] = pb.add(ins)
        return st.Expr(self.shape, tuple(inputs), tuple(indices), pb.build([done[id(self.root)]]))


def _merge_leaves(parts: Sequence[Lazy]) -> tuple[list[Lazy], tuple[Leaf, ...], tuple[Leaf, ...]]:
    """The union of the operands' leaves. A node two operands map to different views (a shared
    Iota seen through a permute by one of them) makes the later operand rebuild its DAG."""
    seen: dict[int, StridedView] = {}
    loads: list[Leaf] = []
    indices: list[Leaf] = []
    out: list[Lazy] = []
    for p in parts:
        if any(seen.get(id(n), v) != v for n, v in (*p.loads, *p.indices)):
            p = Lazy.of_expr(p.to_expr())
        for leaves, merged in ((p.loads, loads), (p.indices, indices)):
            for n, v in leaves:
                if id(n) not in seen:
                    seen[id(n)] = v
                    merged.append((n, v))
        out.append(p)
    return out, tuple(loads), tuple(indices)


def combine(parts: Sequence[Lazy], shape: tuple[int, ...], instr: Un | Bin | Sel) -> Lazy:
    """`instr` over the operands (its operand fields are ignored: operand k is `parts[k]`)."""
    parts, loads, indices = _merge_leaves(parts)
    root = Node(instr, tuple(p.root for p in parts))
    return Lazy(shape, root, loads, indices, 1 + sum(p.cost for p in parts))
