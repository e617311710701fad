"""Adversarial layouts: permuted, broadcast, sliced and flipped operands to every step kind,
size-0 and rank-0 tensors, values with many consumers, and a tensor past 2^31 elements (planned
and compiled, not emulated)."""

from __future__ import annotations

import numpy as np
import pytest

from kn_cuda_eval import PlanSettings, plan
from kn_cuda_eval.cuda.kernels import distinct_kernels
from kn_cuda_eval.cuda.kernels.dispatch import plan_launches
from kn_cuda_eval.planning import steps
from kn_graph import BinaryOp, DType, Graph, ReduceOp, Shape, Size, UnaryOp
from tests.kn_cuda_eval.helpers import check_plan, compile_all

B = Size.sym("B")
RNG = np.random.default_rng(2)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _twisted(g: Graph, x, how: str):
    """x [4, 6, 5] viewed four ways, always ending as a [4, 6, 5] operand."""
    match how:
        case "permuted":  # stored as [5, 6, 4]
            return g.permute(x, [2, 1, 0])
        case "flipped":
            return g.flip(g.flip(x, 0), 2)
        case "sliced":  # every other element of a [4, 12, 5]
            return g.slice(x, 1, 0, None, 2)
        case "broadcast":  # [4, 1, 5] stretched
            return g.broadcast(x, Shape.of(4, 6, 5))
        case _:
            return x


SOURCE = {
    "permuted": (5, 6, 4),
    "flipped": (4, 6, 5),
    "sliced": (4, 12, 5),
    "broadcast": (4, 1, 5),
    "plain": (4, 6, 5),
}
HOWS = list(SOURCE)


def _operand(g: Graph, how: str, name: str = "x"):
    x = g.input(Shape.of(*SOURCE[how]), DType.F32, name)
    return x, _twisted(g, x, how)


@pytest.mark.parametrize("how", HOWS)
def test_elementwise_operand_layouts(how: str) -> None:
    g = Graph()
    _, t = _operand(g, how)
    _, u = _operand(g, "flipped", "y")
    g.add_output(g.add(g.mul(t, u), g.exp(t)), "o")
    check_plan(g, [f32(*SOURCE[how]), f32(*SOURCE["flipped"])])


@pytest.mark.parametrize("how", HOWS)
def test_matmul_operand_layouts(how: str) -> None:
    g = Graph()
    _, t = _operand(g, how)
    w = g.input(Shape.of(4, 5, 3), DType.F32, "w")
    g.add_output(g.matmul(t, w), "a")
    g.add_output(
        g.matmul(g.transpose(t), g.flip(g.input(Shape.of(4, 6, 2), DType.F32, "v"), 1)), "b"
    )
    check_plan(g, [f32(*SOURCE[how]), f32(4, 5, 3), f32(4, 6, 2)])


@pytest.mark.parametrize("how", HOWS)
def test_row_kernel_operand_layouts(how: str) -> None:
    g = Graph()
    _, t = _operand(g, how)
    g.add_output(g.softmax(t, 1), "s")
    g.add_output(g.layernorm(t, 2, 1e-5), "l")
    g.add_output(g.reduce(t, [0, 2], ReduceOp.MAX), "r")
    g.add_output(g.reduce(t, [1], ReduceOp.ARGMIN), "a")
    check_plan(g, [f32(*SOURCE[how])])


@pytest.mark.parametrize("how", HOWS)
def test_gather_and_concat_operand_layouts(how: str) -> None:
    g = Graph()
    _, t = _operand(g, how)
    idx = g.input(Shape.of(6), DType.I64, "i")
    g.add_output(g.gather(t, 1, g.flip(idx, 0)), "g")
    g.add_output(g.concat([t, g.neg(t), g.permute(g.permute(t, [1, 0, 2]), [1, 0, 2])], 1), "c")
    check_plan(g, [f32(*SOURCE[how]), RNG.integers(0, 6, 6)])


@pytest.mark.parametrize("how", HOWS)
def test_attention_operand_layouts(how: str) -> None:
    g = Graph()
    _, t = _operand(g, how)
    q = g.slice(g.input(Shape.of(4, 3, 10), DType.F32, "q"), 2, 0, None, 2)  # [4, 3, 5], stride 2
    g.add_output(g.attention(q, t, t, None, 0.5, False), "o")
    for fused in (True, False):
        check_plan(
            g, [f32(*SOURCE[how]), f32(4, 3, 10)], settings=PlanSettings(fused_attention=fused)
        )


@pytest.mark.parametrize("how", ["permuted", "flipped", "sliced"])
def test_conv_operand_layouts(how: str) -> None:
    g = Graph()
    _, t = _operand(g, how)  # [4, 6, 5] as N=4, C=6, W=5: a 1-d conv
    y = g.conv(t, g.constant(f32(3, 6, 3)), padding=(1,))
    g.add_output(g.relu(g.add(y, g.view(g.constant(f32(3)), Shape.of(3, 1)))), "y")
    (p, _) = check_plan(g, [f32(*SOURCE[how])])
    assert [type(s).__name__ for s in p.steps] == ["Copy", "Conv"]


def test_reshape_of_a_permuted_tensor_copies_once() -> None:
    g = Graph()
    x = g.input(Shape.of(B, 3, 4), DType.F32, "x")
    v = g.view(g.permute(x, [0, 2, 1]), Shape.of(B, 12))
    g.add_output(g.reduce(v, [1], ReduceOp.SUM), "s")
    g.add_output(g.exp(v), "e")
    (p, _) = check_plan(g, [f32(2, 3, 4)], 2)
    assert sum(isinstance(s, steps.Copy) for s in p.steps) == 1


def test_value_with_many_consumers() -> None:
    g = Graph()
    x = g.input(Shape.of(2, 4, 4), DType.F32, "x")
    h = g.unary(UnaryOp.TANH, x)  # used by a matmul, a softmax, an elementwise op and an output
    g.add_output(h, "h")
    g.add_output(g.matmul(h, h), "mm")
    g.add_output(g.softmax(h, 2), "sm")
    g.add_output(g.add(h, g.permute(h, [0, 2, 1])), "sym")
    (p, _) = check_plan(g, [f32(2, 4, 4)])
    assert (
        sum(isinstance(s, steps.Elementwise) and "tanh" in s.program.format() for s in p.steps) == 1
    )


def test_lazy_operands_sharing_some_loads() -> None:
    g = Graph()
    a, b, c = (g.input(Shape.of(7), DType.F32, n) for n in "abc")
    g.add_output(g.add(g.mul(a, b), g.mul(b, c)), "y")  # the second operand shares b, adds c
    check_plan(g, [f32(7), f32(7), f32(7)])


# -- size 0 and rank 0 -------------------------------------------------------------------------------
def test_size_zero_tensors() -> None:
    g = Graph()
    x = g.input(Shape.of(B, 3), DType.F32, "x")
    e = g.input(Shape.of(2, 0), DType.F32, "e")
    g.add_output(g.exp(x), "ex")
    g.add_output(g.reduce(e, [1], ReduceOp.SUM), "sum0")
    g.add_output(g.reduce(e, [1], ReduceOp.MAX), "max0")
    g.add_output(g.reduce(e, [1], ReduceOp.PROD), "prod0")
    g.add_output(g.softmax(x, 1), "sm")
    g.add_output(g.concat([x, g.input(Shape.of(B, 0), DType.F32, "z")], 1), "cat")
    g.add_output(
        g.matmul(g.view(x, Shape.of(1, B, 3)), g.input(Shape.of(1, 3, 0), DType.F32, "w")), "mm0"
    )
    g.add_output(g.gather(x, 1, g.input(Shape.of(0), DType.I64, "i")), "g0")
    xs = [f32(0, 3), f32(2, 0), f32(0, 0), f32(1, 3, 0), np.zeros(0, np.int64)]
    check_plan(g, xs, 0)
    xs[0] = f32(2, 3)
    xs[2] = f32(2, 0)
    check_plan(g, xs, 2)


def test_rank_zero_tensors() -> None:
    g = Graph()
    s = g.input(Shape.of(), DType.F32, "s")
    v = g.input(Shape.of(5), DType.F32, "v")
    total = g.reduce(v, [0], ReduceOp.SUM)  # rank 0
    g.add_output(g.mul(s, total), "p")
    g.add_output(g.add(v, s), "vs")
    g.add_output(s, "same")
    g.add_output(g.reduce(g.view(s, Shape.of(1)), [0], ReduceOp.ARGMAX), "am")
    check_plan(g, [np.array(1.5, np.float32), f32(5)])


def test_output_views_of_inputs_and_constants() -> None:
    g = Graph()
    x = g.input(Shape.of(3, 4), DType.F32, "x")
    g.add_output(g.permute(x, [1, 0]), "xt")
    g.add_output(g.constant(f32(2, 2)), "c")
    g.add_output(g.full(7.0, Shape.of(2, 3), DType.F32), "f")
    check_plan(g, [f32(3, 4)])


# -- past 2^31 elements ------------------------------------------------------------------------------
def test_tensor_past_2_31_elements_is_planned_with_64_bit_indexing() -> None:
    g = Graph()
    x = g.input(Shape.of(B, 65536, 40000), DType.F16, "x")  # 2.6e9 elements at B=1
    y = g.mul(g.exp(x), 2.0)
    g.add_output(y, "y")
    g.add_output(g.reduce(y, [2], ReduceOp.SUM), "r")
    g.add_output(g.softmax(g.slice(y, 2, 0, None, 2), 2), "s")
    p = plan(g, 1)
    p.validate()
    launches = plan_launches(p)
    assert all("typedef long long kn_idx;" in k.kernel.source for k in launches)
    compile_all(p)
    assert len(distinct_kernels(launches)) == 3
    assert p.arena_size > 3 * 2**31
    assert sum(b.size for b in p.buffers) < 4 * 2**33


def test_small_tensors_use_32_bit_indexing() -> None:
    g = Graph()
    x = g.input(Shape.of(4, 4), DType.F32, "x")
    g.add_output(g.binary(BinaryOp.ADD, x, x), "y")
    (launch,) = plan_launches(plan(g))
    assert "typedef int kn_idx;" in launch.kernel.source


@pytest.mark.parametrize(
    ("b", "m", "n", "grouped"),
    [(1, 1, 24, True), (3, 1, 24, True), (1, 1, 1500, True), (2, 40, 24, False)],
)
def test_grouped_query_keys_are_read_in_place(b: int, m: int, n: int, grouped: bool) -> None:
    """Keys and values repeated for grouped-query heads (R query heads per KV head: a broadcast
    over the group viewed as the batch of heads, as GroupQueryAttention's lowering and the
    exporters write it) are read in place: the attention's batch splits as [B·Hkv, R] with
    stride 0 over R, no copy of R times the cache — for a decode step's query row (its
    per-sequence mask copied, one row a head). A prefill's mask would cost more to copy so
    split than the repeats: that plan keeps [B, Hq]. Emulated, compiled for CUDA, and on
    Device.cpu() (at 1500 keys as GEMMs and softmaxes: `passes.attention`), against the
    reference."""
    from kn_graph.reference import evaluate
    from kn_runtime import Device
    from tests.kn_cuda_eval.helpers import assert_close

    hkv, r, d = 2, 3, 16
    heads = b * hkv * r
    g = Graph()
    q = g.input(Shape.of(b, hkv * r, m, d), DType.F32, "q")
    k = g.input(Shape.of(b, hkv, n, d), DType.F32, "k")
    v = g.input(Shape.of(b, hkv, n, d), DType.F32, "v")
    mask = g.input(Shape.of(b, 1, m, n), DType.F32, "mask")

    def repeated(x: object) -> object:  # [B, Hkv, n, d] -> [B·Hkv·R, n, d]
        return g.view(g.repeat_interleave(x, 1, r), Shape.of(heads, n, d))  # type: ignore[arg-type]

    bias = g.view(g.broadcast(mask, Shape.of(b, hkv * r, m, n)), Shape.of(heads, m, n))
    y = g.attention(g.view(q, Shape.of(heads, m, d)), repeated(k), repeated(v), bias, 0.25, False)
    g.add_output(y, "y")  # type: ignore[arg-type]
    rng = np.random.default_rng(b * 100 + m)
    feed = [
        rng.standard_normal((b, hkv * r, m, d)).astype(np.float32),
        rng.standard_normal((b, hkv, n, d)).astype(np.float32),
        rng.standard_normal((b, hkv, n, d)).astype(np.float32),
        np.where(rng.random((b, 1, m, n)) < 0.2, -np.inf, 0.0).astype(np.float32),
    ]
    feed[3][..., 0] = 0.0  # every row sees a key
    feed[1][0, 0, 1, 3] = np.nan  # a NaN key of KV head 0: its R query heads only turn NaN
    feed[3][..., 1] = 0.0
    plans = check_plan(g, feed)
    (att,) = [s for s in plans[-1].steps if isinstance(s, steps.Attention)]  # optimized
    assert (att.k.shape[:2] == (b * hkv, r) and att.k.strides[1] == 0) == grouped, att.describe()
    copied = [
        s for s in plans[-1].steps if isinstance(s, steps.Copy) and s.dst.numel >= heads * n * d
    ]
    assert bool(copied) != grouped, [s.describe() for s in copied]
    prepared = Device.cpu().prepare(g)
    got = prepared.eval(feed)[0]
    assert_close(got, evaluate(g, feed)[0], f"b={b} m={m} n={n}")
    nan_heads = np.isnan(got).any(axis=(1, 2))
    assert nan_heads.tolist() == [h < r for h in range(heads)], nan_heads  # batch row 0, head 0
    if n == 1500:  # R·1500 scores of one shared key head: a GEMM's worth (`MIN_SCORES`)
        from kn_cuda_eval.cpu import onednn

        names = prepared.executor(prepared.check_inputs(feed)).names
        split = any(s.startswith("onednn gemm+softmax") for s in names)
        assert split == (onednn.available() is None), names
