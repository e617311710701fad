"""Dtype tables and the tolerance check shared by the `test_reference_*` modules."""

from __future__ import annotations

import numpy as np

from kn_graph import DType

FLOATS = [DType.F32, DType.F64, DType.F16]
INTS = [DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U16, DType.U32, DType.U64]
SIGNED_INTS = [DType.I8, DType.I16, DType.I32, DType.I64]
ALL = [*FLOATS, *INTS, DType.BOOL]
RTOL = {DType.F16: 2e-3, DType.F32: 2e-6, DType.F64: 1e-13}


def assert_close(got: np.ndarray, ref: np.ndarray, dtype: DType) -> None:
    """Exact for integers and bools; a few ulps of the dtype for floats."""
    assert got.dtype == dtype.np
    assert got.shape == np.shape(ref)
    if dtype.is_float:
        tol = RTOL[dtype]
        np.testing.assert_allclose(
            got.astype(np.float64), np.asarray(ref, np.float64), rtol=tol, atol=tol
        )
    else:
        np.testing.assert_array_equal(got, ref)
