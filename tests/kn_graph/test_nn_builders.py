"""Convenience builders (nn.py): shapes, canonical lowering and values against NumPy references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special

from kn_graph import DType, Graph, GraphError, Shape, ShapeMismatchError, Size
from kn_graph.ops import Binary, BinaryOp, MatMul
from kn_graph.reference import evaluate
from tests.conftest import graph_with, run

B = Size.sym("B")


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# -- elementwise shortcuts ---------------------------------------------------------------------------
def test_relu_is_max_with_zero(rng):
    g, x = graph_with([3, 4])
    y = g.relu(x)
    op = g[y].op
    assert isinstance(op, Binary) and op.op is BinaryOp.MAX
    a = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_array_equal(run(g, y, a), np.maximum(a, 0))


def test_clamp_is_min_then_max_like_onnx_clip():
    g, x = graph_with([5])
    a = np.array([-3, -1, 0, 1, 3], np.float32)
    np.testing.assert_array_equal(run(g, g.clamp(x, -1.5, 2.0), a), [-1.5, -1, 0, 1, 2])
    g, x = graph_with([5])
    # lo > hi: ONNX Clip gives lo everywhere
    np.testing.assert_array_equal(run(g, g.clamp(x, 2.0, -1.0), a), [2, 2, 2, 2, 2])
    g, x = graph_with([5])
    assert g.clamp(x, None, None) == x


def test_gelu_and_silu_match_formulas(rng):
    a = rng.standard_normal(64) * 3
    for approx, ref in [
        ("none", 0.5 * a * (1 + scipy.special.erf(a / math.sqrt(2)))),
        ("tanh", 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3)))),
    ]:
        g, x = graph_with([64], DType.F64)
        np.testing.assert_allclose(run(g, g.gelu(x, approx), a), ref, rtol=1e-12, atol=1e-15)
    g, x = graph_with([64], DType.F64)
    np.testing.assert_allclose(run(g, g.silu(x), a), a / (1 + np.exp(-a)), rtol=1e-12)


# -- shape helpers --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("axes", "shape"),
    [([0], [1, 2, 3]), ([-1], [2, 3, 1]), ([0, 3], [1, 2, 3, 1]), ([1, 2], [2, 1, 1, 3])],
)
def test_unsqueeze(axes, shape):
    g, x = graph_with([2, 3])
    assert g.shape(g.unsqueeze(x, axes)) == Shape.from_seq(shape)


@pytest.mark.parametrize("axes", [[0, 0], [3], [-4]])
def test_unsqueeze_invalid_axes_raise(axes):
    g, x = graph_with([2, 3])
    with pytest.raises(GraphError, match="unsqueeze: invalid axes"):
        g.unsqueeze(x, axes)


def test_squeeze():
    g, x = graph_with([1, 2, 1, 3])
    assert g.shape(g.squeeze(x)) == Shape.of(2, 3)
    assert g.shape(g.squeeze(x, [-2])) == Shape.of(1, 2, 3)
    with pytest.raises(GraphError, match=r"squeeze: axis 1 of shape \[1,2,1,3\] is not of size 1"):
        g.squeeze(x, [1])
    with pytest.raises(GraphError, match="squeeze: axis 4"):
        g.squeeze(x, [4])


@pytest.mark.parametrize(
    ("axis", "shape"), [(0, [1, 24]), (1, [2, 12]), (2, [6, 4]), (3, [24, 1]), (-1, [6, 4])]
)
def test_flatten(axis, shape):
    g, x = graph_with([2, 3, 4])
    assert g.shape(g.flatten(x, axis)) == Shape.from_seq(shape)


def test_flatten_symbolic_and_invalid_axis():
    g, x = graph_with([B, 3, 4])
    assert g.shape(g.flatten(x)) == Shape.of(B, 12)
    with pytest.raises(GraphError, match="flatten: axis 4 out of range for rank 3"):
        g.flatten(x, 4)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_repeat_tiles_like_numpy(axis):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    g, x = graph_with([2, 3])
    reps = [1, 1]
    reps[axis] = 3
    np.testing.assert_array_equal(run(g, g.repeat(x, axis, 3), a), np.tile(a, reps))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_repeat_interleave_like_numpy_repeat(axis):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    g, x = graph_with([2, 3])
    np.testing.assert_array_equal(
        run(g, g.repeat_interleave(x, axis, 2), a), np.repeat(a, 2, axis=axis)
    )


@pytest.mark.parametrize("builder", ["repeat", "repeat_interleave"])
@pytest.mark.parametrize("axis", [2, -3])
def test_repeat_axis_out_of_range_raises(builder, axis):
    g, x = graph_with([2, 3])
    with pytest.raises(GraphError, match=f"axis {axis} out of range for rank 2"):
        getattr(g, builder)(x, axis, 2)


def test_repeat_symbolic_count():
    g, x = graph_with([3])
    assert g.shape(g.repeat(x, 0, B)) == Shape.of(3 * B)


# -- pad ----------------------------------------------------------------------------------------------
PAD_CASES = [
    [(0, 0), (1, 2)],
    [(2, 1), (0, 0)],
    [(1, 1), (3, 3)],
    [(0, 3), (2, 0)],
]


@pytest.mark.parametrize("pads", PAD_CASES)
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_modes_match_np_pad(pads, mode, rng):
    a = rng.standard_normal((4, 5)).astype(np.float32)
    g, x = graph_with([4, 5])
    kw = {"constant_values": 1.5} if mode == "constant" else {}
    got = run(g, g.pad(x, pads, mode, value=1.5), a)
    np.testing.assert_array_equal(got, np.pad(a, pads, mode=mode, **kw))


def test_pad_wrap_wider_than_the_axis_matches_np_pad():
    a = np.arange(3, dtype=np.int32)
    g, x = graph_with([3], DType.I32)
    np.testing.assert_array_equal(
        run(g, g.pad(x, [(5, 7)], "wrap"), a), np.pad(a, [(5, 7)], mode="wrap")
    )


@pytest.mark.parametrize("pads", [[(-1, 0)], [(0, -2)], [(-1, 3)], [(2, -3)], [(-2, -2)]])
def test_pad_negative_amounts_crop(pads):
    a = np.arange(6, dtype=np.float32)
    g, x = graph_with([6])
    before, after = pads[0]
    ref = np.pad(a, [(max(before, 0), max(after, 0))], constant_values=7)
    ref = ref[max(-before, 0) : len(ref) - max(-after, 0)]
    np.testing.assert_array_equal(run(g, g.pad(x, pads, value=7), a), ref)


def test_pad_constant_on_symbolic_axis():
    g, x = graph_with([B, 2])
    assert g.shape(g.pad(x, [(0, 0), (0, 1)])) == Shape.of(B, 3)
    assert g.shape(g.pad(x, [(1, 2), (0, 0)])) == Shape.of(B + 3, 2)


@pytest.mark.parametrize(
    ("pads", "mode", "match"),
    [
        ([(0, 0)], "constant", r"pad: 1 \(before, after\) pairs for rank 2"),
        ([(0, 0), (4, 0)], "reflect", r"pad \(reflect\): padding \(4, 0\) must be < size 4"),
        ([(0, 0), (1, 0)], "mirror", "pad: unknown mode 'mirror'"),
    ],
)
def test_pad_validation(pads, mode, match):
    g, x = graph_with([3, 4])
    with pytest.raises(GraphError, match=match):
        g.pad(x, pads, mode)  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", ["edge", "reflect", "wrap"])
def test_pad_non_constant_mode_on_a_symbolic_axis(mode):
    g, x = graph_with([B])
    y = g.pad(x, [(2, 1)], mode)
    assert g.shape(y) == Shape.of(B + 3)
    g.add_output(y)
    a = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(evaluate(g, [a])[0], np.pad(a, (2, 1), mode=mode))
    with pytest.raises(ShapeMismatchError, match=rf"pad \({mode}\)"):
        evaluate(g, [a[:1]])


# -- matmul_nd and linear ---------------------------------------------------------------------------
MATMUL_SHAPES = [
    ((3,), (3,)),
    ((3,), (3, 4)),
    ((2, 3), (3,)),
    ((2, 3), (3, 4)),
    ((5, 2, 3), (3, 4)),
    ((2, 3), (5, 3, 4)),
    ((5, 2, 3), (5, 3, 4)),
    ((5, 1, 2, 3), (1, 6, 3, 4)),
    ((1, 2, 3), (7, 3, 4)),
    ((4, 3), (2, 1, 3, 5)),
    ((3,), (2, 3, 4)),
    ((2, 2, 3), (3,)),
    ((0, 2, 3), (3, 4)),
    ((2, 0), (0, 4)),
]


@pytest.mark.parametrize(("sa", "sb"), MATMUL_SHAPES, ids=[f"{a}@{b}" for a, b in MATMUL_SHAPES])
def test_matmul_nd_matches_np_matmul(sa, sb, rng):
    a = rng.standard_normal(sa)
    b = rng.standard_normal(sb)
    g = Graph()
    x, y = g.input(sa, DType.F64, "a"), g.input(sb, DType.F64, "b")
    out = run(g, g.matmul_nd(x, y), a, b)
    ref = np.matmul(a, b)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


def test_matmul_nd_integer():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.arange(12, dtype=np.int32).reshape(3, 4) - 5
    g = Graph()
    out = run(g, g.matmul_nd(g.input([2, 3], DType.I32), g.input([3, 4], DType.I32)), a, b)
    np.testing.assert_array_equal(out, a @ b)


def test_matmul_nd_without_b_batch_is_one_gemm():
    g = Graph()
    y = g.matmul_nd(g.input([B, 7, 3], DType.F32), g.input([3, 4], DType.F32))
    assert g.shape(y) == Shape.of(B, 7, 4)
    mms = [v for v in g.values() if isinstance(g[v].op, MatMul)]
    assert len(mms) == 1
    assert g.shape(mms[0]) == Shape.of(1, 7 * B, 4)


@pytest.mark.parametrize(
    ("sa", "sb", "match"),
    [
        ((), (3,), r"matmul: scalar operand"),
        ((2, 3), (4, 5), r"matmul: inner sizes differ \(\[2,3\] @ \[4,5\]\)"),
        ((2, 2, 3), (3, 3, 4), "cannot broadcast"),
    ],
)
def test_matmul_nd_validation(sa, sb, match):
    g = Graph()
    with pytest.raises(GraphError, match=match):
        g.matmul_nd(g.input(sa, DType.F32), g.input(sb, DType.F32))


def test_linear_matches_pytorch_layout(rng):
    x = rng.standard_normal((2, 5, 3))
    w = rng.standard_normal((4, 3))
    b = rng.standard_normal(4)
    g = Graph()
    xi = g.input([2, 5, 3], DType.F64)
    y = g.linear(xi, g.constant(w), g.constant(b))
    np.testing.assert_allclose(run(g, y, x), x @ w.T + b, rtol=1e-12)
    g = Graph()
    xi = g.input([2, 5, 3], DType.F64)
    np.testing.assert_allclose(run(g, g.linear(xi, g.constant(w)), x), x @ w.T, rtol=1e-12)


# -- pooling -----------------------------------------------------------------------------------------
def naive_pool(x, kind, kernel, stride, pads, dilation, ceil_mode, count_include_pad):
    """PyTorch/ONNX pooling semantics written out element by element."""
    nd = len(kernel)
    lead, spatial = x.shape[:-nd], x.shape[-nd:]
    outs = []
    for n, k, s, d, (pb, pa) in zip(spatial, kernel, stride, dilation, pads, strict=True):
        span = n + pb + pa - d * (k - 1) - 1
        o = (math.ceil(span / s) if ceil_mode else span // s) + 1
        if ceil_mode and (o - 1) * s >= n + pb:
            o -= 1
        outs.append(o)
    out = np.zeros(lead + tuple(outs), np.float64)
    for lidx in np.ndindex(*lead):
        for oidx in np.ndindex(*outs):
            vals, count = [], 0
            for kidx in np.ndindex(*kernel):
                pos = [
                    o * s - pb + j * d
                    for o, s, (pb, _), j, d in zip(oidx, stride, pads, kidx, dilation, strict=True)
                ]
                inside = all(0 <= p < n for p, n in zip(pos, spatial, strict=True))
                in_padded = all(
                    -pb <= p < n + pa for p, n, (pb, pa) in zip(pos, spatial, pads, strict=True)
                )
                if inside:
                    vals.append(x[lidx + tuple(pos)])
                if inside or (count_include_pad and in_padded):
                    count += 1
            if kind == "max":
                out[lidx + oidx] = max(vals)
            else:
                out[lidx + oidx] = sum(vals) / count
    return out


POOL_CASES = [
    # kernel, stride, pads, dilation, ceil_mode
    ((2, 2), (2, 2), ((0, 0), (0, 0)), (1, 1), False),
    ((3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), False),
    ((3, 3), (2, 2), ((1, 1), (1, 1)), (1, 1), True),
    ((3, 2), (2, 3), ((0, 1), (1, 0)), (1, 1), True),
    ((2, 2), (1, 1), ((0, 0), (0, 0)), (2, 2), False),
    ((3, 3), (3, 3), ((1, 1), (1, 1)), (1, 1), True),
    ((2, 3), (2, 2), ((1, 0), (0, 1)), (2, 1), True),
    ((1, 1), (2, 2), ((0, 0), (0, 0)), (1, 1), False),
]


@pytest.mark.parametrize(("kernel", "stride", "pads", "dilation", "ceil_mode"), POOL_CASES)
@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_pool_2d_matches_naive_reference(
    kernel, stride, pads, dilation, ceil_mode, kind, count_include_pad, rng
):
    if kind == "max" and count_include_pad:
        count_include_pad = False  # meaningless for max: the pair collapses onto one case
    a = rng.standard_normal((2, 3, 7, 8)).astype(np.float32)
    g, x = graph_with([2, 3, 7, 8])
    y = g.pool(x, kind, kernel, stride, pads, dilation, ceil_mode, count_include_pad)
    got = run(g, y, a)
    ref = naive_pool(
        a.astype(np.float64), kind, kernel, stride, pads, dilation, ceil_mode, count_include_pad
    )
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_pool_1d_and_3d(kind, rng):
    for shape, kernel, stride, pads in [
        ((2, 9), (3,), (2,), ((1, 1),)),
        ((1, 2, 5, 6, 4), (2, 3, 2), (1, 2, 2), ((0, 1), (1, 1), (0, 0))),
    ]:
        a = rng.standard_normal(shape).astype(np.float32)
        g, x = graph_with(shape)
        got = run(g, g.pool(x, kind, kernel, stride, pads), a)
        ref = naive_pool(
            a.astype(np.float64), kind, kernel, stride, pads, (1,) * len(kernel), False, False
        )
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_max_pool_integer_pads_with_the_lowest_value():
    a = np.array([[-5, -7, -3]], np.int8)
    g, x = graph_with([1, 3], DType.I8)
    got = run(g, g.pool(x, "max", (2,), (2,), ((1, 1),)), a)
    np.testing.assert_array_equal(got, [[-5, -3]])


def test_pool_symbolic_batch(rng):
    g, x = graph_with([B, 1, 4, 4])
    y = g.pool(x, "avg", (2, 2), (2, 2))
    assert g.shape(y) == Shape.of(B, 1, 2, 2)
    a = rng.standard_normal((3, 1, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(
        run(g, y, a), a.reshape(3, 1, 2, 2, 2, 2).mean(axis=(3, 5)), rtol=1e-6
    )


@pytest.mark.parametrize(
    ("shape", "dtype", "kw", "match"),
    [
        ([1, 4], DType.F32, {"kernel": ()}, "pool: kernel"),
        ([4], DType.F32, {"kernel": (2, 2)}, r"pool: kernel \[2, 2\] does not fit input \[4\]"),
        (
            [1, 4],
            DType.I32,
            {"kernel": (2,), "kind": "avg"},
            "avg pool: expected a float operand, found i32",
        ),
        ([1, 4], DType.F32, {"kernel": (2,), "stride": (1, 1)}, "one entry per axis"),
        (
            [1, 4],
            DType.F32,
            {"kernel": (0,)},
            "pool: invalid kernel/stride/dilation/pads on axis 0",
        ),
        ([1, 4], DType.F32, {"kernel": (2,), "pads": ((-1, 0),)}, "pool: invalid"),
        ([1, 4], DType.F32, {"kernel": (6,)}, "larger than padded input"),
    ],
)
def test_pool_validation(shape, dtype, kw, match):
    g, x = graph_with(shape, dtype)
    kind = kw.pop("kind", "max")
    with pytest.raises(GraphError, match=match):
        g.pool(x, kind, **kw)


@pytest.mark.parametrize("builder", ["pool", "global_pool"])
def test_unknown_pool_kind_raises(builder):
    g, x = graph_with([1, 1, 4])
    args = (x, "min", (2,)) if builder == "pool" else (x, "min")
    with pytest.raises(GraphError, match="pool: unknown kind 'min'; expected 'max' or 'avg'"):
        getattr(g, builder)(*args)


def test_unknown_gelu_approximation_raises():
    g, x = graph_with([3])
    with pytest.raises(GraphError, match="gelu: unknown approximation 'fast'"):
        g.gelu(x, "fast")  # type: ignore[arg-type]


@pytest.mark.parametrize("axis", [3, -4])
def test_layer_norm_axis_out_of_range_raises(axis):
    g, x = graph_with([2, 3, 4])
    with pytest.raises(GraphError, match=f"axis {axis} out of range for rank 3"):
        g.layer_norm(x, axis, 1e-5)


@pytest.mark.parametrize("kind", ["max", "avg"])
def test_global_pool(kind, rng):
    a = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    g, x = graph_with([2, 3, 4, 5])
    y = g.global_pool(x, kind)
    ref = a.max(axis=(2, 3), keepdims=True) if kind == "max" else a.mean(axis=(2, 3), keepdims=True)
    np.testing.assert_allclose(run(g, y, a), ref, rtol=1e-6)


# -- normalisations ------------------------------------------------------------------------------------
def np_norm(a, axes, eps):
    mean = a.mean(axis=axes, keepdims=True)
    var = ((a - mean) ** 2).mean(axis=axes, keepdims=True)
    return (a - mean) / np.sqrt(var + eps)


@pytest.mark.parametrize("axis", [-1, 1, 2, 0])
def test_layer_norm_over_trailing_axes_with_affine(axis, rng):
    a = rng.standard_normal((2, 3, 4))
    norm_shape = a.shape[axis:]
    scale, bias = rng.standard_normal(norm_shape), rng.standard_normal(norm_shape)
    g, x = graph_with([2, 3, 4], DType.F64)
    y = g.layer_norm(x, axis, 1e-5, g.constant(scale), g.constant(bias))
    axes = tuple(range(axis % 3, 3))
    np.testing.assert_allclose(
        run(g, y, a), np_norm(a, axes, 1e-5) * scale + bias, rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize("groups", [1, 2, 6])
def test_group_norm_matches_formula(groups, rng):
    a = rng.standard_normal((2, 6, 3, 2))
    scale, bias = rng.standard_normal(6), rng.standard_normal(6)
    g, x = graph_with([2, 6, 3, 2], DType.F64)
    y = g.group_norm(x, groups, 1e-3, g.constant(scale), g.constant(bias))
    grouped = a.reshape(2, groups, -1)
    ref = np_norm(grouped, (2,), 1e-3).reshape(a.shape) * scale[:, None, None] + bias[:, None, None]
    np.testing.assert_allclose(run(g, y, a), ref, rtol=1e-10, atol=1e-12)


def test_group_norm_without_affine_and_symbolic_batch(rng):
    a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    g, x = graph_with([B, 4, 5])
    y = g.group_norm(x, 2, 1e-5)
    ref = np_norm(a.reshape(3, 2, 10).astype(np.float64), (2,), 1e-5).reshape(a.shape)
    np.testing.assert_allclose(run(g, y, a), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("groups", [4, 5])
def test_group_norm_groups_must_divide_channels(groups):
    g, x = graph_with([1, 6, 2])
    with pytest.raises(
        GraphError, match=f"group_norm: 6 channels not divisible into {groups} groups"
    ):
        g.group_norm(x, groups, 1e-5)


def test_instance_norm_matches_formula(rng):
    a = rng.standard_normal((2, 3, 4, 5))
    scale, bias = rng.standard_normal(3), rng.standard_normal(3)
    g, x = graph_with([2, 3, 4, 5], DType.F64)
    y = g.instance_norm(x, 1e-5, g.constant(scale), g.constant(bias))
    ref = np_norm(a, (2, 3), 1e-5) * scale[:, None, None] + bias[:, None, None]
    np.testing.assert_allclose(run(g, y, a), ref, rtol=1e-10, atol=1e-12)


def test_norms_of_f16_compute_in_f32(rng):
    a = rng.standard_normal((2, 8)).astype(np.float16)
    g, x = graph_with([2, 8], DType.F16)
    got = run(g, g.layer_norm(x, -1, 1e-5), a)
    assert got.dtype == np.float16
    np.testing.assert_allclose(
        got, np_norm(a.astype(np.float32), (1,), 1e-5).astype(np.float16), rtol=2e-3, atol=2e-3
    )
