"""The planner behind `plan(graph, batch_size) -> Plan`: one forward pass over the graph that
turns every value into a view of the arena, fusing elementwise chains, and emits the steps that
fill those views.

Each live value ends up in one of two states:
- *materialised*: a `StridedView` (inputs, constants, step outputs, and free views of those);
- *lazy*: a `Lazy` not yet computed — an elementwise DAG over views (kn_cuda_eval/planning/lazy.py;
  O(1) to extend, flattened once per kernel). Lazy values flow through view ops (the op is
  applied to every leaf view) and merge into their users, so a whole chain of
  Unary/Binary/Select/Iota becomes one kernel (split every `max_kernel_ops` instructions). A lazy
  value is materialised by an `Elementwise` step when it has more than one user or is an output
  (fusion never recomputes a shared value), and before any library call (cuBLAS, cuDNN). Row
  kernels (softmax, layernorm, reduce) take a lazy input as their prologue. A reduction over
  axes along which its input only repeats one value (an Expand, or a unary chain over one) is
  planned over one copy (kn_cuda_eval/planning/reduceplan.py), as the reference executor reduces
  broadcasts. Attention (attnplan), convolution fusion (convplan), GEMMs (gemm) and integer
  products (intplan) have modules of their own, which see the planner through
  `context.PlannerContext`.

Buffers are named in a planning address space (buffer id in the high bits of the offset) and
rebased to arena offsets once the steps are known (`assign.assign_memory`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import assert_never

import numpy as np

from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.assign import (
    MAX_BUFFER_BYTES,
    PlannedBuffer,
    buffer_address,
    buffer_of,
)
from kn_cuda_eval.planning.attnplan import plan_attention
from kn_cuda_eval.planning.context import State
from kn_cuda_eval.planning.convplan import ConvViews, conv_fusion, without_unit_axes
from kn_cuda_eval.planning.gemm import plan_gemm
from kn_cuda_eval.planning.intplan import plan_block_product, plan_integer_product
from kn_cuda_eval.planning.lazy import Lazy, combine
from kn_cuda_eval.planning.memory import BufferKind, human_bytes
from kn_cuda_eval.planning.program import Bin, Const, Load, Program, Sel, Un
from kn_cuda_eval.planning.reduceplan import plan_reduce_of_copies
from kn_cuda_eval.planning.settings import PlanSettings
from kn_cuda_eval.planning.view import StridedView, coalesce
from kn_graph.dtype import DType
from kn_graph.errors import KnError, PlanError
from kn_graph.filemap import release_pages
from kn_graph.graph import Graph
from kn_graph.ops import (
    Attention,
    Binary,
    BinaryOp,
    BlockQuantMatMul,
    Broadcast,
    Concat,
    Constant,
    Conv,
    Dynamic,
    Gather,
    Input,
    IntConv,
    IntMatMul,
    Iota,
    Layernorm,
    MatMul,
    Permute,
    Reduce,
    Select,
    Slice,
    Softmax,
    Unary,
    Value,
    View,
)
from kn_graph.shape import BATCH

__all__ = ["Planner", "bind_symbols"]

_MAX_FILLED_CONST = 1 << 20
"""A uniform constant is materialised as data up to this many bytes, else by a fill kernel."""


def _uniform(flat: np.ndarray) -> bool:
    """Whether every element equals the first. A few probes first: a real weight differs at
    once, and reading all of it would map the whole model file into memory at every plan (a
    BERT-base binding planned took 440 MB more at its peak)."""
    n = flat.size
    if n == 1:
        return True
    try:
        if not bool(np.all(flat[[0, 1, n // 2, n - 1]] == flat[0])):  # NaN: not uniform either
            return False
        return bool(np.all(flat == flat[0]))
    finally:  # a probe maps the page cache's whole folio: give a mapped file's pages back
        release_pages(flat)


def _scalar_const(e: st.Expr) -> Const | None:
    """The constant when the lazy value is one inlined scalar."""
    if len(e.program.instrs) == 1 and isinstance(e.program.instrs[0], Const):
        return e.program.instrs[0]
    return None


class Planner:
    """One planning pass over a graph at given bindings: `run()` fills `steps`, `bufs` and each
    value's `state` (views in planning addresses, before memory assignment)."""

    def __init__(self, graph: Graph, bindings: Mapping[str, int], settings: PlanSettings) -> None:
        self.g = graph
        self.bindings = dict(bindings)
        self.s = settings
        self.bufs: list[PlannedBuffer] = []
        self.steps: list[st.Step] = []
        n = len(graph)
        self.state: list[State | None] = [None] * n
        self.live = [False] * n
        for v in (*graph.outputs, *graph.inputs):  # every input gets a place, used or not
            self.live[v.index] = True
        for i in range(n - 1, -1, -1):  # reverse scan: operands come before their users
            if self.live[i]:
                for x in graph[Value(i, graph.id)].op.inputs:
                    self.live[x.index] = True
        self.uses = [0] * n
        self.users: list[list[int]] = [[] for _ in range(n)]
        for v in graph.values():
            if self.live[v.index]:
                for x in graph[v].op.inputs:
                    self.uses[x.index] += 1
                    self.users[x.index].append(v.index)
        self.is_output = {v.index for v in graph.outputs}
        self.deferred: dict[int, list[int]] = {}  # chain end -> conv fusion chain
        self.absorbed: set[int] = set()
        self._shapes: dict[int, tuple[int, ...]] = {}
        self.hosted = self._hosted_inputs() if settings.inputs_in_concat else {}
        self.hosts: dict[int, StridedView] = {}  # concat value -> the buffer an input lives in
        self.resident: list[StridedView] = []  # those buffers: live to the end, not reused

    def _hosted_inputs(self) -> dict[int, int]:
        """Inputs read only as the first operand of one Concat (a decoder's past, before the new
        positions): input value -> that concat (`PlanSettings.inputs_in_concat`)."""
        out: dict[int, int] = {}
        for i in self.g.inputs:
            users = self.users[i.index]
            if len(users) != 1 or i.index in self.is_output:
                continue
            op = self.g[self.val(users[0])].op
            if isinstance(op, Concat) and op.xs[0] == i and op.xs.count(i) == 1:
                out[i.index] = users[0]
        return out

    def views(self, values: Sequence[Value]) -> list[StridedView]:
        """The views of planned, materialised values (inputs, and outputs after `run()`)."""
        out: list[StridedView] = []
        for v in values:
            state = self.state[v.index]
            assert isinstance(state, StridedView), "inputs and outputs are materialised"
            out.append(state)
        return out

    # -- small helpers ---------------------------------------------------------------------------
    def val(self, i: int) -> Value:
        return Value(i, self.g.id)

    def shape(self, i: int) -> tuple[int, ...]:
        s = self._shapes.get(i)
        if s is None:
            s = self.g[self.val(i)].shape.eval(self.bindings)
            if any(d < 0 for d in s):
                raise PlanError(
                    f"{self.g.format_value(self.val(i))}: negative size {s} with {self.bindings}"
                )
            self._shapes[i] = s
        return s

    def name(self, i: int) -> str:
        info = self.g[self.val(i)]
        return f"%{i}" + (f" {info.debug_name}" if info.debug_name else "")

    def new_buffer(
        self, kind: BufferKind, size: int, name: str, data: np.ndarray | None = None
    ) -> int:
        self.bufs.append(PlannedBuffer(name, kind, size, data))
        return buffer_address(len(self.bufs) - 1)

    def temp(self, shape: Sequence[int], dtype: DType, name: str) -> StridedView:
        shape = tuple(shape)
        return StridedView.dense(
            self.new_buffer(BufferKind.TEMP, self.nbytes(shape, dtype, name), name), shape, dtype
        )

    def nbytes(self, shape: tuple[int, ...], dtype: DType, name: str) -> int:
        """Bytes of a dense tensor; PlanError when no plan can address it."""
        size = math.prod(shape) * dtype.size
        if size >= MAX_BUFFER_BYTES:
            raise PlanError(
                f"{name} {dtype}[{','.join(map(str, shape))}]: {size:,} bytes "
                f"({human_bytes(size)}) is more than a plan can address (below 2^48 bytes = "
                "256 TiB per tensor)"
            )
        return size

    def hidden_single_use(self, i: int) -> bool:
        return (
            self.uses[i] == 1
            and i not in self.is_output
            and not isinstance(self.g[self.val(i)].op, Input)
        )

    # -- states --------------------------------------------------------------------------------
    def expr(self, i: int) -> Lazy:
        s = self.state[i]
        assert s is not None, f"value %{i} used before it was planned"
        return Lazy.of_view(s) if isinstance(s, StridedView) else s

    def mat(self, i: int) -> StridedView:
        """The value as a view of memory, materialising a lazy value (once)."""
        s = self.state[i]
        assert s is not None, f"value %{i} used before it was planned"
        if isinstance(s, Lazy):
            op = self.g[self.val(i)].op
            if isinstance(op, Broadcast) and math.prod(self.shape(op.x.index)) < math.prod(
                self.shape(i)
            ):
                # store the small tensor and stretch it with zero strides, never the big one
                s = self.mat(op.x.index).broadcast(self.shape(i))
            else:
                s = self.materialize(s.to_expr(), self.name(i))
            self.state[i] = s
        return s

    def dense(self, view: StridedView, name: str) -> StridedView:
        """A row-major contiguous view of the same values (a Copy step when needed)."""
        if view.is_dense():
            return view
        out = self.temp(view.shape, view.dtype, name + " (dense)")
        self.copy(view, out)
        return out

    def copy(self, src: StridedView, dst: StridedView) -> None:
        if src.numel == 0:
            return
        shape, (ss, ds) = coalesce(src.shape, [src.strides, dst.strides])
        self.steps.append(
            st.Copy(
                StridedView(src.offset, shape, ss, src.dtype),
                StridedView(dst.offset, shape, ds, dst.dtype),
            )
        )

    def materialize(self, e: st.Expr, name: str, dest: StridedView | None = None) -> StridedView:
        """Compute a lazy value into `dest` (default: a new dense buffer)."""
        if len(e.program.instrs) == 1 and isinstance(e.program.instrs[0], Load) and dest is None:
            return e.inputs[0]
        c = _scalar_const(e)
        nbytes = math.prod(e.shape) * e.dtype.size
        if c is not None and dest is None and nbytes <= _MAX_FILLED_CONST:  # e.g. a uniform weight
            data = np.full(e.shape, c.value, dtype=e.dtype.np)
            return StridedView.dense(
                self.new_buffer(BufferKind.CONST, nbytes, name, data), e.shape, e.dtype
            )
        out = dest if dest is not None else self.temp(e.shape, e.dtype, name)
        self.emit_elementwise(e, (out,))
        return out

    def emit_elementwise(self, e: st.Expr, outs: Sequence[StridedView]) -> None:
        if math.prod(e.shape) == 0:
            return
        if len(e.program.instrs) == 1 and isinstance(e.program.instrs[0], Load) and len(outs) == 1:
            self.copy(e.inputs[0], outs[0])
            return
        views = [*outs, *e.inputs, *e.indices]
        shape, strides = coalesce(e.shape, [v.strides for v in views])
        nv = [StridedView(v.offset, shape, s, v.dtype) for v, s in zip(views, strides, strict=True)]
        no, ni = len(outs), len(e.inputs)
        self.steps.append(
            st.Elementwise(
                shape,
                tuple(nv[no : no + ni]),
                tuple(nv[no + ni :]),
                tuple(nv[:no]),
                Program(e.program.instrs, e.program.roots * no),
            )
        )

    def settle(self, i: int, e: Lazy) -> None:
        """Keep a freshly built lazy value lazy, or materialise it when fusing would recompute it
        (several users, or an output) or fusion is off."""
        cheap = e.cost == 0 and not e.loads
        if not cheap and (not self.s.fuse_elementwise or self.uses[i] > 1 or i in self.is_output):
            self.state[i] = self.materialize(e.to_expr(), self.name(i))
        else:
            self.state[i] = e

    def lazy_operands(self, ops: Sequence[int]) -> list[Lazy]:
        """Operand expressions, materialising the largest ones while a kernel would read too
        many views or exceed `max_kernel_ops` instructions."""
        exprs = [self.expr(x) for x in ops]
        sizes = [len(e.views()) for e in exprs]
        while len(set().union(*(e.views() for e in exprs))) > self.s.max_kernel_inputs:
            k = max(range(len(exprs)), key=lambda j: sizes[j])
            if sizes[k] <= 1:
                break
            exprs[k] = Lazy.of_view(self.mat(ops[k]))
            sizes[k] = 1
        while 1 + sum(e.cost for e in exprs) > self.s.max_kernel_ops:
            k = max(range(len(exprs)), key=lambda j: exprs[j].cost)
            if exprs[k].cost == 0:
                break
            exprs[k] = Lazy.of_view(self.mat(ops[k]))
        return exprs

    def row_input(self, i: int) -> st.Expr:
        """A row kernel's input: the lazy value as a prologue when it is cheap enough."""
        e = self.expr(i).to_expr()
        if e.program.cost > self.s.max_recompute or len(e.inputs) > self.s.max_kernel_inputs:
            e = st.Expr.of_view(self.mat(i))
        return e

    # -- the pass ------------------------------------------------------------------------------
    def run(self) -> None:
        for v in self.g.values():
            i = v.index
            if not self.live[i] or i in self.absorbed:
                continue
            if i in self.deferred:
                self.emit_conv_chain(self.deferred.pop(i))
                continue
            try:
                self.visit(i)
            except KnError:
                raise
            except Exception as e:  # a planner bug: say where
                raise PlanError(
                    f"while planning {self.g.format_value(v)}: {type(e).__name__}: {e}"
                ) from e
        for v in self.g.outputs:
            self.mat(v.index)
        self.drop_dead_steps()

    def drop_dead_steps(self) -> None:
        """Remove steps whose results nothing reads (e.g. a copy a fused kernel looked past)."""
        needed: set[int] = set()
        for v in self.g.outputs:
            s = self.state[v.index]
            assert isinstance(s, StridedView)
            needed.add(buffer_of(s.offset))
        keep: list[st.Step] = []
        for step in reversed(self.steps):
            if any(buffer_of(w.offset) in needed for w in step.writes()):
                keep.append(step)
                needed.update(buffer_of(r.offset) for r in step.reads())
        self.steps = keep[::-1]

    def visit(self, i: int) -> None:
        info = self.g[self.val(i)]
        shape = self.shape(i)
        op = info.op
        match op:
            case Input():
                self.visit_input(i, shape, info.dtype)
            case Constant(t):
                self.visit_constant(i, t.array)
            case View(x):
                self.view_op(i, x.index, lambda v: v.reshape(shape))
            case Broadcast(x):
                src = self.state[x.index]
                grow = math.prod(shape) > math.prod(self.shape(x.index))
                if (
                    isinstance(src, Lazy)
                    and grow
                    and src.cost > self.s.max_recompute
                    and src.to_expr().program.cost > self.s.max_recompute
                ):
                    self.mat(x.index)
                self.view_op(i, x.index, lambda v: v.broadcast(shape))
            case Permute(x, perm):
                self.view_op(i, x.index, lambda v: v.permute(perm))
            case Slice(x, axis, start, step):
                s0 = start.eval(self.bindings)
                self.view_op(i, x.index, lambda v: v.slice(axis, s0, step, shape[axis]))
            case Unary(x, u):
                e = self.lazy_operands([x.index])
                self.settle(i, combine(e, shape, Un(u, 0, info.dtype)))
            case Binary(a, b, bop):
                e = self.lazy_operands([a.index, b.index])
                self.settle(i, combine(e, shape, Bin(bop, 0, 0, info.dtype)))
            case Select(c, a, b):
                e = self.lazy_operands([c.index, a.index, b.index])
                self.settle(i, combine(e, shape, Sel(0, 0, 0, info.dtype)))
            case Iota(axis):
                strides = tuple(1 if k == axis else 0 for k in range(len(shape)))
                self.settle(i, Lazy.index(StridedView(0, shape, strides, DType.I64), info.dtype))
            case Gather(x, axis, indices):
                self.visit_gather(i, x.index, axis, indices.index)
            case Concat(xs, axis):
                self.visit_concat(i, [x.index for x in xs], axis)
            case Conv():
                self.visit_conv(i)
            case MatMul(a, b):
                out = self.temp(shape, info.dtype, self.name(i))
                self.gemm(self.mat(a.index), self.mat(b.index), out, 1.0)
                self.state[i] = out
            case Softmax(x, axis):
                out = self.temp(shape, info.dtype, self.name(i))
                self.row_step(self.row_input(x.index), out, [axis], lambda e, o: st.Softmax(e, o))
                self.state[i] = out
            case Layernorm(x, axis, eps):
                out = self.temp(shape, info.dtype, self.name(i))
                self.row_step(
                    self.row_input(x.index), out, [axis], lambda e, o: st.Layernorm(e, o, eps)
                )
                self.state[i] = out
            case Reduce(x, axes, rop):
                if plan_reduce_of_copies(self, i, x.index, axes, rop):
                    return  # repeated axes reduced on one copy (kn_cuda_eval.planning.reduceplan)
                out = self.temp(shape, info.dtype, self.name(i))
                self.row_step(
                    self.row_input(x.index),
                    out,
                    list(axes),
                    lambda e, o: st.Reduce(e, o, rop),
                    keep_out=False,
                )
                self.state[i] = out
            case Attention(q, k, v, mask, scale, causal):
                plan_attention(
                    self,
                    i,
                    q.index,
                    k.index,
                    v.index,
                    None if mask is None else mask.index,
                    scale,
                    causal,
                )
            case IntMatMul() | IntConv():
                plan_integer_product(self, i, op)
            case BlockQuantMatMul():
                plan_block_product(self, i, op)
            case Dynamic():
                raise PlanError(
                    f"{self.g.format_value(self.val(i))}: a data-dependent op; such graphs run "
                    "in segments (kn_cuda_eval.planning.segments, which Device.cuda().prepare uses)"
                )
            case _:
                assert_never(op)  # type: ignore[arg-type]

    def view_op(self, i: int, x: int, f: Callable[[StridedView], StridedView | None]) -> None:
        shape = self.shape(i)
        src = self.state[x]
        assert src is not None, f"value %{x} used before it was planned"
        if isinstance(src, Lazy):
            e = src.map(shape, f)
            if e is not None:
                self.settle(i, e)
                return
            src = self.mat(x)
        out = f(src)
        if out is None:  # a reshape no strides can express: copy to dense first
            out = f(self.dense(src, self.name(x)))
            assert out is not None
        self.state[i] = out

    def visit_constant(self, i: int, arr: np.ndarray) -> None:
        info = self.g[self.val(i)]
        flat = arr.reshape(-1)
        if flat.size >= 1 and _uniform(flat) and not np.isnan(flat[0]).any():
            self.state[i] = Lazy.const(arr.shape, flat[0].item(), info.dtype)
            return
        off = self.new_buffer(BufferKind.CONST, arr.nbytes, self.name(i), arr)
        self.state[i] = StridedView.dense(off, arr.shape, info.dtype)

    # -- row kernels -------------------------------------------------------------------------
    def row_step(
        self,
        e: st.Expr,
        out: StridedView,
        axes: list[int],
        make: Callable[[st.Expr, StridedView], st.Step],
        keep_out: bool = True,
    ) -> None:
        """Move `axes` last (free permutes), coalesce the outer and the row axes separately, and
        emit the step. `keep_out`: out has the full shape (softmax, layernorm), else only the
        outer axes (reduce)."""
        rank = len(e.shape)
        outer_axes = [a for a in range(rank) if a not in axes]
        perm = outer_axes + axes
        x_views = [v.permute(perm) for v in e.inputs]
        i_views = [v.permute(perm) for v in e.indices]
        o_view = out.permute(perm) if keep_out else out
        n_out = len(outer_axes)
        outer = tuple(e.shape[a] for a in outer_axes)
        row = tuple(e.shape[a] for a in axes)
        if math.prod(outer) == 0:
            return
        all_views = [*x_views, *i_views]
        oshape, ostr = coalesce(outer, [v.strides[:n_out] for v in [*all_views, o_view]])
        rshape, rstr = coalesce(row, [v.strides[n_out:] for v in all_views])
        if not rshape:  # a row of one element still has one axis
            rshape, rstr = (1,), [(0,) for _ in all_views]
        full = oshape + rshape
        new = [
            StridedView(v.offset, full, os + rs, v.dtype)
            for v, os, rs in zip(all_views, ostr[: len(all_views)], rstr, strict=True)
        ]
        o_strides = ostr[-1] + ((o_view.strides[-1],) if keep_out else ())
        if keep_out and o_view.shape[-1] == 1:
            o_strides = ostr[-1] + (0,)
        o_shape = oshape + rshape if keep_out else oshape
        if keep_out and len(rshape) != 1:
            raise PlanError("internal: a softmax/layernorm row must be one axis")
        x = st.Expr(full, tuple(new[: len(x_views)]), tuple(new[len(x_views) :]), e.program)
        self.steps.append(make(x, StridedView(o_view.offset, o_shape, o_strides, out.dtype)))

    # -- gather, concat ----------------------------------------------------------------------
    def visit_gather(self, i: int, x: int, axis: int, idx: int) -> None:
        info = self.g[self.val(i)]
        shape = self.shape(i)
        xv = self.mat(x)
        iv = self.mat(idx)
        out = self.temp(shape, info.dtype, self.name(i))
        self.state[i] = out
        if out.numel == 0:
            return
        if xv.shape[axis] == 0:
            raise PlanError(f"{self.g.format_value(self.val(i))}: gather from an empty axis")
        oshape, (oxs, oos) = coalesce(shape[:axis], [xv.strides[:axis], out.strides[:axis]])
        ishape, (ixs, ios) = coalesce(
            shape[axis + 1 :], [xv.strides[axis + 1 :], out.strides[axis + 1 :]]
        )
        ax = len(oshape)
        xn = StridedView(
            xv.offset, (*oshape, xv.shape[axis], *ishape), (*oxs, xv.strides[axis], *ixs), xv.dtype
        )
        on = StridedView(
            out.offset, (*oshape, shape[axis], *ishape), (*oos, out.strides[axis], *ios), out.dtype
        )
        self.steps.append(st.Gather(xn, iv, on, ax))

    def visit_input(self, i: int, shape: tuple[int, ...], dtype: DType) -> None:
        """An input buffer of its own, or the head of its concat's (`hosted`)."""
        c = self.hosted.get(i)
        if c is None:
            size = self.nbytes(shape, dtype, self.name(i))
            buf = self.new_buffer(BufferKind.INPUT, size, self.name(i))
            self.state[i] = StridedView.dense(buf, shape, dtype)
            return
        op = self.g[self.val(c)].op
        assert isinstance(op, Concat)
        size = self.nbytes(self.shape(c), dtype, self.name(c))
        full = StridedView.dense(
            self.new_buffer(BufferKind.INPUT, size, self.name(i)), self.shape(c), dtype
        )
        self.hosts[c] = full
        self.resident.append(full)
        self.state[i] = full.slice(op.axis, 0, 1, shape[op.axis])

    def visit_concat(self, i: int, xs: list[int], axis: int) -> None:
        info = self.g[self.val(i)]
        out = self.hosts.pop(i, None)  # its first operand, an input, is in place already
        if out is None:
            out = self.temp(self.shape(i), info.dtype, self.name(i))
        pos = 0
        for x in xs:
            n = self.shape(x)[axis]
            dest = out.slice(axis, pos, 1, n)
            pos += n
            s = self.state[x]
            if isinstance(s, Lazy):  # computed straight into its slot
                self.materialize(s.to_expr(), self.name(x), dest)
            elif s != dest:
                assert s is not None
                self.copy(s, dest)
        self.state[i] = out

    # -- matmul ------------------------------------------------------------------------------
    def gemm(self, a: StridedView, b: StridedView, out: StridedView, alpha: float) -> None:
        """out [b,m,n] (dense) = alpha · a [b,m,k] @ b [b,k,n] as one strided-batched GEMM."""
        step = plan_gemm(a, b, out, alpha, lambda v: self.dense(v, "gemm operand"))
        if isinstance(step, st.Expr):  # k == 0: the product is zero
            self.emit_elementwise(step, (out,))
        elif step is not None:
            self.steps.append(step)

    # -- convolution -------------------------------------------------------------------------
    def visit_conv(self, i: int) -> None:
        """Look ahead for conv → +bias → +residual → relu (each link hidden and used once) and
        defer the whole chain to its last value, when every operand has been planned."""
        chain = [i]
        if self.s.fuse_conv:
            cur = i
            for _ in range(3):
                if not self.hidden_single_use(cur):
                    break
                u = self.users[cur][0]
                if u in self.absorbed or u in self.deferred:  # another conv's chain has it
                    break
                op = self.g[self.val(u)].op
                if (
                    isinstance(op, Binary)
                    and op.op in (BinaryOp.ADD, BinaryOp.MAX)
                    and op.a != op.b
                ):
                    chain.append(u)
                    cur = u
                    if op.op is BinaryOp.MAX:
                        break
                else:
                    break
        if len(chain) == 1:
            self.emit_conv_chain(chain)
            return
        self.deferred[chain[-1]] = chain
        self.absorbed.update(chain[:-1])

    def emit_conv_chain(self, chain: list[int]) -> None:
        ci = chain[0]
        op = self.g[self.val(ci)].op
        assert isinstance(op, Conv)
        fused = conv_fusion(self, chain)
        last = chain[fused.length - 1]
        info = self.g[self.val(last)]
        out = self.temp(self.shape(last), info.dtype, self.name(last))
        x = self.dense(self.mat(op.x.index), self.name(op.x.index))
        w = self.dense(self.mat(op.w.index), self.name(op.w.index))
        d = op.details
        # the step's views (`out` stays the value's, with every axis)
        c = without_unit_axes(ConvViews(x, w, fused.residual, out, d.stride, d.padding, d.dilation))
        if out.numel > 0:
            self.steps.append(
                st.Conv(
                    c.x,
                    c.w,
                    fused.bias,
                    c.residual,
                    c.out,
                    c.stride,
                    c.padding,
                    c.dilation,
                    d.groups,
                    fused.relu,
                )
            )
        self.state[last] = out
        for j in chain[fused.length :]:  # the links that did not fuse are planned as usual
            self.absorbed.discard(j)
            self.visit(j)


def bind_symbols(
    graph: Graph, batch_size: int | None, bindings: Mapping[str, int] | None
) -> dict[str, int]:
    """Every size symbol the graph uses, bound: B from `batch_size`, the rest from `bindings`."""
    out = dict(bindings or {})
    if batch_size is not None:
        if BATCH in out and out[BATCH] != batch_size:
            raise PlanError(f"batch_size={batch_size} contradicts bindings {BATCH}={out[BATCH]}")
        out[BATCH] = int(batch_size)
    needed: set[str] = set()
    for v in graph.values():
        info = graph[v]
        needed |= info.shape.symbols
        if isinstance(info.op, Slice):
            needed |= info.op.start.symbols
    missing = sorted(needed - out.keys())
    if missing:
        hint = " (pass batch_size=...)" if BATCH in missing else ""
        raise PlanError(
            f"plan: no value for size symbol(s) {', '.join(missing)}{hint}; bindings given: {out}"
        )
    for k, val in out.items():
        if not isinstance(val, int | np.integer) or val < 0:
            raise PlanError(f"plan: symbol {k} must be a non-negative integer, found {val!r}")
    graph.check_bindings(out)  # the loader's assumptions (ShapeMismatchError when broken)
    return out
