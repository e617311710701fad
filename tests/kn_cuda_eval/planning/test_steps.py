"""Every step kind against the CPU executor: matmul (transposes, broadcast batches, folding),
convolution (fusion, groups, dilation, 1-d/2-d/3-d), reductions, softmax, layernorm, gather,
concat and attention (fused and decomposed)."""

from __future__ import annotations

import numpy as np
import pytest

from kn_cuda_eval import PlanSettings
from kn_cuda_eval.cuda.kernels.dispatch import plan_launches
from kn_cuda_eval.planning import steps
from kn_graph import DType, Graph, ReduceOp, Shape, Size
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_cuda_eval.helpers import check_plan

B = Size.sym("B")
RNG = np.random.default_rng(1)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def kinds(p) -> list[str]:
    return [type(s).__name__ for s in p.steps]


# -- matmul --------------------------------------------------------------------------------------
@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
def test_matmul_transposes_are_absorbed(ta: bool, tb: bool) -> None:
    g = Graph()
    a = g.input(Shape.of(B, 4, 6) if ta else Shape.of(B, 6, 4), DType.F32, "a")
    b = g.input(Shape.of(B, 5, 4) if tb else Shape.of(B, 4, 5), DType.F32, "b")
    aa = g.transpose(a) if ta else a
    bb = g.transpose(b) if tb else b
    g.add_output(g.matmul(aa, bb), "c")
    xa = f32(3, 4, 6) if ta else f32(3, 6, 4)
    xb = f32(3, 5, 4) if tb else f32(3, 4, 5)
    for p in check_plan(g, [xa, xb], 3):
        assert kinds(p) == ["MatMul"], str(p)
        (mm,) = p.steps
        assert (mm.transa, mm.transb) == (tb, ta)


def test_matmul_shared_weight_folds_the_batch() -> None:
    g = Graph()
    x = g.input(Shape.of(B, 7, 8), DType.F32, "x")
    w = g.constant(f32(8, 3))
    g.add_output(g.matmul_nd(x, w), "y")
    (p, _) = check_plan(g, [f32(4, 7, 8)], 4)
    (mm,) = [s for s in p.steps if isinstance(s, steps.MatMul)]
    assert mm.batch == 1 and mm.n == 28


def test_matmul_broadcast_batch_without_folding() -> None:
    g = Graph()
    a = g.input(Shape.of(1, 5, 3), DType.F32, "a")
    b = g.input(Shape.of(4, 3, 2), DType.F32, "b")
    g.add_output(g.matmul(g.broadcast(a, Shape.of(4, 5, 3)), b), "c")
    (p, _) = check_plan(g, [f32(1, 5, 3), f32(4, 3, 2)])
    (mm,) = p.steps
    assert mm.batch == 4 and mm.stride_b == 0


def test_matmul_unreadable_operand_is_copied() -> None:
    g = Graph()
    a = g.input(Shape.of(2, 3, 4, 5), DType.F32, "a")
    # [2,3,4,5] -> permute -> [4,3,2,5] -> view [4, 6, 5]: rows not evenly strided: a copy
    v = g.view(g.permute(a, [2, 1, 0, 3]), Shape.of(4, 6, 5))
    b = g.input(Shape.of(4, 5, 2), DType.F32, "b")
    g.add_output(g.matmul(v, b), "c")
    (p, _) = check_plan(g, [f32(2, 3, 4, 5), f32(4, 5, 2)])
    assert "Copy" in kinds(p)


@pytest.mark.parametrize("dtype", [DType.F16, DType.F64])
def test_matmul_other_float_types(dtype: DType) -> None:
    g = Graph()
    a = g.input(Shape.of(2, 3, 4), dtype, "a")
    b = g.input(Shape.of(2, 4, 5), dtype, "b")
    g.add_output(g.matmul(a, b), "c")
    check_plan(g, [f32(2, 3, 4).astype(dtype.np), f32(2, 4, 5).astype(dtype.np)])


def test_matmul_with_zero_inner_size_is_zero() -> None:
    g = Graph()
    a = g.input(Shape.of(2, 3, 0), DType.F32, "a")
    b = g.input(Shape.of(2, 0, 4), DType.F32, "b")
    g.add_output(g.matmul(a, b), "c")
    check_plan(g, [f32(2, 3, 0), f32(2, 0, 4)])


# -- conv ----------------------------------------------------------------------------------------
def _conv_graph(
    nd: int,
    groups: int = 1,
    dilation: int = 1,
    stride: int = 2,
    residual: bool = True,
    relu: bool = True,
):
    g = Graph()
    c, k = 4, 8
    sp = (9,) * nd
    x = g.input(Shape.of(B, c, *sp), DType.F32, "x")
    w = g.constant(f32(k, c // groups, *(3,) * nd))
    bias = g.constant(f32(k))
    y = g.conv(x, w, (stride,) * nd, (1,) * nd, (dilation,) * nd, groups)
    y = g.add(y, g.view(bias, Shape.of(k, *(1,) * nd)))
    if residual:
        r = g.input(Shape.from_seq(g.shape(y)), DType.F32, "r")
        y = g.add(y, r)
    if relu:
        y = g.relu(y)
    g.add_output(y, "y")
    return g


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_conv_fuses_bias_residual_relu(nd: int) -> None:
    g = _conv_graph(nd)
    out_shape = [2 if d == 0 else s.eval({"B": 2}) for d, s in enumerate(g.shape(g.outputs[0]))]
    xs = [f32(2, 4, *(9,) * nd), f32(*out_shape)]
    for p in check_plan(g, xs, 2):
        (conv,) = [s for s in p.steps if isinstance(s, steps.Conv)]
        assert conv.bias is not None and conv.residual is not None and conv.relu, str(p)
        assert kinds(p) == ["Conv"]


@pytest.mark.parametrize(
    ("spatial", "kernel", "step_rank"),
    [((12, 1), (5, 1), 3), ((1, 12), (1, 3), 3), ((1, 7, 1), (1, 3, 1), 3), ((1, 1), (1, 1), 3)],
)
def test_spatial_axes_left_at_one_are_dropped_from_the_step(
    spatial: tuple[int, ...], kernel: tuple[int, ...], step_rank: int
) -> None:
    """A 1-d convolution exported as 2-d (or 3-d): its unit axes leave the step, which then runs
    as the 1-d convolution it is (oneDNN's 2-d Kx1 form ran 1.9 times slower); bias, residual
    and relu still fuse, and the result is the reference's on the emulator, the fake CUDA
    device and Device.cpu()."""
    g = Graph()
    x = g.input(Shape.of(B, 4, *spatial), DType.F32, "x")
    y = g.conv(x, g.constant(f32(6, 4, *kernel)))
    y = g.add(y, g.view(g.constant(f32(6)), Shape.of(6, *(1,) * len(spatial))))
    y = g.relu(g.add(y, g.input(Shape.from_seq(g.shape(y)), DType.F32, "r")))
    g.add_output(y, "y")
    out = [2 if d == 0 else s.eval({"B": 2}) for d, s in enumerate(g.shape(y))]
    xs = [f32(2, 4, *spatial), f32(*out)]
    for p in check_plan(g, xs, 2):
        (conv,) = [s for s in p.steps if isinstance(s, steps.Conv)]
        assert len(conv.x.shape) == len(conv.out.shape) == len(conv.w.shape) == step_rank
        assert conv.bias is not None and conv.residual is not None and conv.relu, str(p)
    special = [xs[0].copy(), xs[1]]  # a copy: check_plan keeps its feeds for later replays
    special[0].reshape(-1)[[0, 5]] = [np.nan, np.inf]  # the CPU backend keeps NaN and inf
    with np.errstate(invalid="ignore"):  # inf times a zero tap is NaN, as it should be
        want = evaluate(g, special)[0]
        got = Device.cpu().prepare(g).eval(special)[0]
    assert np.isnan(want).any()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("groups,dilation", [(2, 1), (4, 2), (1, 2)])
def test_conv_groups_and_dilation(groups: int, dilation: int) -> None:
    g = _conv_graph(2, groups, dilation, stride=1, residual=False)
    check_plan(g, [f32(3, 4, 9, 9)], 3)


def test_conv_bias_only_and_unfusable_tail() -> None:
    g = Graph()
    x = g.input(Shape.of(2, 3, 6, 6), DType.F32, "x")
    y = g.conv(x, g.constant(f32(5, 3, 3, 3)), padding=(1, 1))
    y = g.add(y, g.view(g.constant(f32(5)), Shape.of(5, 1, 1)))
    y = g.mul(y, 3.0)  # not fusable: an elementwise kernel after the conv
    g.add_output(y, "y")
    (p, _) = check_plan(g, [f32(2, 3, 6, 6)])
    assert kinds(p) == ["Conv", "Elementwise"]


def test_conv_input_that_is_not_dense_is_copied() -> None:
    g = Graph()
    x = g.input(Shape.of(2, 6, 6, 3), DType.F32, "x")  # NHWC
    y = g.conv(g.permute(x, [0, 3, 1, 2]), g.constant(f32(4, 3, 3, 3)))
    g.add_output(y, "y")
    (p, _) = check_plan(g, [f32(2, 6, 6, 3)])
    assert kinds(p) == ["Copy", "Conv"]


def test_conv_output_used_twice_is_not_fused() -> None:
    g = Graph()
    x = g.input(Shape.of(1, 2, 5, 5), DType.F32, "x")
    y = g.conv(x, g.constant(f32(2, 2, 3, 3)), padding=(1, 1))
    g.add_output(g.relu(y), "a")
    g.add_output(g.add(y, x), "b")
    (p, _) = check_plan(g, [f32(1, 2, 5, 5)])
    (conv,) = [s for s in p.steps if isinstance(s, steps.Conv)]
    assert conv.bias is None and conv.residual is None and not conv.relu


# -- rows ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", list(ReduceOp), ids=lambda o: o.value)
@pytest.mark.parametrize("axes", [(1,), (0, 2), (2,)])
def test_reduce(op: ReduceOp, axes: tuple[int, ...]) -> None:
    if op.is_arg and len(axes) > 1:
        axes = axes[:1]
    g = Graph()
    x = g.input(Shape.of(3, 4, 5), DType.F32, "x")
    g.add_output(g.reduce(g.mul(x, 2.0), axes, op), "y")
    a = f32(3, 4, 5)
    a[0, 1, :] = a[0, 1, 0]  # ties for argmin/argmax
    check_plan(g, [a])


@pytest.mark.parametrize("dtype", [DType.I32, DType.I64, DType.I8, DType.F16, DType.BOOL])
def test_reduce_other_types(dtype: DType) -> None:
    g = Graph()
    x = g.input(Shape.of(4, 33), dtype, "x")
    ops = (
        [ReduceOp.MIN, ReduceOp.MAX]
        if dtype.is_bool
        else [ReduceOp.SUM, ReduceOp.MAX, ReduceOp.ARGMAX, ReduceOp.PROD]
    )
    for op in ops:
        g.add_output(g.reduce(x, [1], op), op.value)
    a = (
        RNG.random((4, 33)) < 0.5
        if dtype.is_bool
        else (RNG.standard_normal((4, 33)) * 3).astype(dtype.np)
    )
    if dtype is DType.F16:
        a = (a / 4).astype(np.float16)
    check_plan(g, [a], optimized=False)


def test_long_rows_use_a_block_per_row() -> None:
    g = Graph()
    x = g.input(Shape.of(3, 5000), DType.F32, "x")
    g.add_output(g.softmax(x, 1), "s")
    g.add_output(g.layernorm(x, 1, 1e-5), "l")
    g.add_output(g.reduce(x, [1], ReduceOp.ARGMAX), "a")
    (p, _) = check_plan(g, [f32(3, 5000)])
    assert all("#define TPR 256" in k.kernel.source for k in plan_launches(p))


def test_softmax_absorbs_scale_and_mask() -> None:
    g = Graph()
    s = g.input(Shape.of(B, 4, 6), DType.F32, "s")
    m = g.input(Shape.of(B, 1, 6), DType.F32, "m")
    x = g.add(g.mul(s, 0.125), g.mul(g.sub(1.0, m), -10000.0))
    g.add_output(g.softmax(x, 2), "p")
    (p, _) = check_plan(g, [f32(2, 4, 6), (RNG.random((2, 1, 6)) < 0.5).astype(np.float32)], 2)
    assert kinds(p) == ["Softmax"]


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_softmax_and_layernorm_on_any_axis(axis: int) -> None:
    g = Graph()
    x = g.input(Shape.of(3, 4, 5), DType.F32, "x")
    g.add_output(g.softmax(x, axis), "s")
    g.add_output(g.layernorm(x, axis, 1e-5), "l")
    check_plan(g, [f32(3, 4, 5)])


def test_layernorm_absorbs_residual_and_f16() -> None:
    g = Graph()
    x = g.input(Shape.of(B, 7, 16), DType.F16, "x")
    r = g.input(Shape.of(B, 7, 16), DType.F16, "r")
    gamma, beta = g.constant(f32(16).astype(np.float16)), g.constant(f32(16).astype(np.float16))
    g.add_output(g.layer_norm(g.add(x, r), -1, 1e-5, gamma, beta), "y")
    check_plan(g, [f32(2, 7, 16).astype(np.float16), f32(2, 7, 16).astype(np.float16)], 2)


# -- gather, concat --------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, 2])
def test_gather(axis: int) -> None:
    g = Graph()
    x = g.input(Shape.of(5, 6, 7), DType.F32, "x")
    n = (5, 6, 7)[axis]
    i = g.input(Shape.of(4), DType.I64, "i")
    g.add_output(g.gather(g.mul(x, 2.0), axis, i), "y")
    check_plan(g, [f32(5, 6, 7), np.array([n - 1, 0, 2, 0], np.int64)])


def test_gather_out_of_range_is_an_error() -> None:
    from kn_cuda_eval import emulate, plan
    from kn_graph.errors import EvaluationError

    g = Graph()
    x = g.input(Shape.of(5, 3), DType.F32, "x")
    i = g.input(Shape.of(2), DType.I32, "i")
    g.add_output(g.gather(x, 0, i), "y")
    with pytest.raises(EvaluationError, match="out of range"):
        emulate(plan(g), [f32(5, 3), np.array([1, 5], np.int32)])


def test_embedding_lookup() -> None:
    S = Size.sym("seq")
    g = Graph()
    ids = g.input(Shape.of(B, S), DType.I64, "ids")
    table = g.constant(f32(50, 8))
    flat = g.gather(table, 0, g.view(ids, Shape.of(B * S)))
    g.add_output(g.view(flat, Shape.of(B, S, 8)), "e")
    check_plan(g, [RNG.integers(0, 50, (2, 5))], 2, {"seq": 5})


def test_concat_writes_lazy_operands_in_place() -> None:
    g = Graph()
    a = g.input(Shape.of(B, 3), DType.F32, "a")
    b = g.input(Shape.of(B, 2), DType.F32, "b")
    g.add_output(g.concat([g.exp(a), b, g.neg(a)], 1), "y")
    (p, _) = check_plan(g, [f32(4, 3), f32(4, 2)], 4)
    assert kinds(p) == ["Elementwise", "Copy", "Elementwise"]


# -- attention -------------------------------------------------------------------------------------
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_attention(fused: bool, causal: bool, masked: bool) -> None:
    g = Graph()
    q = g.input(Shape.of(B, 5, 8), DType.F32, "q")
    k = g.input(Shape.of(B, 7, 8), DType.F32, "k")
    v = g.input(Shape.of(B, 7, 40), DType.F32, "v")
    mask = g.input(Shape.of(B, 5, 7), DType.F32, "mask") if masked else None
    g.add_output(g.attention(q, k, v, mask, 0.3, causal), "o")
    xs = [f32(6, 5, 8), f32(6, 7, 8), f32(6, 7, 40)] + ([f32(6, 5, 7)] if masked else [])
    for p in check_plan(g, xs, 6, settings=PlanSettings(fused_attention=fused)):
        assert ("Attention" in kinds(p)) == fused


def test_attention_on_permuted_heads() -> None:
    # [B, S, H*D] -> [B, H, S, D] -> [B*H, S, D]: the heads are strided views, no copies
    g = Graph()
    x = g.input(Shape.of(B, 6, 16), DType.F32, "x")
    h = g.view(g.permute(g.view(x, Shape.of(B, 6, 2, 8)), [0, 2, 1, 3]), Shape.of(B * 2, 6, 8))
    g.add_output(g.attention(h, h, h, None, None, True), "o")
    check_plan(g, [f32(3, 6, 16)], 3)


def test_fused_attention_reads_heads_in_place() -> None:
    """[B,S,H*D] -> [B,H,S,D] -> [B*H,S,D] queries, multi-query keys broadcast over the heads and
    a per-sequence mask: the fused kernel reads all of them through strides, nothing is copied."""
    g = Graph()
    x = g.input(Shape.of(B, 6, 16), DType.F32, "x")
    kv = g.input(Shape.of(B, 1, 6, 8), DType.F32, "kv")
    m = g.input(Shape.of(B, 1, 6, 6), DType.F32, "m")
    q = g.view(g.permute(g.view(x, Shape.of(B, 6, 2, 8)), [0, 2, 1, 3]), Shape.of(B * 2, 6, 8))
    k = g.view(g.broadcast(kv, Shape.of(B, 2, 6, 8)), Shape.of(B * 2, 6, 8))
    mask = g.view(g.broadcast(m, Shape.of(B, 2, 6, 6)), Shape.of(B * 2, 6, 6))
    g.add_output(g.attention(q, k, k, mask, None, False), "o")
    for p in check_plan(g, [f32(3, 6, 16), f32(3, 1, 6, 8), f32(3, 1, 6, 6)], 3, optimized=False):
        assert kinds(p) == ["Attention"], str(p)
        (att,) = p.steps
        assert att.k.strides[1] == 0 and att.mask is not None and att.mask.strides[1] == 0
