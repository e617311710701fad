"""Convenience builders on top of the core ops: arithmetic shortcuts, NumPy-style matmul, padding,
repetition, pooling and normalisations. Every one of them lowers to the orthogonal core ops, so
`NNBuilders` extends `ComputeBuilders` (and `Graph` extends it): nothing here knows `Graph`."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Literal

import numpy as np

from kn_graph.compute_builders import ComputeBuilders, Operand
from kn_graph.dtype import DType
from kn_graph.errors import FixedSizeRequiredError, GraphError
from kn_graph.ops import BinaryOp, ReduceOp, UnaryOp, Value
from kn_graph.shape import Shape, Size, SizeLike, broadcast_shapes, norm_axis

__all__ = ["NNBuilders"]

MAX_PAD_INDEX = 1 << 24
"""The longest padded axis an edge, reflect or wrap pad builds (a constant gather index of that
many int64 entries, made when the graph is built)."""


def _pool_geometry(
    shape: Shape,
    sizes: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    pads: Sequence[tuple[int, int]],
    dilation: Sequence[int],
    ceil_mode: bool,
) -> tuple[list[int], list[int]]:
    """(output size, extra end padding) per spatial axis of a pooling window."""
    outs, extra = [], []
    for i in range(len(kernel)):
        n, k, s, d = sizes[i], kernel[i], stride[i], dilation[i]
        pb, pa = pads[i]
        if k < 1 or s < 1 or d < 1 or pb < 0 or pa < 0:
            raise GraphError(f"pool: invalid kernel/stride/dilation/pads on axis {i}")
        span = n + pb + pa - d * (k - 1) - 1
        if span < 0:
            raise GraphError(f"pool: kernel {list(kernel)} larger than padded input {shape}")
        o = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (o - 1) * s >= n + pb:
            o -= 1
        outs.append(o)
        extra.append(max(0, (o - 1) * s + d * (k - 1) + 1 - (n + pb + pa)))
    return outs, extra


def _lowest(dtype: DType) -> float | int:
    if dtype.is_float:
        return -math.inf
    if dtype.is_bool:
        return False
    return int(np.iinfo(dtype.np).min)


def _check_pool_kind(kind: str) -> None:
    if kind not in ("max", "avg"):
        raise GraphError(f"pool: unknown kind '{kind}'; expected 'max' or 'avg'")


class NNBuilders(ComputeBuilders):
    """Extended by `Graph`; every method builds from the core builders."""

    # -- elementwise shortcuts --------------------------------------------------------------------
    def add(self, a: Operand, b: Operand) -> Value:
        return self.binary(BinaryOp.ADD, a, b)

    def sub(self, a: Operand, b: Operand) -> Value:
        return self.binary(BinaryOp.SUB, a, b)

    def mul(self, a: Operand, b: Operand) -> Value:
        return self.binary(BinaryOp.MUL, a, b)

    def div(self, a: Operand, b: Operand) -> Value:
        return self.binary(BinaryOp.DIV, a, b)

    def pow(self, a: Operand, b: Operand) -> Value:
        return self.binary(BinaryOp.POW, a, b)

    def minimum(self, a: Operand, b: Operand) -> Value:
        return self.binary(BinaryOp.MIN, a, b)

    def maximum(self, a: Operand, b: Operand) -> Value:
        return self.binary(BinaryOp.MAX, a, b)

    def neg(self, x: Value) -> Value:
        return self.unary(UnaryOp.NEG, x)

    def exp(self, x: Value) -> Value:
        return self.unary(UnaryOp.EXP, x)

    def log(self, x: Value) -> Value:
        return self.unary(UnaryOp.LOG, x)

    def sqrt(self, x: Value) -> Value:
        return self.unary(UnaryOp.SQRT, x)

    def relu(self, x: Value) -> Value:
        return self.maximum(x, 0)

    def clamp(self, x: Value, lo: Operand | None, hi: Operand | None) -> Value:
        """min then max, as ONNX Clip: max(min(x, hi), lo)."""
        if hi is not None:
            x = self.minimum(x, hi)
        if lo is not None:
            x = self.maximum(x, lo)
        return x

    def gelu(self, x: Value, approximate: Literal["none", "tanh"] = "none") -> Value:
        if approximate not in ("none", "tanh"):
            raise GraphError(
                f"gelu: unknown approximation '{approximate}'; expected 'none' or 'tanh'"
            )
        return self.unary(UnaryOp.GELU_TANH if approximate == "tanh" else UnaryOp.GELU, x)

    def silu(self, x: Value) -> Value:
        return self.unary(UnaryOp.SILU, x)

    # -- shape helpers ----------------------------------------------------------------------------
    def unsqueeze(self, x: Value, axes: Sequence[int]) -> Value:
        shape = list(self[x].shape)
        rank = len(shape) + len(axes)
        norm = sorted(a + rank if a < 0 else a for a in axes)
        if len(set(norm)) != len(norm) or any(not 0 <= a < rank for a in norm):
            raise GraphError(f"unsqueeze: invalid axes {list(axes)} for output rank {rank}")
        for a in norm:
            shape.insert(a, Size(1))
        return self.view(x, Shape.from_seq(shape))

    def squeeze(self, x: Value, axes: Sequence[int] | None = None) -> Value:
        shape = self[x].shape
        if axes is None:
            keep = [d for d in shape if d != Size(1)]
        else:
            norm = {a + shape.rank if a < 0 else a for a in axes}
            for a in norm:
                if not 0 <= a < shape.rank or shape[a] != Size(1):
                    raise GraphError(f"squeeze: axis {a} of shape {shape} is not of size 1")
            keep = [d for i, d in enumerate(shape) if i not in norm]
        return self.view(x, Shape.from_seq(keep))

    def flatten(self, x: Value, axis: int = 1) -> Value:
        shape = self[x].shape
        axis = axis + shape.rank if axis < 0 else axis
        if not 0 <= axis <= shape.rank:
            raise GraphError(f"flatten: axis {axis} out of range for rank {shape.rank}")
        left = Shape(shape.dims[:axis]).size()
        right = Shape(shape.dims[axis:]).size()
        return self.view(x, Shape.of(left, right))

    def repeat(self, x: Value, axis: int, n: SizeLike) -> Value:
        """Tile: [a, b] repeated 2 times on axis 0 gives [a, b, a, b]."""
        shape = self[x].shape
        axis = norm_axis(axis, shape.rank)
        y = self.view(x, shape.insert(axis, 1))
        y = self.broadcast(y, shape.insert(axis, n))
        return self.view(y, shape.replace(axis, Size.of(n) * shape[axis]))

    def repeat_interleave(self, x: Value, axis: int, n: SizeLike) -> Value:
        """[a, b] repeated 2 times on axis 0 gives [a, a, b, b]."""
        shape = self[x].shape
        axis = norm_axis(axis, shape.rank)
        y = self.view(x, shape.insert(axis + 1, 1))
        y = self.broadcast(y, shape.insert(axis + 1, n))
        return self.view(y, shape.replace(axis, Size.of(n) * shape[axis]))

    def pad(
        self,
        x: Value,
        pads: Sequence[tuple[int, int]],
        mode: Literal["constant", "reflect", "edge", "wrap"] = "constant",
        value: float | int | bool = 0,
    ) -> Value:
        """Pad (before, after) per axis; negative amounts crop. Built from slices and concats."""
        info = self[x]
        if len(pads) != info.rank:
            raise GraphError(f"pad: {len(pads)} (before, after) pairs for rank {info.rank}")
        for axis, (before, after) in enumerate(pads):
            if before < 0 or after < 0:
                n = self[x].shape[axis]
                x = self.slice(x, axis, max(-before, 0), n - max(-after, 0))
            before, after = max(before, 0), max(after, 0)
            if before == 0 and after == 0:
                continue
            shape = self[x].shape
            n = shape[axis]
            parts: list[Value] = []
            if mode == "constant":
                if before:
                    parts.append(self.full(value, shape.replace(axis, before), info.dtype))
                parts.append(x)
                if after:
                    parts.append(self.full(value, shape.replace(axis, after), info.dtype))
            elif not n.is_fixed:
                parts = self._pad_symbolic_axis(x, axis, before, after, mode)
            else:
                size = n.as_int(f"pad ({mode}): axis {axis} size")
                if size == 0:
                    raise GraphError(f"pad ({mode}): cannot pad an empty axis {axis}")
                if mode == "reflect" and (before >= size or after >= size):
                    raise GraphError(
                        f"pad (reflect): padding {before, after} must be < size {size}"
                    )
                if before + size + after > MAX_PAD_INDEX:
                    raise GraphError(
                        f"pad ({mode}): axis {axis} of {size} padded by {before, after} is too "
                        f"long for its gather index (at most {MAX_PAD_INDEX} elements)"
                    )
                if mode == "edge":
                    idx_b = np.zeros(before, np.int64)
                    idx_a = np.full(after, size - 1, np.int64)
                elif mode == "reflect":
                    idx_b = np.arange(before, 0, -1)
                    idx_a = np.arange(size - 2, size - 2 - after, -1)
                elif mode == "wrap":
                    idx_b = np.arange(-before, 0) % size
                    idx_a = np.arange(size, size + after) % size
                else:
                    raise GraphError(f"pad: unknown mode '{mode}'")
                idx = np.concatenate([idx_b, np.arange(size), idx_a]).astype(np.int64)
                x = self.gather(x, axis, self.constant(idx))
                continue
            x = self.concat(parts, axis)
        return x

    # -- matmul and linear ------------------------------------------------------------------------
    def matmul_nd(self, a: Value, b: Value) -> Value:
        """NumPy `a @ b`: rank-1 promotion and batch broadcasting, lowered to a rank-3 MatMul."""
        return self._matmul_nd(a, b, None)

    def int_matmul_nd(self, a: Value, b: Value, a_zero: Value, b_zero: Value) -> Value:
        """ONNX MatMulInteger: `(a - a_zero) @ (b - b_zero)` in int32 with NumPy's rank rules,
        lowered to a rank-3 IntMatMul. a_zero is a scalar or one per row of a ([m]), b_zero a
        scalar or one per column of b ([n]); each has its operand's 8-bit dtype."""
        zeros = []
        for name, z, x, axis in (("a_zero", a_zero, a, -2), ("b_zero", b_zero, b, -1)):
            zi, xi = self[z], self[x]
            if zi.shape.size() == Size(1):
                zeros.append(self.view(z, Shape.of()))
            elif zi.rank == 1 and xi.rank >= 2 and zi.shape[0] == xi.shape[axis]:
                zeros.append(z)
            else:
                raise GraphError(
                    f"int_matmul: {name} must be a scalar or 1-d of size {xi.shape[axis]} "
                    f"(per {'row' if axis == -2 else 'column'}), found {zi.shape} for {xi.shape}"
                )
        return self._matmul_nd(a, b, (zeros[0], zeros[1]))

    def _matmul_nd(self, a: Value, b: Value, zeros: tuple[Value, Value] | None) -> Value:
        """`a @ b` (zeros None) or the integer product with zero points per row of a ([m] or
        scalar) and per column of b ([n] or scalar), over rank-3 products."""
        ai, bi = self[a], self[b]
        if ai.rank == 0 or bi.rank == 0:
            raise GraphError(f"matmul: scalar operand ({ai.shape} @ {bi.shape})")
        a_vec, b_vec = ai.rank == 1, bi.rank == 1
        if a_vec:
            a = self.view(a, Shape.of(1, ai.shape[0]))
        if b_vec:
            b = self.view(b, Shape.of(bi.shape[0], 1))
        sa, sb = self[a].shape, self[b].shape
        m, k, k2, n = sa[-2], sa[-1], sb[-2], sb[-1]
        if k != k2:
            if self.equate is None:
                raise GraphError(f"matmul: inner sizes differ ({ai.shape} @ {bi.shape})")
            k = self._same(k, k2, f"matmul {ai.shape} @ {bi.shape}")
            a, b = (
                self._conform(a, sa.replace(-1 + sa.rank, k)),
                self._conform(b, sb.replace(sb.rank - 2, k)),
            )
            sa, sb = self[a].shape, self[b].shape
        batch = broadcast_shapes(
            Shape(sa.dims[:-2]), Shape(sb.dims[:-2]), equate=self._equate_or_none()
        )
        if self.equate is not None:
            a = self._conform(a, batch + Shape.of(m, k))
            b = self._conform(b, batch + Shape.of(k, n))
            sa, sb = self[a].shape, self[b].shape

        b_batch = Shape(sb.dims[:-2]).size()
        if b_batch == Size(1) and sa.rank >= 2:
            # fold a's batch into its rows: one GEMM instead of a batch of them
            rows = Shape(sa.dims[:-1]).size()
            a3 = self.view(a, Shape.of(1, rows, k))
            b3 = self.view(b, Shape.of(1, k, n))
            if zeros is None:
                out = self.matmul(a3, b3)
            else:
                za = self._row_zero(zeros[0], Shape(sa.dims[:-2]), m, Shape.of(1, rows, 1))
                zb = self.view(self._col_zero(zeros[1], n), Shape.of(1, 1, n))
                out = self.int_matmul(a3, b3, za, zb)
            out = self.view(out, batch + Shape.of(m, n))
        else:
            a_full = self.broadcast(a, batch + Shape.of(m, k))
            b_full = self.broadcast(b, batch + Shape.of(k, n))
            nb = batch.size()
            a3 = self.view(a_full, Shape.of(nb, m, k))
            b3 = self.view(b_full, Shape.of(nb, k, n))
            if zeros is None:
                out = self.matmul(a3, b3)
            else:
                za = self._row_zero(zeros[0], batch, m, Shape.of(nb, m, 1))
                zb = self.view(
                    self.broadcast(self._col_zero(zeros[1], n), batch + Shape.of(1, n)),
                    Shape.of(nb, 1, n),
                )
                out = self.int_matmul(a3, b3, za, zb)
            out = self.view(out, batch + Shape.of(m, n))
        shape = self[out].shape
        dims = list(shape.dims)
        if b_vec:
            dims.pop(-1)
        if a_vec:
            dims.pop(-2 if not b_vec else -1)
        return self.view(out, Shape.from_seq(dims))

    def _row_zero(self, z: Value, batch: Shape, m: Size, shape: Shape) -> Value:
        """A per-row (or scalar) zero point as [*batch, m, 1], viewed as `shape`."""
        col = self.view(z, Shape.of(m, 1)) if self[z].rank else self.view(z, Shape.of(1, 1))
        return self.view(self.broadcast(col, batch + Shape.of(m, 1)), shape)

    def _col_zero(self, z: Value, n: Size) -> Value:
        """A per-column (or scalar) zero point as [1, n]."""
        row = self.view(z, Shape.of(1, n)) if self[z].rank else self.view(z, Shape.of(1, 1))
        return self.broadcast(row, Shape.of(1, n))

    def linear(self, x: Value, w: Value, b: Value | None = None) -> Value:
        """x @ wᵀ + b with w [out, in] (PyTorch's layout)."""
        y = self.matmul_nd(x, self.permute(w, (1, 0)))
        return y if b is None else self.add(y, b)

    # -- pooling ----------------------------------------------------------------------------------
    def _pad_symbolic_axis(
        self, x: Value, axis: int, before: int, after: int, mode: str
    ) -> list[Value]:
        """Edge / reflect / wrap padding of a symbolic axis from slices (guards: size bounds)."""
        n = self[x].shape[axis]
        if mode not in ("edge", "reflect", "wrap"):
            raise GraphError(f"pad: unknown mode '{mode}'")
        need = max(before, after) + (1 if mode == "reflect" else 0)
        self.add_guard(n, ">=", max(need, 1), f"pad ({mode}) by {before, after} of axis {axis}")
        parts: list[Value] = []
        if before:
            if mode == "edge":
                one = self.slice_raw(x, axis, 0, 1, 1)
                parts.append(self.broadcast(one, self[one].shape.replace(axis, before)))
            elif mode == "reflect":
                parts.append(self.slice_raw(x, axis, before, -1, before))
            else:
                parts.append(self.slice_raw(x, axis, n - before, 1, before))
        parts.append(x)
        if after:
            if mode == "edge":
                one = self.slice_raw(x, axis, n - 1, 1, 1)
                parts.append(self.broadcast(one, self[one].shape.replace(axis, after)))
            elif mode == "reflect":
                parts.append(self.slice_raw(x, axis, n - 2, -1, after))
            else:
                parts.append(self.slice_raw(x, axis, 0, 1, after))
        return parts

    def _pool_taps(
        self,
        x: Value,
        kernel: Sequence[int],
        stride: Sequence[int],
        pads: Sequence[tuple[int, int]],
        dilation: Sequence[int],
        outs: Sequence[int],
        extra: Sequence[int],
        fill: float | int,
    ) -> Iterator[Value]:
        """For each kernel offset (row-major), the strided slice of x padded with `fill`."""
        first = self[x].rank - len(kernel)
        padded = self.pad(
            x,
            [(0, 0)] * first + [(pb, pa + e) for (pb, pa), e in zip(pads, extra, strict=True)],
            value=fill,
        )
        for offs in np.ndindex(*kernel):
            win = padded
            for i, o in enumerate(offs):
                win = self.slice_raw(win, first + i, o * dilation[i], stride[i], outs[i])
            yield win

    def max_pool_indices(
        self,
        x: Value,
        kernel: Sequence[int],
        stride: Sequence[int],
        pads: Sequence[tuple[int, int]],
        dilation: Sequence[int],
        ceil_mode: bool = False,
        column_major: bool = False,
    ) -> Value:
        """MaxPool's Indices: per window, the flat index into x ([N, C, *spatial], row-major, or
        with `column_major` spatial axes counted first-fastest) of its first largest element."""
        info = self[x]
        nd = len(kernel)
        if info.rank != nd + 2 or not all(d.is_fixed for d in info.shape.dims[2:]):
            raise FixedSizeRequiredError(
                f"max pool indices of {info.shape} need fixed spatial sizes"
            )
        sizes = [d.as_int() for d in info.shape.dims[2:]]
        outs, extra = _pool_geometry(info.shape, sizes, kernel, stride, pads, dilation, ceil_mode)
        spatial = math.prod(sizes)
        plane = np.arange(spatial, dtype=np.int64).reshape(sizes)
        if column_major:
            plane = np.arange(spatial, dtype=np.int64).reshape(sizes[::-1]).T.copy()
        n, c = info.shape[0], info.shape[1]
        per_n = c * spatial
        fixed = per_n.fixed_value()
        base = self.mul(
            self.iota(Shape.of(n, c), 0), fixed if fixed is not None else self.size_value(per_n)
        )
        base = self.add(base, self.mul(self.iota(Shape.of(n, c), 1), spatial))
        full = Shape.of(n, c, *sizes)
        flat = self.add(
            self.broadcast(self.view(base, Shape.of(n, c, *([1] * nd))), full),
            self.broadcast(self.constant(plane.reshape(1, 1, *sizes)), full),
        )
        best_v: Value | None = None
        best_i: Value | None = None
        taps_v = self._pool_taps(
            x, kernel, stride, pads, dilation, outs, extra, _lowest(info.dtype)
        )
        taps_i = self._pool_taps(flat, kernel, stride, pads, dilation, outs, extra, -1)
        for v, i in zip(taps_v, taps_i, strict=True):
            if best_v is None or best_i is None:
                best_v, best_i = v, i
                continue
            take = self.binary(BinaryOp.GT, v, best_v)  # strictly: the first largest wins
            best_v, best_i = self.select(take, v, best_v), self.select(take, i, best_i)
        assert best_i is not None
        return best_i

    def pool(
        self,
        x: Value,
        kind: Literal["max", "avg"],
        kernel: Sequence[int],
        stride: Sequence[int] | None = None,
        pads: Sequence[tuple[int, int]] | None = None,
        dilation: Sequence[int] | None = None,
        ceil_mode: bool = False,
        count_include_pad: bool = False,
    ) -> Value:
        """Max/average pooling over the trailing len(kernel) axes, as strided slices of the padded
        input combined with max/add (one fused elementwise kernel on a GPU)."""
        info = self[x]
        nd = len(kernel)
        _check_pool_kind(kind)
        if nd == 0 or nd > info.rank:
            raise GraphError(f"pool: kernel {list(kernel)} does not fit input {info.shape}")
        if kind == "avg" and not info.dtype.is_float:
            raise GraphError(f"avg pool: expected a float operand, found {info.dtype}")
        stride = tuple(stride or (1,) * nd)
        dilation = tuple(dilation or (1,) * nd)
        pads = tuple(pads or ((0, 0),) * nd)
        if not len(stride) == len(dilation) == len(pads) == nd:
            raise GraphError("pool: kernel, stride, dilation and pads must have one entry per axis")
        first = info.rank - nd
        if not all(info.shape[first + i].is_fixed for i in range(nd)):
            return self._pool_symbolic(
                x, kind, kernel, stride, pads, dilation, ceil_mode, count_include_pad
            )
        sizes = [info.shape[first + i].as_int("pool: spatial size") for i in range(nd)]
        outs, extra = _pool_geometry(info.shape, sizes, kernel, stride, pads, dilation, ceil_mode)
        fill = _lowest(info.dtype) if kind == "max" else 0
        acc: Value | None = None
        for win in self._pool_taps(x, kernel, stride, pads, dilation, outs, extra, fill):
            if acc is None:
                acc = win
            else:
                acc = self.maximum(acc, win) if kind == "max" else self.add(acc, win)
        assert acc is not None
        if kind == "max":
            return acc
        # divide by the number of counted positions of each window, computed here once
        padded_sizes = [p + n + a + e for (p, a), n, e in zip(pads, sizes, extra, strict=True)]
        if math.prod(padded_sizes) > 1 << 26:
            raise GraphError(f"avg pool: padded input {padded_sizes} too large for a count table")
        ones = np.zeros(padded_sizes)
        lo = [0 if count_include_pad else p for p, _ in pads]
        hi = [
            p + n + (a if count_include_pad else 0) for (p, a), n in zip(pads, sizes, strict=True)
        ]
        ones[tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))] = 1
        counts = np.zeros(outs)
        for offs in np.ndindex(*kernel):
            counts += ones[
                tuple(
                    slice(o * d, o * d + (m - 1) * s + 1, s)
                    for o, d, s, m in zip(offs, dilation, stride, outs, strict=True)
                )
            ]
        if np.all(counts == counts.flat[0]):
            return self.mul(acc, float(1.0 / counts.flat[0]))
        return self.mul(acc, self.constant((1.0 / np.maximum(counts, 1)).astype(info.dtype.np)))

    def _pool_symbolic(
        self,
        x: Value,
        kind: Literal["max", "avg"],
        kernel: Sequence[int],
        stride: Sequence[int],
        pads: Sequence[tuple[int, int]],
        dilation: Sequence[int],
        ceil_mode: bool,
        count_include_pad: bool,
    ) -> Value:
        """`pool` on symbolic spatial sizes: the same windows, sizes as expressions; the average
        divides by per-axis counts computed in the graph (a window's count is a product)."""
        info = self[x]
        nd = len(kernel)
        first = info.rank - nd
        outs: list[Size] = []
        extra: list[Size] = []
        for i in range(nd):
            n, k, s, d = info.shape[first + i], kernel[i], stride[i], dilation[i]
            pb, pa = pads[i]
            if k < 1 or s < 1 or d < 1 or pb < 0 or pa < 0:
                raise GraphError(f"pool: invalid kernel/stride/dilation/pads on axis {i}")
            span = n + pb + pa - d * (k - 1) - 1
            self.add_guard(span, ">=", 0, f"pool: axis {i} ({n}) padded must hold the kernel {k}")
            # ceil mode: the last window must start inside the input or the left padding
            o = Size.min(span.ceildiv(s) + 1, (n + pb).ceildiv(s)) if ceil_mode else span // s + 1
            outs.append(o)
            extra.append(Size.max(0, (o - 1) * s + d * (k - 1) + 1 - (n + pb + pa)))
        fill = _lowest(info.dtype) if kind == "max" else 0

        def windows(v: Value, lead: int) -> Value:
            acc: Value | None = None
            for offs in np.ndindex(*kernel):
                win = v
                for i, o in enumerate(offs):
                    win = self.slice_raw(win, lead + i, o * dilation[i], stride[i], outs[i])
                acc = (
                    win
                    if acc is None
                    else (self.maximum(acc, win) if kind == "max" else self.add(acc, win))
                )
            assert acc is not None
            return acc

        padded = self._pad_sizes(
            x,
            [(Size(0), Size(0))] * first
            + [(Size(pb), pa + e) for (pb, pa), e in zip(pads, extra, strict=True)],
            fill,
        )
        acc = windows(padded, first)
        if kind == "max":
            return acc
        plain = all(pb == 0 and pa == 0 for pb, pa in pads) or count_include_pad
        if plain and all(e == Size(0) for e in extra):
            return self.mul(acc, float(1.0 / math.prod(kernel)))
        # counted positions per axis: sum-pool a 1-d indicator of the counted region
        counts: Value | None = None
        for i in range(nd):
            n, (pb, pa) = info.shape[first + i], pads[i]
            ones = self.full(1.0, Shape.of(n), info.dtype)
            pad_val = 1.0 if count_include_pad else 0.0
            ind = self._pad_sizes(ones, [(Size(pb), Size(pa))], pad_val)
            ind = self._pad_sizes(ind, [(Size(0), extra[i])], 0.0)
            c: Value | None = None
            for o in range(kernel[i]):
                win = self.slice_raw(ind, 0, o * dilation[i], stride[i], outs[i])
                c = win if c is None else self.add(c, win)
            assert c is not None
            c = self.view(c, Shape.of(*([1] * (first + i)), outs[i], *([1] * (nd - i - 1))))
            counts = c if counts is None else self.mul(counts, c)
        assert counts is not None
        return self.div(acc, self.maximum(counts, 1.0))

    def _pad_sizes(
        self, x: Value, pads: Sequence[tuple[Size, Size]], value: float | int | bool
    ) -> Value:
        """Constant padding by (possibly symbolic) non-negative amounts."""
        info = self[x]
        for axis, (before, after) in enumerate(pads):
            parts: list[Value] = []
            shape = self[x].shape
            if before != Size(0):
                parts.append(self.full(value, shape.replace(axis, before), info.dtype))
            parts.append(x)
            if after != Size(0):
                parts.append(self.full(value, shape.replace(axis, after), info.dtype))
            if len(parts) > 1:
                x = self.concat(parts, axis)
        return x

    def global_pool(self, x: Value, kind: Literal["max", "avg"], first_axis: int = 2) -> Value:
        _check_pool_kind(kind)
        axes = list(range(first_axis, self[x].rank))
        return self.reduce(x, axes, ReduceOp.MAX if kind == "max" else ReduceOp.MEAN, keepdims=True)

    # -- normalisations ---------------------------------------------------------------------------
    def _affine(self, y: Value, scale: Value | None, bias: Value | None) -> Value:
        if scale is not None:
            y = self.mul(y, scale)
        if bias is not None:
            y = self.add(y, bias)
        return y

    def layer_norm(
        self,
        x: Value,
        axis: int,
        eps: float,
        scale: Value | None = None,
        bias: Value | None = None,
    ) -> Value:
        """Normalise over axes axis..rank-1 (merged into one), then scale and bias."""
        shape = self[x].shape
        axis = norm_axis(axis, shape.rank)
        if axis == shape.rank - 1:
            y = self.layernorm(x, axis, eps)
        else:
            flat = Shape(shape.dims[:axis]) + Shape.of(Shape(shape.dims[axis:]).size())
            y = self.view(self.layernorm(self.view(x, flat), axis, eps), shape)
        return self._affine(y, scale, bias)

    def group_norm(
        self,
        x: Value,
        groups: int,
        eps: float,
        scale: Value | None = None,
        bias: Value | None = None,
    ) -> Value:
        """x [N, C, *spatial]; statistics per (sample, group); scale/bias per channel [C]."""
        shape = self[x].shape
        c = shape[1]
        if not Size(groups).divides(c):
            raise GraphError(f"group_norm: {c} channels not divisible into {groups} groups")
        grouped = Shape.of(shape[0], groups, Shape(shape.dims[1:]).size() // groups)
        y = self.view(self.layernorm(self.view(x, grouped), 2, eps), shape)
        per_channel = Shape.of(c, *([1] * (shape.rank - 2)))
        s = None if scale is None else self.view(scale, per_channel)
        b = None if bias is None else self.view(bias, per_channel)
        return self._affine(y, s, b)

    def instance_norm(
        self, x: Value, eps: float, scale: Value | None = None, bias: Value | None = None
    ) -> Value:
        c = self[x].shape[1].as_int("instance_norm: channels")
        return self.group_norm(x, c, eps, scale, bias)
