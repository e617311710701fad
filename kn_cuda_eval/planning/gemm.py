"""Row-major batched products as cuBLAS strided-batched GEMMs: transposes and broadcast batches are
absorbed through strides, and C = A·B is issued as Cᵀ = Bᵀ·Aᵀ in cuBLAS's column-major terms."""

from __future__ import annotations

from collections.abc import Callable

from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.program import Const, Program
from kn_cuda_eval.planning.view import StridedView
from kn_graph.dtype import DType
from kn_graph.errors import PlanError

__all__ = ["GEMM_DTYPES", "matrix_layout", "plan_gemm"]

GEMM_DTYPES = frozenset({DType.F32, DType.F16, DType.F64})
"""Element types cuBLAS multiplies (F16 with F32 accumulation)."""


def matrix_layout(v: StridedView) -> tuple[bool, int] | None:
    """How cuBLAS can read v [batch, R, C] (row-major meaning): (False, ld) when each row is
    contiguous (rows ld apart), (True, ld) when each column is (a transposed operand), None when
    neither (a copy is needed). Size-1 axes accept any stride; negative batch strides are refused."""
    bt, r, c = v.shape
    sb, sr, sc = v.strides
    if bt > 1 and sb < 0:
        return None
    if (c == 1 or sc == 1) and (r == 1 or sr >= max(c, 1)):
        return False, max(sr if r > 1 else c, 1)
    if (r == 1 or sr == 1) and (c == 1 or sc >= max(r, 1)):
        return True, max(sc if c > 1 else r, 1)
    return None


def _stored(v: StridedView, col: bool, ld: int, rows: int, cols: int) -> StridedView:
    """The operand as cuBLAS stores it: [batch, columns, rows], strides (batch stride, ld, 1)."""
    sb = v.strides[0] if v.shape[0] > 1 else 0
    return StridedView(v.offset, (v.shape[0], cols, rows), (sb, ld, 1), v.dtype)


def plan_gemm(
    a: StridedView,
    b: StridedView,
    out: StridedView,
    alpha: float,
    densify: Callable[[StridedView], StridedView],
) -> st.MatMul | st.Expr | None:
    """The GEMM step computing out [b,m,n] (dense) = alpha·a [b,m,k] @ b [b,k,n]; operands that
    cuBLAS cannot read in place go through `densify` (a Copy). Returns an all-zero expression when
    k == 0 and None when the product is empty."""
    batch, m, k = a.shape
    n = b.shape[2]
    if a.dtype not in GEMM_DTYPES:
        raise PlanError(f"matmul: cuBLAS has no GEMM for {a.dtype} (supported: f32, f16, f64)")
    if not out.is_dense():
        raise PlanError("internal: GEMM output must be dense")
    if batch * m * n == 0:
        return None
    if k == 0:
        return st.Expr(out.shape, (), (), Program((Const(0.0, out.dtype),), (0,)))
    la = matrix_layout(a)
    if la is None:
        a = densify(a)
        la = matrix_layout(a)
    lb = matrix_layout(b)
    if lb is None:
        b = densify(b)
        lb = matrix_layout(b)
    assert la is not None and lb is not None
    c = out
    if batch > 1 and b.strides[0] == 0:  # a shared right operand: one GEMM with batch·m rows
        a2 = a.reshape((1, batch * m, k))
        la2 = None if a2 is None else matrix_layout(a2)
        if a2 is not None and la2 is not None:
            a, la = a2, la2
            b = b.slice(0, 0, 1, 1)
            c = StridedView.dense(out.offset, (1, batch * m, n), out.dtype)
            m, batch = batch * m, 1
    col_b, ld_b = lb
    col_a, ld_a = la
    # cuBLAS A := graph B (Bᵀ is nxk), cuBLAS B := graph A (Aᵀ is kxm), cuBLAS C := Cᵀ (nxm)
    ca = _stored(b, col_b, ld_b, *((k, n) if col_b else (n, k)))
    cb = _stored(a, col_a, ld_a, *((m, k) if col_a else (k, m)))
    cc = StridedView(c.offset, (batch, m, n), (m * n if batch > 1 else 0, n, 1), c.dtype)
    return st.MatMul(ca, cb, cc, col_b, col_a, n, m, k, batch, float(alpha), 0.0)
