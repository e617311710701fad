"""Layout builders: the ops that move or re-label data without computing on it (view,
broadcast, permute, slice, gather, concat) and `full`. Each validates, canonicalises (a view of
a view is one view, an identity permute vanishes, a gather of equally spaced indices is a
slice) and ends in `_push`. Layered on `GraphBase`; `ComputeBuilders` builds on these.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kn_graph.dtype import DType
from kn_graph.errors import GraphError
from kn_graph.graph_base import GraphBase
from kn_graph.ops import Broadcast, Concat, Gather, Permute, Slice, Value, View
from kn_graph.shape import Shape, Size, SizeLike, norm_axis, slice_bounds

__all__ = ["LayoutBuilders"]


class LayoutBuilders(GraphBase):
    """Mixed into `Graph` through `ComputeBuilders`; builds from `GraphBase._push`."""

    def full(
        self, value: float | int | bool, shape: Shape | Sequence[SizeLike], dtype: DType
    ) -> Value:
        """A broadcast scalar: costs one element of storage, whatever the shape."""
        shape = shape if isinstance(shape, Shape) else Shape.from_seq(shape)
        return self.broadcast(self.scalar(value, dtype), shape)

    def view(self, x: Value, shape: Shape | Sequence[SizeLike]) -> Value:
        shape = shape if isinstance(shape, Shape) else Shape.from_seq(shape)
        info = self[x]
        if info.shape == shape:
            return x
        if info.shape.size() != shape.size():
            if self.equate is None or (info.shape.is_fixed and shape.is_fixed):
                raise GraphError(
                    f"view: cannot reshape {info.shape} to {shape} (element counts differ)"
                )
            self._same(
                info.shape.size(), shape.size(), f"reshape {info.shape} to {shape} (element count)"
            )
        if isinstance(info.op, View):
            inner = self[info.op.x].shape
            if inner.size() == shape.size() or self.equate is not None:
                return self.view(info.op.x, shape)
            return self._push(shape, info.dtype, View(x))
        return self._push(shape, info.dtype, View(x))

    def broadcast(self, x: Value, shape: Shape | Sequence[SizeLike]) -> Value:
        shape = shape if isinstance(shape, Shape) else Shape.from_seq(shape)
        info = self[x]
        if info.rank > shape.rank:
            raise GraphError(f"broadcast: cannot broadcast {info.shape} to lower rank {shape}")
        if info.rank < shape.rank:
            x = self.view(x, Shape((Size(1),) * (shape.rank - info.rank)) + info.shape)
            info = self[x]
        if info.shape == shape:
            return x
        for i, (a, b) in enumerate(zip(info.shape, shape, strict=True)):
            if a != b and a != Size(1):
                raise GraphError(f"broadcast: cannot broadcast {info.shape} to {shape} (axis {i})")
        if isinstance(info.op, Broadcast):
            return self.broadcast(info.op.x, shape)
        return self._push(shape, info.dtype, Broadcast(x))

    def permute(self, x: Value, perm: Sequence[int]) -> Value:
        info = self[x]
        perm = tuple(int(p) for p in perm)
        if sorted(perm) != list(range(info.rank)):
            raise GraphError(f"permute: {list(perm)} is not a permutation of rank {info.rank}")
        if perm == tuple(range(info.rank)):
            return x
        if isinstance(info.op, Permute):
            inner = info.op.perm
            return self.permute(info.op.x, [inner[p] for p in perm])
        shape = Shape(tuple(info.shape[p] for p in perm))
        return self._push(shape, info.dtype, Permute(x, perm))

    def transpose(self, x: Value, a: int = -1, b: int = -2) -> Value:
        r = self[x].rank
        perm = list(range(r))
        a, b = norm_axis(a, r), norm_axis(b, r)
        perm[a], perm[b] = perm[b], perm[a]
        return self.permute(x, perm)

    def slice(
        self,
        x: Value,
        axis: int,
        start: SizeLike | None = None,
        end: SizeLike | None = None,
        step: int = 1,
    ) -> Value:
        """Python slicing `x[start:end:step]` along one axis: negative fixed bounds count from
        the end, bounds are clamped to the axis (symbolically: `min(end, seq)`)."""
        info = self[x]
        axis = norm_axis(axis, info.rank)
        if step == 0:
            raise GraphError("slice: step must not be zero")
        dim = info.shape[axis]
        n = dim.fixed_value()
        if n is not None and all(
            s is None or isinstance(s, int) or Size.of(s).is_fixed for s in (start, end)
        ):

            def as_int(s: SizeLike | None) -> int | None:
                return None if s is None else Size.of(s).as_int()

            r = range(*slice(as_int(start), as_int(end), step).indices(n))
            return self.slice_raw(x, axis, Size(r.start if len(r) else 0), step, len(r))
        first, length, conds = slice_bounds(
            dim,
            None if start is None else Size.of(start),
            None if end is None else Size.of(end),
            step,
            clamp=self.is_runtime_size(dim),
        )
        for lhs, rhs in conds:
            self.add_guard(lhs, ">=", rhs, f"slice [{start}:{end}:{step}] of axis {axis} ({dim})")
        return self.slice_raw(x, axis, first, step, length)

    def slice_raw(self, x: Value, axis: int, start: SizeLike, step: int, length: SizeLike) -> Value:
        """Elements start, start+step, … (`length` of them) along `axis`; bounds are checked."""
        info = self[x]
        axis = norm_axis(axis, info.rank)
        start, length = Size.of(start), Size.of(length)
        dim = info.shape[axis]
        if step == 0:
            raise GraphError("slice: step must not be zero")
        if length == Size(0):
            start, step = Size(0), 1
        elif start.is_fixed and length.is_fixed and dim.is_fixed:
            s0, n = start.as_int(), length.as_int()
            last = s0 + (n - 1) * step
            if not (0 <= s0 < dim.as_int() and 0 <= last < dim.as_int()):
                raise GraphError(
                    f"slice: start {start}, step {step}, length {length} out of range for axis "
                    f"{axis} of size {dim}"
                )
        else:
            if start.bounds()[1] < 0:
                raise GraphError(f"slice: negative start {start} on axis {axis} ({dim})")
            what = f"slice of axis {axis} ({dim}): start {start}, step {step}, length {length}"
            if step > 0:
                self.add_guard(start, ">=", 0, what)
                self.add_guard(dim, ">=", start + (length - 1) * step + 1, what)
            else:
                self.add_guard(dim, ">=", start + 1, what)
                self.add_guard(start + (length - 1) * step, ">=", 0, what)
        if length == Size(1):
            step = 1
        if length == dim and start == Size(0) and step == 1:
            return x
        return self._push(info.shape.replace(axis, length), info.dtype, Slice(x, axis, start, step))

    def flip(self, x: Value, axis: int) -> Value:
        info = self[x]
        axis = norm_axis(axis, info.rank)
        n = info.shape[axis]
        if n == Size(1) or n == Size(0):
            return x
        return self.slice_raw(x, axis, n - 1, -1, n)

    def gather(self, x: Value, axis: int, indices: Value) -> Value:
        """x.take(indices, axis) for rank-1 integer indices (other ranks: view around it)."""
        info, ii = self[x], self[indices]
        axis = norm_axis(axis, info.rank)
        if ii.rank != 1 or not ii.dtype.is_int:
            raise GraphError(
                f"gather: indices must be a rank-1 integer tensor, found {ii.dtype}{ii.shape}"
            )
        idx = self.const_value(indices)
        dim = info.shape[axis]
        if idx is not None and dim.is_fixed:
            n = dim.as_int()
            idx = idx.astype(np.int64) if idx.dtype.kind == "i" else idx
            bad = (idx < -n) | (idx >= n)
            if bad.any():
                raise GraphError(
                    f"gather: index {idx[bad][0]} out of range for axis {axis} of size {n}"
                )
            if (idx < 0).any():  # the Gather op takes indices in [0, n)
                idx = np.where(idx < 0, idx + n, idx)
                indices = self.constant(idx)
            if idx.size >= 1 and np.all(idx == idx[0]):
                one = self.slice_raw(x, axis, int(idx[0]), 1, 1)
                return self.broadcast(one, info.shape.replace(axis, idx.size))
            if idx.size >= 2:
                step = int(idx[1] - idx[0])
                if step != 0 and np.array_equal(idx, idx[0] + step * np.arange(idx.size)):
                    return self.slice_raw(x, axis, int(idx[0]), step, idx.size)
        shape = info.shape.replace(axis, ii.shape[0])
        return self._push(shape, info.dtype, Gather(x, axis, indices))

    def concat(self, xs: Sequence[Value], axis: int) -> Value:
        if not xs:
            raise GraphError("concat: no operands")
        infos = [self[x] for x in xs]
        first = infos[0]
        axis = norm_axis(axis, first.rank)
        total = Size(0)
        for i, inf in enumerate(infos):
            if inf.dtype != first.dtype or inf.rank != first.rank:
                raise GraphError(
                    f"concat: operand {i} is {inf.dtype}{inf.shape}, expected {first.dtype} of rank {first.rank}"
                )
            for a in range(first.rank):
                if a != axis and inf.shape[a] != first.shape[a]:
                    if self.equate is None or (inf.shape[a].is_fixed and first.shape[a].is_fixed):
                        raise GraphError(
                            f"concat: operand {i} has shape {inf.shape}, which differs from "
                            f"{first.shape} off the concat axis {axis}"
                        )
                    self._same(
                        first.shape[a], inf.shape[a], f"concat of {first.shape} and {inf.shape}"
                    )
            total = total + inf.shape[axis]
        if self.equate is not None:
            like = first.shape
            xs = [
                self._conform(x, like.replace(axis, inf.shape[axis]))
                for x, inf in zip(xs, infos, strict=True)
            ]
            infos = [self[x] for x in xs]
        kept = tuple(x for x, inf in zip(xs, infos, strict=True) if inf.shape[axis] != Size(0))
        if len(kept) == 1:
            return kept[0]
        if not kept:
            return xs[0]
        return self._push(first.shape.replace(axis, total), first.dtype, Concat(kept, axis))
