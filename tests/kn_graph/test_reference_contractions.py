"""The NumPy reference executor's conv, matmul and attention, against naive loops."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from kn_graph import DType, Graph, Size
from tests.conftest import graph_with, random_array, run
from tests.kn_graph.reference_tables import assert_close

B = Size.sym("B")


# -- conv -------------------------------------------------------------------------------------------
def naive_conv(x, w, stride, padding, dilation, groups):
    """Cross-correlation written out element by element."""
    n_batch, c_in = x.shape[:2]
    k_out = w.shape[0]
    nd = x.ndim - 2
    cg, kg = c_in // groups, k_out // groups
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    ks = w.shape[2:]
    outs = [(xp.shape[2 + i] - dilation[i] * (ks[i] - 1) - 1) // stride[i] + 1 for i in range(nd)]
    out = np.zeros((n_batch, k_out, *outs))
    for n, k in itertools.product(range(n_batch), range(k_out)):
        group = k // kg
        for o in np.ndindex(*outs):
            acc = 0.0
            for c in range(cg):
                for kk in np.ndindex(*ks):
                    pos = tuple(o[i] * stride[i] + kk[i] * dilation[i] for i in range(nd))
                    acc += xp[(n, group * cg + c, *pos)] * w[(k, c, *kk)]
            out[(n, k, *o)] = acc
    return out


CONV_CASES = [
    # x shape, w shape, stride, padding, dilation, groups
    ((2, 3, 9), (4, 3, 3), (1,), (0,), (1,), 1),
    ((1, 4, 10), (6, 2, 3), (2,), (1,), (2,), 2),
    ((2, 3, 6, 7), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ((1, 2, 7, 8), (3, 2, 3, 2), (2, 3), (1, 0), (1, 2), 1),
    ((2, 4, 5, 5), (4, 1, 3, 3), (1, 1), (1, 1), (1, 1), 4),  # depthwise
    ((1, 4, 6, 6), (8, 1, 3, 3), (2, 2), (1, 1), (1, 1), 4),  # depthwise, multiplier 2
    ((1, 6, 5, 6), (4, 3, 2, 2), (1, 2), (0, 1), (2, 1), 2),
    ((1, 3, 4, 4), (2, 3, 1, 1), (1, 1), (0, 0), (1, 1), 1),  # pointwise
    ((1, 2, 4, 5, 4), (2, 2, 2, 3, 2), (1, 1, 2), (1, 0, 1), (1, 1, 1), 1),
    ((1, 2, 5, 4, 4), (4, 1, 2, 2, 2), (2, 1, 1), (0, 1, 0), (2, 1, 1), 2),
]


@pytest.mark.parametrize(("xs", "ws", "stride", "padding", "dilation", "groups"), CONV_CASES)
@pytest.mark.parametrize("dtype", [DType.F64, DType.F32])
def test_conv_matches_naive_loops(xs, ws, stride, padding, dilation, groups, dtype, rng):
    a = rng.standard_normal(xs)
    wv = rng.standard_normal(ws)
    g, x = graph_with(xs, dtype)
    y = g.conv(x, g.constant(wv.astype(dtype.np)), stride, padding, dilation, groups)
    got = run(g, y, a.astype(dtype.np))
    ref = naive_conv(
        a.astype(dtype.np).astype(np.float64),
        wv.astype(dtype.np).astype(np.float64),
        stride,
        padding,
        dilation,
        groups,
    )
    assert g.shape(y).fixed_dims() == ref.shape
    tol = 1e-12 if dtype is DType.F64 else 1e-5  # sums of up to 54 products
    assert got.dtype == dtype.np
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)


def test_conv_f16_computes_in_f32(rng):
    a = rng.standard_normal((1, 2, 5, 5)).astype(np.float16)
    wv = rng.standard_normal((3, 2, 3, 3)).astype(np.float16)
    g, x = graph_with([1, 2, 5, 5], DType.F16)
    got = run(g, g.conv(x, g.constant(wv), padding=(1, 1)), a)
    assert got.dtype == np.float16
    ref = naive_conv(a.astype(np.float64), wv.astype(np.float64), (1, 1), (1, 1), (1, 1), 1)
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=3e-3, atol=3e-3)


def test_conv_with_runtime_weights_and_symbolic_batch(rng):
    a = rng.standard_normal((3, 2, 6))
    wv = rng.standard_normal((4, 2, 3))
    g = Graph()
    x = g.input([B, 2, 6], DType.F64)
    w = g.input([4, 2, 3], DType.F64)
    np.testing.assert_allclose(
        run(g, g.conv(x, w, padding=(1,)), a, wv),
        naive_conv(a, wv, (1,), (1,), (1,), 1),
        rtol=1e-12,
    )


# -- matmul (the core rank-3 op) ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [DType.F32, DType.F64, DType.F16, DType.I32, DType.I64, DType.U8])
def test_batched_matmul(dtype, rng):
    a = (
        random_array(rng, (3, 4, 5), dtype) % 7
        if dtype.is_int
        else random_array(rng, (3, 4, 5), dtype)
    )
    b = (
        random_array(rng, (3, 5, 2), dtype) % 7
        if dtype.is_int
        else random_array(rng, (3, 5, 2), dtype)
    )
    g = Graph()
    y = g.matmul(g.input([3, 4, 5], dtype), g.input([3, 5, 2], dtype))
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    if dtype.is_int:
        ref = ref.astype(dtype.np)
    assert_close(run(g, y, a, b), ref, dtype)


def test_matmul_with_empty_inner_axis_is_zero():
    g = Graph()
    y = g.matmul(g.input([2, 3, 0], DType.F32), g.input([2, 0, 4], DType.F32))
    np.testing.assert_array_equal(
        run(g, y, np.zeros((2, 3, 0), np.float32), np.zeros((2, 0, 4), np.float32)),
        np.zeros((2, 3, 4)),
    )


# -- attention ------------------------------------------------------------------------------------
def naive_attention(q, k, v, mask, scale, causal):
    b, m, _ = q.shape
    n = k.shape[1]
    out = np.zeros((b, m, v.shape[2]))
    for bi, i in itertools.product(range(b), range(m)):
        scores = np.array([q[bi, i] @ k[bi, j] * scale for j in range(n)])
        if mask is not None:
            scores = scores + mask[bi, i]
        if causal:
            scores[[j for j in range(n) if j > i + (n - m)]] = -np.inf
        w = np.exp(scores - scores.max())
        out[bi, i] = (w / w.sum()) @ v[bi]
    return out


@pytest.mark.parametrize(("m", "n"), [(4, 4), (2, 5), (1, 3)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_attention_matches_naive_formula(m, n, causal, with_mask, rng):
    q, k, v = (
        rng.standard_normal((2, m, 8)),
        rng.standard_normal((2, n, 8)),
        rng.standard_normal((2, n, 3)),
    )
    mask = rng.standard_normal((2, m, n)) if with_mask else None
    g = Graph()
    qi, ki, vi = (
        g.input([2, m, 8], DType.F64),
        g.input([2, n, 8], DType.F64),
        g.input([2, n, 3], DType.F64),
    )
    mi = g.input([2, m, n], DType.F64) if with_mask else None
    y = g.attention(qi, ki, vi, mi, None, causal)
    args = [q, k, v] + ([mask] if with_mask else [])
    ref = naive_attention(q, k, v, mask, 1 / math.sqrt(8), causal)
    np.testing.assert_allclose(run(g, y, *args), ref, rtol=1e-12, atol=1e-12)
