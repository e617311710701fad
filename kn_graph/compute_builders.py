"""Compute builders: convolution, matmul, elementwise unary/binary/select, iota, softmax,
layernorm, attention, reductions, data-dependent (`Dynamic`) ops, and sizes as run-time values.
Each validates its operands (dtypes, shapes, the loader's `equate` policy for sizes that must be
equal), canonicalises (identities vanish, integer matmul becomes a reduction) and ends in
`_push`. Layered on `LayoutBuilders`; the convenience builders of `kn_graph.nn` build on these.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from kn_graph.dtype import DType
from kn_graph.dynamic import CONTROL, KINDS, run_dynamic
from kn_graph.errors import GraphError
from kn_graph.graph_base import GraphBase
from kn_graph.layout_builders import LayoutBuilders
from kn_graph.ops import (
    Attention,
    Binary,
    BinaryOp,
    BlockQuantMatMul,
    Conv,
    ConvDetails,
    Dynamic,
    IntConv,
    IntMatMul,
    Iota,
    Layernorm,
    MatMul,
    Reduce,
    ReduceOp,
    Select,
    Softmax,
    Unary,
    UnaryOp,
    Value,
)
from kn_graph.shape import Shape, Size, SizeLike, broadcast_shapes, norm_axis
from kn_graph.size import _Node

__all__ = ["ComputeBuilders", "Operand"]

Operand = Value | float | int | bool
"""A builder operand: a value, or a Python scalar that becomes a constant of the other's dtype."""


def _no_subgraphs(
    graph: GraphBase, inputs: list[np.ndarray], bindings: Mapping[str, int]
) -> list[np.ndarray]:
    raise GraphError("internal: a dynamic op without subgraphs ran one")


_INT8 = (DType.U8, DType.I8)


def _check_int8(what: str, *dtypes: DType) -> None:
    """Integer GEMM and convolution read 8-bit operands (what oneDNN, cuBLAS and onnxruntime
    have int8 kernels for)."""
    for dt in dtypes:
        if dt not in _INT8:
            raise GraphError(
                f"{what}: expected u8 or i8 operands, found {', '.join(map(str, dtypes))}"
            )


class ComputeBuilders(LayoutBuilders):
    """Mixed into `Graph` through `NNBuilders`; builds from the layout builders."""

    def conv(
        self,
        x: Value,
        w: Value,
        stride: Sequence[int] | None = None,
        padding: Sequence[int] | None = None,
        dilation: Sequence[int] | None = None,
        groups: int = 1,
    ) -> Value:
        """N-d cross-correlation; x [N, C, *sp], w [K, C/groups, *k]; symmetric padding."""
        xi, wi = self[x], self[w]
        if xi.dtype != wi.dtype or not xi.dtype.is_float:
            raise GraphError(f"conv: expected equal float dtypes, found {xi.dtype} and {wi.dtype}")
        x, out, details = self._conv_geometry(x, w, stride, padding, dilation, groups)
        return self._push(out, xi.dtype, Conv(x, w, details))

    def int_conv(
        self,
        x: Value,
        w: Value,
        x_zero: Value,
        w_zero: Value,
        stride: Sequence[int] | None = None,
        padding: Sequence[int] | None = None,
        dilation: Sequence[int] | None = None,
        groups: int = 1,
    ) -> Value:
        """Integer convolution with int32 accumulation (`IntConv`): 8-bit x and w, a scalar
        x_zero of x's dtype, w_zero of w's dtype as a scalar or one per filter [K]."""
        xi, wi, zxi, zwi = self[x], self[w], self[x_zero], self[w_zero]
        _check_int8("int_conv", xi.dtype, wi.dtype)
        if zxi.dtype != xi.dtype or zwi.dtype != wi.dtype:
            raise GraphError(
                f"int_conv: zero points must have their operand's dtype ({xi.dtype}, {wi.dtype}), "
                f"found {zxi.dtype} and {zwi.dtype}"
            )
        x, out, details = self._conv_geometry(x, w, stride, padding, dilation, groups)
        if zxi.shape.size() != Size(1):
            raise GraphError(f"int_conv: x_zero must be one value, found shape {zxi.shape}")
        x_zero = self.view(x_zero, Shape.of())
        k = wi.shape[0]
        if zwi.shape == Shape.of(k):
            pass
        elif zwi.shape.size() == Size(1):
            w_zero = self.broadcast(self.view(w_zero, Shape.of()), Shape.of(k))
        else:
            raise GraphError(f"int_conv: w_zero must be a scalar or [{k}], found {zwi.shape}")
        return self._push(out, DType.I32, IntConv(x, w, x_zero, w_zero, details))

    def _conv_geometry(
        self,
        x: Value,
        w: Value,
        stride: Sequence[int] | None,
        padding: Sequence[int] | None,
        dilation: Sequence[int] | None,
        groups: int,
    ) -> tuple[Value, Shape, ConvDetails]:
        """Validated geometry of a convolution: x (conformed), the output shape, the details."""
        xi, wi = self[x], self[w]
        nd = xi.rank - 2
        if nd < 1 or wi.rank != xi.rank:
            raise GraphError(
                f"conv: expected x [N,C,*spatial] and w of equal rank, found {xi.shape} and {wi.shape}"
            )
        stride = tuple(stride or (1,) * nd)
        padding = tuple(padding or (0,) * nd)
        dilation = tuple(dilation or (1,) * nd)
        if not (len(stride) == len(padding) == len(dilation) == nd):
            raise GraphError(f"conv: stride/padding/dilation must have {nd} entries")
        if min(stride) < 1 or min(dilation) < 1 or min(padding) < 0 or groups < 1:
            raise GraphError(
                f"conv: invalid stride {stride}, padding {padding}, dilation {dilation} or groups {groups}"
            )
        k_out, c_per_group = wi.shape[0], wi.shape[1]
        if xi.shape[1] != c_per_group * groups and self.equate is not None:
            self._same(xi.shape[1], c_per_group * groups, "conv input channels")
            x = self._conform(x, xi.shape.replace(1, c_per_group * groups))
            xi = self[x]
        if xi.shape[1] != c_per_group * groups or not Size(groups).divides(k_out):
            raise GraphError(
                f"conv: input channels {xi.shape[1]} != {groups} groups x {c_per_group} (filter {wi.shape}), "
                f"or {k_out} filters not divisible by the groups"
            )
        out = [xi.shape[0], k_out]
        stride, dilation = list(stride), list(dilation)
        for i in range(nd):
            k = wi.shape[2 + i].as_int("conv: kernel size")
            if k < 1:
                raise GraphError(f"conv: filter {wi.shape} has an empty kernel axis")
            if k == 1:
                dilation[i] = 1  # no effect on a kernel of one tap
            c = 2 * padding[i] - dilation[i] * (k - 1) - 1 + stride[i]
            o = (xi.shape[2 + i] + c) // stride[i]
            span = xi.shape[2 + i] + 2 * padding[i] - dilation[i] * (k - 1)
            if o == Size(1) and span.is_fixed:
                # one window: a stride past the span has no effect (backends refuse huge ones)
                stride[i] = min(stride[i], max(span.as_int(), 1))
            if o.bounds()[1] <= 0:
                raise GraphError(f"conv: kernel {wi.shape} larger than padded input {xi.shape}")
            if not o.is_fixed:
                self.add_guard(
                    xi.shape[2 + i] + 2 * padding[i],
                    ">=",
                    dilation[i] * (k - 1) + 1,
                    f"conv: spatial axis {i} ({xi.shape[2 + i]}) padded by {padding[i]} must hold "
                    f"the kernel ({k}, dilation {dilation[i]})",
                )
            out.append(o)
        return x, Shape.from_seq(out), ConvDetails(tuple(stride), padding, tuple(dilation), groups)

    def matmul(self, a: Value, b: Value) -> Value:
        """Batched product [b, m, k] @ [b, k, n] (rank 3, equal batch); see `matmul_nd`."""
        ai, bi = self[a], self[b]
        if self.equate is not None and ai.rank == 3 and bi.rank == 3:
            what = f"matmul {ai.shape} @ {bi.shape}"
            bsz = self._same(ai.shape[0], bi.shape[0], what)
            k = self._same(ai.shape[2], bi.shape[1], what)
            a = self._conform(a, Shape.of(bsz, ai.shape[1], k))
            b = self._conform(b, Shape.of(bsz, k, bi.shape[2]))
            ai, bi = self[a], self[b]
        if ai.rank != 3 or bi.rank != 3 or ai.shape[0] != bi.shape[0] or ai.shape[2] != bi.shape[1]:
            raise GraphError(f"matmul: expected [b,m,k] @ [b,k,n], found {ai.shape} @ {bi.shape}")
        if ai.dtype != bi.dtype:
            raise GraphError(f"matmul: dtypes differ ({ai.dtype} and {bi.dtype})")
        if ai.dtype.is_bool:
            raise GraphError("matmul: bool operands")
        bsz, m, k = ai.shape
        n = bi.shape[2]
        if ai.dtype.is_int:
            # cuBLAS and oneDNN have no integer GEMM: a broadcast product summed over k, which
            # every device fuses into one reduction (exact, and wrapping as np.matmul does)
            full = Shape.of(bsz, m, k, n)
            pa = self.broadcast(self.view(a, Shape.of(bsz, m, k, 1)), full)
            pb = self.broadcast(self.view(b, Shape.of(bsz, 1, k, n)), full)
            return self.reduce(self.binary(BinaryOp.MUL, pa, pb), [2], ReduceOp.SUM)
        return self._push(Shape.of(bsz, m, n), ai.dtype, MatMul(a, b))

    def int_matmul(self, a: Value, b: Value, a_zero: Value, b_zero: Value) -> Value:
        """Integer product with int32 accumulation (`IntMatMul`): 8-bit a [b, m, k] and
        b [b, k, n]; a_zero broadcastable to [b, m, 1] with a's dtype, b_zero to [b, 1, n] with
        b's dtype."""
        ai, bi = self[a], self[b]
        if ai.rank != 3 or bi.rank != 3 or ai.shape[0] != bi.shape[0] or ai.shape[2] != bi.shape[1]:
            raise GraphError(
                f"int_matmul: expected [b,m,k] @ [b,k,n], found {ai.shape} @ {bi.shape}"
            )
        _check_int8("int_matmul", ai.dtype, bi.dtype)
        bsz, m, _ = ai.shape
        n = bi.shape[2]
        zeros = []
        for name, z, dt, shape in (
            ("a_zero", a_zero, ai.dtype, Shape.of(bsz, m, 1)),
            ("b_zero", b_zero, bi.dtype, Shape.of(bsz, 1, n)),
        ):
            zi = self[z]
            if zi.dtype != dt:
                raise GraphError(
                    f"int_matmul: {name} must be {dt} like its operand, found {zi.dtype}"
                )
            try:
                zeros.append(self.broadcast(z, shape))
            except GraphError:
                raise GraphError(
                    f"int_matmul: {name} of shape {zi.shape} does not broadcast to {shape}"
                ) from None
        return self._push(Shape.of(bsz, m, n), DType.I32, IntMatMul(a, b, *zeros))

    def block_quant_matmul(
        self, a: Value, packed: Value, scales: Value, zeros: Value, bits: int, block: int
    ) -> Value:
        """a [m, k] @ Wᵀ with W [n, k] block-quantized (`BlockQuantMatMul`): packed uint8
        [n, ceil(k / block), block · bits / 8], scales float32 and zeros uint8 or float32
        [n, ceil(k / block)]."""
        ai, pi = self[a], self[packed]
        if bits not in (2, 4, 8):
            raise GraphError(f"block_quant_matmul: bits must be 2, 4 or 8, found {bits}")
        if block < 8 or block & (block - 1):
            raise GraphError(
                f"block_quant_matmul: block must be a power of two >= 8, found {block}"
            )
        if ai.rank != 2 or ai.dtype not in (DType.F32, DType.F16):
            raise GraphError(
                f"block_quant_matmul: a must be f32 or f16 [m, k], found {ai.dtype}{ai.shape}"
            )
        k = ai.shape[1].fixed_value()
        if k is None:
            raise GraphError(f"block_quant_matmul: k must be a fixed size, found {ai.shape[1]}")
        blocks = -(-k // block)
        per_block = Shape.of(blocks, block * bits // 8).dims
        if pi.dtype != DType.U8 or pi.rank != 3 or pi.shape.dims[1:] != per_block:
            raise GraphError(
                f"block_quant_matmul: packed must be u8 [n, {blocks}, {block * bits // 8}] for "
                f"k={k}, found {pi.dtype}{pi.shape}"
            )
        n = pi.shape[0]
        for name, v, dtypes in (("scales", scales, "f32"), ("zeros", zeros, "u8 or f32")):
            vi = self[v]
            if str(vi.dtype) not in dtypes or vi.shape != Shape.of(n, blocks):
                raise GraphError(
                    f"block_quant_matmul: {name} must be {dtypes} [{n}, {blocks}], found "
                    f"{vi.dtype}{vi.shape}"
                )
        op = BlockQuantMatMul(a, packed, scales, zeros, bits, block)
        return self._push(Shape.of(ai.shape[0], n), ai.dtype, op)

    def unary(self, op: UnaryOp, x: Value) -> Value:
        info = self[x]
        if op.changes_dtype:
            raise GraphError(f"{op.value}: use cast()/bitcast()")
        if op.float_only and not info.dtype.is_float:
            raise GraphError(f"{op.value}: expected a float operand, found {info.dtype}")
        if op is UnaryOp.NOT and not info.dtype.is_bool:
            raise GraphError(f"not: expected a bool operand, found {info.dtype}")
        if op is UnaryOp.BIT_NOT and not info.dtype.is_int:
            raise GraphError(f"bit_not: expected an integer operand, found {info.dtype}")
        if op in (UnaryOp.ABS, UnaryOp.NEG, UnaryOp.SIGN) and info.dtype.is_bool:
            raise GraphError(f"{op.value}: bool operand")
        return self._push(info.shape, info.dtype, Unary(x, op))

    def cast(self, x: Value, dtype: DType) -> Value:
        info = self[x]
        if info.dtype == dtype:
            return x
        return self._push(info.shape, dtype, Unary(x, UnaryOp.CAST))

    def bitcast(self, x: Value, dtype: DType) -> Value:
        info = self[x]
        if info.dtype == dtype:
            return x
        if info.dtype.size != dtype.size:
            raise GraphError(f"bitcast: {info.dtype} and {dtype} differ in size")
        return self._push(info.shape, dtype, Unary(x, UnaryOp.BITCAST))

    def _operand(self, x: Operand, like: Value) -> Value:
        if isinstance(x, Value):
            return x
        return self.scalar(x, self[like].dtype)

    def binary(self, op: BinaryOp, a: Operand, b: Operand) -> Value:
        """Elementwise binary op with NumPy broadcasting; python scalars take the other's dtype."""
        if not isinstance(a, Value) and not isinstance(b, Value):
            raise GraphError(f"{op.value}: at least one operand must be a Value")
        a = self._operand(a, b) if not isinstance(a, Value) else a  # type: ignore[arg-type]
        b = self._operand(b, a)
        ai, bi = self[a], self[b]
        if ai.dtype != bi.dtype:
            raise GraphError(f"{op.value}: operand dtypes differ ({ai.dtype} and {bi.dtype})")
        dt = ai.dtype
        if op.is_logical and not dt.is_bool:
            raise GraphError(f"{op.value}: expected bool operands, found {dt}")
        if op.is_bitwise and not dt.is_int:
            raise GraphError(f"{op.value}: expected integer operands, found {dt}")
        if dt.is_bool and not (op.is_logical or op is BinaryOp.EQ):
            raise GraphError(f"{op.value}: not defined on bool operands")
        shape = broadcast_shapes(ai.shape, bi.shape, equate=self._equate_or_none())
        if self.equate is not None:
            a, b = self._conform(a, shape), self._conform(b, shape)
            ai, bi = self[a], self[b]
        # canonicalise: identities vanish (x+0, x-0, x*1, x/1, x**1, and 0+x, 1*x)
        ident = op.identity
        if ident is not None and ai.shape == shape and self.scalar_value(b) == ident:
            return a
        if (
            op in (BinaryOp.ADD, BinaryOp.MUL)
            and bi.shape == shape
            and self.scalar_value(a) == ident
        ):
            return b
        out_dt = DType.BOOL if op.is_comparison else dt
        a, b = self.broadcast(a, shape), self.broadcast(b, shape)
        return self._push(shape, out_dt, Binary(a, b, op))

    def select(self, cond: Value, a: Operand, b: Operand) -> Value:
        if not isinstance(a, Value) and not isinstance(b, Value):
            raise GraphError("select: at least one of the branches must be a Value")
        a = self._operand(a, b) if not isinstance(a, Value) else a  # type: ignore[arg-type]
        b = self._operand(b, a)
        ci, ai, bi = self[cond], self[a], self[b]
        if not ci.dtype.is_bool:
            raise GraphError(f"select: condition must be bool, found {ci.dtype}")
        if ai.dtype != bi.dtype:
            raise GraphError(f"select: branch dtypes differ ({ai.dtype} and {bi.dtype})")
        shape = broadcast_shapes(ci.shape, ai.shape, bi.shape, equate=self._equate_or_none())
        if self.equate is not None:
            cond, a, b = (self._conform(v, shape) for v in (cond, a, b))
        if a == b:
            return self.broadcast(a, shape)
        c = self.broadcast(cond, shape)
        return self._push(
            shape, ai.dtype, Select(c, self.broadcast(a, shape), self.broadcast(b, shape))
        )

    def iota(self, shape: Shape | Sequence[SizeLike], axis: int, dtype: DType = DType.I64) -> Value:
        shape = shape if isinstance(shape, Shape) else Shape.from_seq(shape)
        axis = norm_axis(axis, shape.rank)
        if dtype.is_bool:
            raise GraphError("iota: bool dtype")
        return self._push(shape, dtype, Iota(axis))

    def softmax(self, x: Value, axis: int) -> Value:
        info = self[x]
        if not info.dtype.is_float:
            raise GraphError(f"softmax: expected a float operand, found {info.dtype}")
        return self._push(info.shape, info.dtype, Softmax(x, norm_axis(axis, info.rank)))

    def layernorm(self, x: Value, axis: int, eps: float) -> Value:
        info = self[x]
        if not info.dtype.is_float:
            raise GraphError(f"layernorm: expected a float operand, found {info.dtype}")
        return self._push(
            info.shape, info.dtype, Layernorm(x, norm_axis(axis, info.rank), float(eps))
        )

    def attention(
        self,
        q: Value,
        k: Value,
        v: Value,
        mask: Value | None = None,
        scale: float | None = None,
        causal: bool = False,
    ) -> Value:
        """softmax(q·kᵀ·scale + mask [+ causal]) · v on q [b,m,d], k [b,n,d], v [b,n,dv] and an
        optional additive mask [b,m,n]; `scale` defaults to 1/√d (see `ops.Attention`)."""
        qi, ki, vi = self[q], self[k], self[v]
        shapes = f"q {qi.shape}, k {ki.shape}, v {vi.shape}"
        if qi.rank != 3 or ki.rank != 3 or vi.rank != 3:
            raise GraphError(
                f"attention: expected q [b,m,d], k [b,n,d], v [b,n,dv], found {shapes}"
            )
        if not (qi.dtype == ki.dtype == vi.dtype) or not qi.dtype.is_float:
            raise GraphError(
                f"attention: expected equal float dtypes, found {qi.dtype}, {ki.dtype}, {vi.dtype}"
            )
        b, m, d = qi.shape
        n = ki.shape[1]
        if ki.shape[0] != b or vi.shape[0] != b or ki.shape[2] != d or vi.shape[1] != n:
            raise GraphError(
                f"attention: expected q [b,m,d], k [b,n,d], v [b,n,dv], found {shapes}"
            )
        if mask is not None:
            mi = self[mask]
            if mi.shape != Shape.of(b, m, n) or mi.dtype != qi.dtype:
                raise GraphError(
                    f"attention: mask must be {qi.dtype}{Shape.of(b, m, n)} for {shapes}, found {mi.dtype}{mi.shape}"
                )
        if causal and m.is_fixed and n.is_fixed and n.as_int() < m.as_int():
            raise GraphError(
                f"attention: causal with fewer keys than queries ({shapes}) masks whole rows"
            )
        if scale is None:
            scale = 1.0 / float(
                np.sqrt(d.as_int("attention: default scale needs a fixed head size"))
            )
        op = Attention(q, k, v, mask, float(scale), bool(causal))
        return self._push(Shape.of(b, m, vi.shape[2]), qi.dtype, op)

    def dynamic(
        self,
        kind: str,
        args: Sequence[Value],
        params: Sequence[object],
        shapes: Sequence[Shape],
        dtypes: Sequence[DType],
    ) -> list[Value]:
        """The results of a data-dependent op (`kn_graph.dynamic`), one value each. Sizes that
        are only known once it ran are fresh symbols (`fresh_symbol`) in `shapes`. With every
        argument a constant, a kind without subgraphs is computed now: constants come back."""
        if kind not in KINDS:
            raise GraphError(f"dynamic: unknown kind '{kind}'")
        args = tuple(self.check(a) for a in args)
        shapes = tuple(s if isinstance(s, Shape) else Shape.from_seq(s) for s in shapes)
        op = Dynamic(kind, args, tuple(params), shapes, tuple(dtypes))
        if len(op.shapes) != len(op.dtypes) or not op.shapes:
            raise GraphError(f"dynamic {kind}: {len(shapes)} shapes for {len(dtypes)} dtypes")
        consts = [self.const_value(a) for a in args]
        if kind not in CONTROL and all(c is not None for c in consts):
            results = run_dynamic(op, consts, {}, _no_subgraphs)  # type: ignore[arg-type]
            return [self.constant(r) for r in results]
        return [self.dynamic_result(dataclasses.replace(op, output=j)) for j in range(len(shapes))]

    def dynamic_result(self, op: Dynamic) -> Value:
        """The value of result `op.output` of `op` (operands already in this graph)."""
        return self._push(op.shapes[op.output], op.dtypes[op.output], op)

    def reduce(self, x: Value, axes: Sequence[int], op: ReduceOp, keepdims: bool = False) -> Value:
        info = self[x]
        axes_t = tuple(sorted({norm_axis(a, info.rank) for a in axes}))
        if op.is_arg and len(axes_t) != 1:
            raise GraphError(f"reduce {op.value}: exactly one axis, found {list(axes)}")
        if info.dtype.is_bool and op not in (ReduceOp.MIN, ReduceOp.MAX):
            raise GraphError(f"reduce {op.value}: bool operand")
        if op is ReduceOp.MEAN and not info.dtype.is_float:
            raise GraphError(f"reduce mean: expected a float operand, found {info.dtype}")
        kept = Shape(tuple(d for i, d in enumerate(info.shape) if i not in axes_t))
        if op.is_arg:
            out = self._push(kept, DType.I64, Reduce(x, axes_t, op))
        elif not axes_t:
            out = x
        else:
            out = self._push(kept, info.dtype, Reduce(x, axes_t, op))
        if keepdims:
            out = self.view(
                out, Shape(tuple(Size(1) if i in axes_t else d for i, d in enumerate(info.shape)))
            )
        return out

    # -- sizes as values ----------------------------------------------------------------------------
    def size_value(self, s: SizeLike, dtype: DType = DType.I64) -> Value:
        """A size as a rank-0 runtime value: a symbol is the element count of a broadcast of
        ones (no new op, and a GPU fuses it); floordiv, min and max become integer ops."""
        s = Size.of(s)
        v = s.fixed_value()
        if v is not None:
            return self.scalar(v, dtype)
        if not dtype.is_int:  # integer arithmetic (floor division), then the cast
            return self.cast(self.size_value(s, DType.I64), dtype)
        total: Value | None = None
        for mono, coef in s.terms:
            term: Value | None = None if coef == 1 and mono else self.scalar(coef, dtype)
            for atom, exp in mono:
                if isinstance(atom, str):
                    full = self.full(1, Shape.of(Size.sym(atom)), dtype)
                    x = self.reduce(full, [0], ReduceOp.SUM)
                else:
                    args = [self.size_value(a, dtype) for a in atom.args]
                    x = self._atom_value(atom, args)
                for _ in range(exp):
                    term = x if term is None else self.mul(term, x)
            assert term is not None
            total = term if total is None else self.add(total, term)
        assert total is not None
        return total

    def _atom_value(self, atom: _Node, args: list[Value]) -> Value:
        if atom.kind == "floordiv":
            a, b = args
            if atom.args[0].provably_nonneg() and atom.args[1].provably_nonneg():
                return self.binary(BinaryOp.DIV, a, b)  # truncation is floor here
            return self.binary(BinaryOp.DIV, self.sub(a, self.binary(BinaryOp.MOD, a, b)), b)
        op = BinaryOp.MIN if atom.kind == "min" else BinaryOp.MAX
        out = args[0]
        for x in args[1:]:
            out = self.binary(op, out, x)
        return out
