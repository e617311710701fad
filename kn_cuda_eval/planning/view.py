"""`StridedView`: how a plan names a tensor — a byte offset into the arena, a shape and element
strides. View, Broadcast, Permute, Slice and Flip only change these numbers, so they cost nothing.

>>> v = StridedView.dense(256, (2, 3), DType.F32)
>>> v
f32[2,3]:(3,1)@256
>>> v.permute((1, 0)).slice(0, 2, -1, 3)
f32[3,2]:(-1,3)@264
>>> v.reshape((3, 2)), v.permute((1, 0)).reshape((6,))
(f32[3,2]:(2,1)@256, None)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kn_graph.dtype import DType

__all__ = ["StridedView", "coalesce", "dense_strides", "reshape_strides"]


def dense_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major element strides of a contiguous tensor."""
    out = [0] * len(shape)
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        out[i] = acc
        acc *= max(shape[i], 1)
    return tuple(out)


def reshape_strides(
    shape: Sequence[int], strides: Sequence[int], new_shape: Sequence[int]
) -> tuple[int, ...] | None:
    """Strides that show the same elements in row-major order with `new_shape`, or None when
    no such strides exist (a copy is needed). NumPy's no-copy reshape rule, stride 0 and negative
    strides included."""
    if math.prod(shape) != math.prod(new_shape):
        raise ValueError(f"reshape {tuple(shape)} -> {tuple(new_shape)}: element counts differ")
    if math.prod(shape) == 0:
        return dense_strides(new_shape)
    old = [(d, s) for d, s in zip(shape, strides, strict=True) if d != 1]
    od = [d for d, _ in old]
    os_ = [s for _, s in old]
    nd = list(new_shape)
    out = [0] * len(nd)
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(nd) and oi < len(od):
        np_, op = nd[ni], od[oi]
        while np_ != op:
            if np_ < op:
                np_ *= nd[nj]
                nj += 1
            else:
                op *= od[oj]
                oj += 1
        for k in range(oi, oj - 1):
            if os_[k] != od[k + 1] * os_[k + 1]:
                return None
        out[nj - 1] = os_[oj - 1]
        for k in range(nj - 1, ni, -1):
            out[k - 1] = out[k] * nd[k]
        ni, nj, oi, oj = nj, nj + 1, oj, oj + 1
    last = out[ni - 1] if ni >= 1 else 1
    for k in range(ni, len(nd)):
        out[k] = last
    return tuple(out)


@dataclass(frozen=True, slots=True)
class StridedView:
    """A tensor in the arena: element [i0, i1, …] lives at byte
    `offset + itemsize·Σ ik·strides[k]`. Strides are in elements and may be 0 (broadcast) or
    negative (flip)."""

    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: DType

    @staticmethod
    def dense(offset: int, shape: Sequence[int], dtype: DType) -> StridedView:
        shape = tuple(int(d) for d in shape)
        return StridedView(offset, shape, dense_strides(shape), dtype)

    # -- queries -----------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.size

    @property
    def nbytes(self) -> int:
        """Bytes of a dense tensor of this shape (not the span this view touches)."""
        return self.numel * self.itemsize

    def element_span(self) -> tuple[int, int]:
        """(lowest, highest) element offset relative to element [0,…,0]; (0, 0) when empty."""
        if self.numel == 0:
            return 0, 0
        lo = sum((d - 1) * s for d, s in zip(self.shape, self.strides, strict=True) if s < 0)
        hi = sum((d - 1) * s for d, s in zip(self.shape, self.strides, strict=True) if s > 0)
        return lo, hi

    def byte_extent(self) -> tuple[int, int]:
        """The half-open byte range [lo, hi) this view touches; empty views touch nothing."""
        if self.numel == 0:
            return self.offset, self.offset
        lo, hi = self.element_span()
        return self.offset + lo * self.itemsize, self.offset + (hi + 1) * self.itemsize

    def is_dense(self) -> bool:
        """Row-major contiguous (size-1 axes may have any stride; empty views are dense)."""
        if self.numel == 0:
            return True
        acc = 1
        for d, s in zip(reversed(self.shape), reversed(self.strides), strict=True):
            if d != 1 and s != acc:
                return False
            acc *= d
        return True

    def max_index(self) -> int:
        """The largest |element offset| any coordinate reaches: decides 32- or 64-bit indexing."""
        lo, hi = self.element_span()
        return max(-lo, hi, self.numel)

    # -- free transformations ------------------------------------------------------------------
    def with_offset(self, offset: int) -> StridedView:
        return StridedView(offset, self.shape, self.strides, self.dtype)

    def permute(self, perm: Sequence[int]) -> StridedView:
        return StridedView(
            self.offset,
            tuple(self.shape[p] for p in perm),
            tuple(self.strides[p] for p in perm),
            self.dtype,
        )

    def broadcast(self, shape: Sequence[int]) -> StridedView:
        """Same rank; axes of size 1 stretch with stride 0."""
        shape = tuple(shape)
        assert len(shape) == self.rank, (self, shape)
        strides = tuple(
            s if d == n else 0 for d, n, s in zip(self.shape, shape, self.strides, strict=True)
        )
        return StridedView(self.offset, shape, strides, self.dtype)

    def slice(self, axis: int, start: int, step: int, length: int) -> StridedView:
        """Elements start, start+step, … (`length` of them) along `axis`."""
        shape = list(self.shape)
        strides = list(self.strides)
        offset = self.offset
        if length > 0:
            offset += start * strides[axis] * self.itemsize
        shape[axis] = length
        strides[axis] *= step
        return StridedView(offset, tuple(shape), tuple(strides), self.dtype)

    def reshape(self, shape: Sequence[int]) -> StridedView | None:
        """The same elements with a new row-major shape, or None when that needs a copy."""
        shape = tuple(int(d) for d in shape)
        strides = reshape_strides(self.shape, self.strides, shape)
        return None if strides is None else StridedView(self.offset, shape, strides, self.dtype)

    def __repr__(self) -> str:
        dims = ",".join(map(str, self.shape))
        strides = ",".join(map(str, self.strides))
        return f"{self.dtype}[{dims}]:({strides})@{self.offset}"

    __str__ = __repr__


def coalesce(
    shape: Sequence[int], strides: Sequence[Sequence[int]]
) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Drop size-1 axes and merge neighbouring axes that every operand walks contiguously, so
    kernels decompose fewer coordinates (a dense 4-d add becomes a 1-d loop). Empty tensors keep
    their shape."""
    if math.prod(shape) == 0:
        return tuple(shape), [tuple(s) for s in strides]
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    for a, d in enumerate(shape):
        if d == 1:
            continue
        if out_shape and all(
            st[-1] == s[a] * d for st, s in zip(out_strides, strides, strict=True)
        ):
            out_shape[-1] *= d
            for st, s in zip(out_strides, strides, strict=True):
                st[-1] = s[a]
            continue
        out_shape.append(d)
        for st, s in zip(out_strides, strides, strict=True):
            st.append(s[a])
    return tuple(out_shape), [tuple(s) for s in out_strides]
