"""The host executor's layout pass (`kn_cuda_eval.cpu.passes.layouts`): which convolution activations
stay in oneDNN's layout between steps.

Two halves. The pass itself on real plans with stand-in layouts (no oneDNN needed): chains
through convolutions, flat elementwise steps and in-place residuals are kept blocked; anything
read another way (a slice, a plan output; a reduce or a broadcast operand unless the layout is
a permutation such as channels-last, whose strides those steps then take), a layout that
differs or pads, stays plain. Then the executor with oneDNN's real choices on graphs built to stress it,
against the reference executor; where oneDNN is missing, the same graphs check the fallback."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from kn_cuda_eval import plan
from kn_cuda_eval.cpu import onednn
from kn_cuda_eval.cpu.executor import HostExecutor, chain_layout
from kn_cuda_eval.cpu.passes import layouts
from kn_cuda_eval.planning import steps as st
from kn_graph import DType, Graph, ReduceOp, UnaryOp
from kn_graph.ops import BinaryOp
from kn_graph.reference import evaluate
from tests.kn_cuda_eval.helpers import assert_close

HAVE = onednn.available() is None
RNG = np.random.default_rng(7)


@dataclass(frozen=True)
class FakeLayout:
    shape: tuple[int, ...]
    tag: str = "nhwc"
    blocked: bool = True
    dense: bool = True
    order: tuple[int, ...] | None = None  # channels-last as a permutation, when given


@dataclass(frozen=True)
class FakeFormats:
    src: FakeLayout
    dst: FakeLayout


def _w(k: int, c: int, *ks: int) -> np.ndarray:
    return (RNG.standard_normal((k, c, *ks)) * 0.3).astype(np.float32)


def _formats(p: object, **override: FakeFormats) -> dict[int, FakeFormats]:
    steps = p.steps  # type: ignore[attr-defined]
    out: dict[int, FakeFormats] = {}
    for i, k in enumerate(_convs(p)):
        s = steps[k]
        out[k] = override.get(f"c{i}", FakeFormats(FakeLayout(s.x.shape), FakeLayout(s.out.shape)))
    return out


def _convs(p: object) -> list[int]:
    return [k for k, s in enumerate(p.steps) if isinstance(s, st.Conv)]  # type: ignore[attr-defined]


def _chain(tail: str = "mean", c: int = 8) -> Graph:
    """x → conv0+relu → silu → conv1 → conv2 (+ conv1's output, relu) → tail."""
    g = Graph()
    x = g.input((1, c, 10, 10), DType.F32, "x")
    a = g.relu(g.conv(x, g.constant(_w(c, c, 3, 3)), padding=(1, 1)))
    a = g.silu(a)
    b = g.conv(a, g.constant(_w(c, c, 1, 1)))
    y = g.conv(b, g.constant(_w(c, c, 3, 3)), padding=(1, 1))
    y = g.relu(g.binary(BinaryOp.ADD, y, b))
    if tail == "mean":
        g.add_output(g.reduce(y, [2, 3], ReduceOp.MEAN), "y")
    else:
        g.add_output(y, "y")
    return g


def test_a_chain_of_convolutions_stays_blocked_until_a_reduce_reads_it() -> None:
    p = plan(_chain())
    c0, c1, c2 = _convs(p)
    roles = layouts.blocked_roles(p.steps, p.outputs, _formats(p))
    assert roles[c0] == {"out"}  # read by the flat SiLU, whose result conv1 reads
    assert roles[c1] == {"x", "out"}  # read by conv2 as input and as residual
    assert "x" in roles[c2] and "residual" in roles[c2]
    assert "out" not in roles[c2]  # the reduce reads it plain


def test_a_plan_output_stays_plain() -> None:
    p = plan(_chain(tail="output"))
    c2 = _convs(p)[-1]
    roles = layouts.blocked_roles(p.steps, p.outputs, _formats(p))
    assert "out" not in roles.get(c2, set())


def test_a_different_or_padded_layout_breaks_the_chain() -> None:
    p = plan(_chain())
    c0, c1, _ = _convs(p)
    s1 = p.steps[c1]
    other = FakeFormats(FakeLayout(s1.x.shape, tag="nChw16c"), FakeLayout(s1.out.shape))
    roles = layouts.blocked_roles(p.steps, p.outputs, _formats(p, c1=other))
    assert c0 not in roles and "x" not in roles.get(c1, set())
    s0 = p.steps[c0]
    padded = FakeFormats(FakeLayout(s0.x.shape), FakeLayout(s0.out.shape, dense=False))
    roles = layouts.blocked_roles(p.steps, p.outputs, _formats(p, c0=padded))
    assert c0 not in roles
    plain = FakeFormats(FakeLayout(s0.x.shape), FakeLayout(s0.out.shape, blocked=False))
    assert c0 not in layouts.blocked_roles(p.steps, p.outputs, _formats(p, c0=plain))


def test_a_convolution_oneDNN_does_not_run_breaks_the_chain() -> None:
    p = plan(_chain())
    c0, c1, _ = _convs(p)
    fm = _formats(p)
    del fm[c1]  # e.g. an F64 or unimplemented convolution: the emulator's step reads it plain
    roles = layouts.blocked_roles(p.steps, p.outputs, fm)
    assert c0 not in roles and c1 not in roles


def _branchy(kind: str) -> Graph:
    g = Graph()
    x = g.input((1, 8, 6, 6), DType.F32, "x")
    a = g.conv(x, g.constant(_w(8, 8, 3, 3)), padding=(1, 1))
    if kind == "slice":  # a channel slice of the result feeds the next convolution
        b = g.conv(g.slice(a, 1, 0, 4), g.constant(_w(8, 4, 1, 1)))
    elif kind == "broadcast":  # a per-channel scale: not a flat step
        s = g.constant((RNG.standard_normal((1, 8, 1, 1))).astype(np.float32))
        b = g.conv(g.binary(BinaryOp.MUL, a, s), g.constant(_w(8, 8, 1, 1)))
    elif kind == "input":  # a flat step with a plan input as the other operand
        b = g.conv(g.binary(BinaryOp.MUL, a, x), g.constant(_w(8, 8, 1, 1)))
    else:
        raise AssertionError(kind)
    g.add_output(g.reduce(b, [2, 3], ReduceOp.MAX), "y")
    return g


@pytest.mark.parametrize("kind", ["slice", "broadcast", "input"])
def test_a_tensor_read_another_way_stays_plain(kind: str) -> None:
    p = plan(_branchy(kind))
    c0 = _convs(p)[0]
    roles = layouts.blocked_roles(p.steps, p.outputs, _formats(p))
    assert c0 not in roles, [s.describe() for s in p.steps]


def test_flat_steps_are_single_axis_without_indices() -> None:
    p = plan(_chain())
    flat = [s for s in p.steps if layouts.is_flat(s)]
    assert flat and all(isinstance(s, st.Elementwise) and len(s.shape) == 1 for s in flat)
    p = plan(_branchy("broadcast"))
    muls = [s for s in p.steps if isinstance(s, st.Elementwise)]
    assert muls and not any(layouts.is_flat(s) for s in muls)


def test_permuted_views_take_the_strides_of_the_stored_order() -> None:
    """A row-major view of a [2, 3, 4, 5] tensor stored channels-last (N, H, W, C): merged H and
    W keep one stride, merged C and H cannot, a view that is not row-major is refused."""
    from kn_cuda_eval.planning.view import StridedView

    nhwc = (0, 2, 3, 1)  # element strides: N 60, C 1, H 15, W 3
    v = StridedView(0, (2, 3, 20), (60, 20, 1), DType.F32)
    got = layouts.permuted(v, (2, 3, 4, 5), nhwc)
    assert got is not None and got.strides == (60, 1, 3) and got.offset == 0
    assert (
        layouts.permuted(StridedView(0, (2, 12, 5), (60, 5, 1), DType.F32), (2, 3, 4, 5), nhwc)
        is None
    )
    assert (
        layouts.permuted(StridedView(0, (2, 20, 3), (60, 1, 20), DType.F32), (2, 3, 4, 5), nhwc)
        is None
    )
    one = layouts.permuted(StridedView(0, (1, 3, 20), (60, 20, 1), DType.F32), (1, 3, 4, 5), nhwc)
    assert one is not None and one.strides[1:] == (1, 3)


def _se(c: int = 24, batch: int = 1) -> Graph:
    """conv → depthwise conv → mean over H, W → 1x1 convs → sigmoid → scale → conv."""
    g = Graph()
    x = g.input((batch, c, 8, 8), DType.F32, "x")
    a = g.silu(g.conv(x, g.constant(_w(c, c, 1, 1))))
    d = g.silu(g.conv(a, g.constant(_w(c, 1, 3, 3)), padding=(1, 1), groups=c))
    m = g.reduce(d, [2, 3], ReduceOp.MEAN, keepdims=True)
    e = g.silu(g.conv(m, g.constant(_w(c // 4, c, 1, 1))))
    e = g.unary(UnaryOp.SIGMOID, g.conv(e, g.constant(_w(c, c // 4, 1, 1))))
    y = g.conv(g.binary(BinaryOp.MUL, d, e), g.constant(_w(c, c, 1, 1)))
    g.add_output(g.reduce(y, [2, 3], ReduceOp.MAX), "y")
    return g


def test_a_channels_last_chain_takes_a_squeeze_and_excitation_along() -> None:
    """With a permutation layout the mean over H and W and the per-channel scale read the
    depthwise output as stored (their views rewritten), and the scale writes the projection's
    input channels-last; with a layout that is no permutation they break the chain."""
    p = plan(_se())
    convs = _convs(p)
    nhwc = {
        k: FakeFormats(
            FakeLayout(p.steps[k].x.shape[1:2], order=(0, 2, 3, 1)),
            FakeLayout(p.steps[k].out.shape[1:2], order=(0, 2, 3, 1)),
        )
        for k in convs
    }
    # every conv's layouts compare equal when they hold the same channel count
    choice = layouts.choose_layouts(p.steps, p.outputs, nhwc)
    dw, proj = convs[1], convs[-1]
    assert "out" in choice.roles[dw] and "x" in choice.roles[proj]
    reduce_k = next(k for k, s in enumerate(p.steps) if isinstance(s, st.Reduce))
    scale_k = next(  # over [C, H·W], not the squeeze's activations over [C/4]
        k
        for k, s in enumerate(p.steps)
        if isinstance(s, st.Elementwise) and k > reduce_k and len(s.shape) == 2
    )
    for k in (reduce_k, scale_k):
        assert k in choice.views, [s.describe() for s in p.steps]
        for new in choice.views[k].values():
            assert 1 in new.strides and 24 in new.strides  # C innermost, H·W at a stride of C
    plain = {
        k: FakeFormats(FakeLayout(f.src.shape), FakeLayout(f.dst.shape)) for k, f in nhwc.items()
    }
    roles = layouts.blocked_roles(p.steps, p.outputs, plain)
    assert "out" not in roles.get(dw, set())


# -- the executor with oneDNN's own layouts ----------------------------------------------------


def _graph(case: str) -> tuple[Graph, list[np.ndarray]]:
    if case == "chain 8 channels":
        g = _chain()
        shape: tuple[int, ...] = (1, 8, 10, 10)
    elif case == "chain 24 channels (nChw16c would pad)":
        g = _chain(c=24)
        shape = (1, 24, 10, 10)
    elif case == "chain to a plan output":
        g = _chain(tail="output")
        shape = (1, 8, 10, 10)
    elif case in ("1-d", "3-d"):
        nd = 1 if case == "1-d" else 3
        sp = (9,) if nd == 1 else (5, 4, 6)
        g = Graph()
        x = g.input((2, 6, *sp), DType.F32, "x")
        a = g.relu(g.conv(x, g.constant(_w(16, 6, *(3,) * nd)), padding=(1,) * nd))
        b = g.conv(a, g.constant(_w(16, 16, *(1,) * nd)))
        y = g.relu(g.binary(BinaryOp.ADD, b, a))
        y = g.conv(y, g.constant(_w(4, 16, *(3,) * nd)), padding=(1,) * nd, stride=(2,) * nd)
        g.add_output(y, "y")
        shape = (2, 6, *sp)
    elif case == "depthwise and clip between":
        g = Graph()
        x = g.input((1, 24, 12, 12), DType.F32, "x")
        a = g.conv(x, g.constant(_w(48, 24, 1, 1)))
        a = g.minimum(g.relu(a), 6.0)  # ReLU6
        d = g.conv(a, g.constant(_w(48, 1, 3, 3)), padding=(1, 1), groups=48)
        d = g.unary(UnaryOp.SIGMOID, d)
        y = g.conv(d, g.constant(_w(24, 48, 1, 1)))
        g.add_output(g.binary(BinaryOp.ADD, y, x), "y")
        shape = (1, 24, 12, 12)
    elif case == "branchy":
        g = _branchy("slice")
        shape = (1, 8, 6, 6)
    elif case.startswith("squeeze and excitation"):
        batch = 2 if "batch 2" in case else 1
        g = _se(24, batch)
        shape = (batch, 24, 8, 8)
    else:
        raise AssertionError(case)
    return g, [RNG.standard_normal(shape).astype(np.float32)]


CASES = [
    "chain 8 channels",
    "chain 24 channels (nChw16c would pad)",
    "chain to a plan output",
    "1-d",
    "3-d",
    "depthwise and clip between",
    "branchy",
    "squeeze and excitation",
    "squeeze and excitation, batch 2",
]


@pytest.mark.parametrize("optimized", [False, True], ids=["unoptimized", "optimized"])
@pytest.mark.parametrize("case", CASES)
def test_blocked_chains_match_the_reference(case: str, optimized: bool) -> None:
    from kn_graph.optimizer import optimize

    g, feed = _graph(case)
    if optimized:
        g = optimize(g)
    ex = HostExecutor(plan(g), threads=2)
    for got, ref in zip(ex.eval(feed), evaluate(g, feed), strict=True):
        assert_close(got, ref, case)
    if case == "branchy":
        return
    # the pass found a chain wherever oneDNN runs the convolutions
    assert bool(ex.blocked) == HAVE, (case, ex.blocked)
    if HAVE:
        assert any("blocked" in n for n in ex.names), ex.names
    if HAVE and case == "squeeze and excitation":
        # channels last (AVX-512) is a permutation the pooling reads in place: the depthwise
        # output stays in it; nChw8c (AVX2) is not, so that output is written plain
        want = "x,out blocked" if chain_layout() == "nhwc" else "(x blocked)"
        dw = [k for k, s in enumerate(ex.steps) if isinstance(s, st.Conv) and s.groups > 1]
        assert dw and all(want in ex.names[k] for k in dw), ex.names


def test_the_chain_layout_follows_the_vector_width_onednn_reports() -> None:
    """nChw8c where oneDNN runs AVX2 kernels (asked of the library, as ONEDNN_MAX_CPU_ISA caps
    it, never assumed from this machine), channels last where it runs AVX-512."""
    if not HAVE:
        assert onednn.has_avx512() is None and chain_layout() == "nhwc"
        return
    assert chain_layout() == ("nhwc" if onednn.has_avx512() else "c8")
    code = (
        "from kn_cuda_eval.cpu import onednn\n"
        "from kn_cuda_eval.cpu.executor import chain_layout\n"
        "print(onednn.has_avx512(), chain_layout())\n"
    )
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "c8"]


def test_resnet_fixture_runs_every_block_in_oneDNN_layout() -> None:
    from tests.kn_cuda_eval.corpus import cases

    for graph, feed, binds in cases("resnet18_ts"):
        ex = HostExecutor(plan(graph, bindings=binds), threads=2)
        for got, ref in zip(ex.eval(feed), evaluate(graph, feed), strict=True):
            assert_close(got, ref, f"resnet18_ts {binds}")
        if not HAVE:
            assert not ex.blocked
            continue
        # the runners' scratchpads and reorder buffers (the stem's output goes to NCHW for the
        # pool) share one block: smaller than their sum, as large as the largest runner's
        ws = ex._ws
        assert ws is not None and 0 < ws.size < ws.requested, (ws.size, ws.requested)
        steps = ex.plan.steps
        convs = [k for k, s in enumerate(steps) if isinstance(s, st.Conv)]
        # every convolution reads its input blocked but the stem and maybe the first after
        # the max pool, and all but the last write blocked. The pool (an elementwise max over
        # shifted views of the stem's plain output) writes channels-last as a strided writer
        # at batch 1; at batch 3 its view merges N and C, which channels-last cannot express,
        # and nChw8c (the AVX2 chain layout) is no permutation a strided writer can take
        assert "x" not in ex.blocked.get(convs[0], ())
        assert all("x" in ex.blocked.get(k, ()) for k in convs[2:]), ex.blocked
        assert all("out" in ex.blocked.get(k, ()) for k in convs[1:-1]), ex.blocked
        pooled = "x" in ex.blocked.get(convs[1], ())
        assert pooled == (binds.get("B") == 1 and chain_layout() == "nhwc"), (binds, ex.blocked)
        # every residual is read blocked, the first block's (the pool's output) as conv 1 is
        residuals = [k for k in convs if steps[k].residual is not None]
        assert len(residuals) > 2 and ("residual" in ex.blocked[residuals[0]]) == pooled
        assert all("residual" in ex.blocked[k] for k in residuals[1:]), ex.blocked


# -- activations folded into the convolution (`kn_cuda_eval.cpu.passes.fuse`) -----------------------

F32 = DType.F32


def _prog(*instrs: object) -> object:
    from kn_cuda_eval.planning.program import Program

    return Program(tuple(instrs), (len(instrs) - 1,))  # type: ignore[arg-type]


def test_activation_programs_map_to_oneDNN_eltwise_ops() -> None:
    from kn_cuda_eval.cpu.passes import fuse
    from kn_cuda_eval.planning.program import Bin, Const, Load, Un

    E = fuse.ELTWISE
    ld = Load(0, F32)
    assert fuse.post_ops(_prog(ld, Un(UnaryOp.SILU, 0, F32))) == ((E["swish"], 1.0, 0.0),)
    relu6 = _prog(ld, Const(0.0, F32), Bin(BinaryOp.MAX, 0, 1, F32), Const(6.0, F32),
                  Bin(BinaryOp.MIN, 3, 2, F32))  # fmt: skip
    assert fuse.post_ops(relu6) == ((E["clip_v2"], 0.0, 6.0),)  # type: ignore[arg-type]
    relu = _prog(ld, Const(0.0, F32), Bin(BinaryOp.MAX, 1, 0, F32))
    assert fuse.post_ops(relu) == ((E["relu"], 0.0, 0.0),)  # type: ignore[arg-type]
    # min then max: clamp(x, -inf, 6) then max(., 1) = clamp(x, 1, 6)
    mm = _prog(ld, Const(6.0, F32), Bin(BinaryOp.MIN, 0, 1, F32), Const(1.0, F32),
               Bin(BinaryOp.MAX, 2, 3, F32))  # fmt: skip
    assert fuse.post_ops(mm) == ((E["clip_v2"], 1.0, 6.0),)  # type: ignore[arg-type]
    gelu_then_clip = _prog(ld, Un(UnaryOp.GELU, 0, F32), Const(2.0, F32),
                           Bin(BinaryOp.MIN, 1, 2, F32))  # fmt: skip
    assert fuse.post_ops(gelu_then_clip) == (  # type: ignore[arg-type]
        (E["gelu_erf"], 0.0, 0.0),
        (E["clip_v2"], -np.inf, 2.0),
    )
    # ONNX HardSwish: x · clamp(x/6 + 1/2, 0, 1), the clamp's two sides in either order
    hswish = _prog(ld, Const(1 / 6, F32), Bin(BinaryOp.MUL, 0, 1, F32), Const(0.5, F32),
                   Bin(BinaryOp.ADD, 3, 2, F32), Const(1.0, F32), Bin(BinaryOp.MIN, 4, 5, F32),
                   Const(0.0, F32), Bin(BinaryOp.MAX, 7, 6, F32),
                   Bin(BinaryOp.MUL, 8, 0, F32))  # fmt: skip
    assert fuse.post_ops(hswish) == ((E["hardswish"], 1 / 6, 0.5),)  # type: ignore[arg-type]
    not_hswish = _prog(ld, Const(1 / 6, F32), Bin(BinaryOp.MUL, 0, 1, F32), Const(0.5, F32),
                       Bin(BinaryOp.ADD, 3, 2, F32), Const(6.0, F32), Bin(BinaryOp.MIN, 4, 5, F32),
                       Const(0.0, F32), Bin(BinaryOp.MAX, 7, 6, F32),
                       Bin(BinaryOp.MUL, 8, 0, F32))  # fmt: skip
    for bad in (
        not_hswish,  # clamped to [0, 6], not [0, 1]: not a hard-swish
        _prog(ld, Un(UnaryOp.EXP, 0, F32)),  # not one oneDNN post-op here
        _prog(ld, Load(1, F32), Bin(BinaryOp.MAX, 0, 1, F32)),  # a second operand
        _prog(ld, Const(1.0, F32), Bin(BinaryOp.ADD, 0, 1, F32)),
        _prog(ld, Const(float("nan"), F32), Bin(BinaryOp.MAX, 0, 1, F32)),
    ):
        assert fuse.post_ops(bad) is None, bad  # type: ignore[arg-type]


def _act_graph(kind: str, keep_x: bool = True) -> Graph:
    g = Graph()
    x = g.input((1, 16, 9, 9), DType.F32, "x")
    t = g.conv(x, g.constant(_w(32, 16, 3, 3)), padding=(1, 1))
    if kind == "silu":
        y = g.silu(t)
    elif kind == "relu6":
        y = g.minimum(g.relu(t), 6.0)
    elif kind == "gelu":
        y = g.gelu(t)
    elif kind == "silu, conv output read again":
        y = g.mul(g.silu(t), t)
    else:
        raise AssertionError(kind)
    z = g.conv(y, g.constant(_w(8, 32, 1, 1)))
    g.add_output(g.reduce(z, [2, 3], ReduceOp.MEAN), "z")
    if keep_x:  # x read at the end: y cannot take x's bytes (else see the ping-pong test)
        g.add_output(g.reduce(x, [2, 3], ReduceOp.MAX), "x_max")
    else:  # y also read by a compiled step (it must read y where it moved)
        g.add_output(g.reduce(y, [1], ReduceOp.MAX), "y_max")
    return g


def _agrees(p: object, k: int) -> bool:
    """Whether step k of plan p is an activation oneDNN computes as the reference does on this
    machine, NaN included (`fuse.agrees`): only those fold."""
    from kn_cuda_eval.cpu.passes import fuse

    s = p.steps[k]  # type: ignore[attr-defined]
    ops = fuse.post_ops(s.program) if isinstance(s, st.Elementwise) else None
    return ops is not None and fuse.agrees(s.program, ops, s.outputs[0].dtype)


@pytest.mark.parametrize("kind", ["silu", "relu6", "gelu", "silu, conv output read again"])
def test_activations_folded_into_the_convolution_match_the_reference(kind: str) -> None:
    g = _act_graph(kind)
    feed = [(RNG.standard_normal((1, 16, 9, 9)) * 3).astype(np.float32)]
    p = plan(g)
    ex = HostExecutor(p, threads=2)
    for got, ref in zip(ex.eval(feed), evaluate(g, feed), strict=True):
        assert_close(got, ref, kind)
    folded = [s for s in ex.steps if not isinstance(s, st.Step.__args__)]  # type: ignore[attr-defined]
    want = HAVE and kind != "silu, conv output read again" and _agrees(p, _convs(p)[0] + 1)
    assert bool(folded) == want, [s.describe() for s in ex.steps]
    if want:
        assert any("+act" in n for n in ex.names) and "folded into step" in " ".join(ex.names)


def test_mobilenet_fixture_folds_its_relu6_where_it_keeps_nan() -> None:
    from tests.kn_cuda_eval.corpus import cases

    for graph, feed, binds in cases("mobilenetv2_ts"):
        p = plan(graph, bindings=binds)
        ex = HostExecutor(p, threads=2)
        for got, ref in zip(ex.eval(feed), evaluate(graph, feed), strict=True):
            assert_close(got, ref, f"mobilenetv2_ts {binds}")
        n = sum("folded into step" in name for name in ex.names)
        after_conv = [k + 1 for k in _convs(p) if k + 1 < len(p.steps)]
        assert (n > 0) == (HAVE and any(_agrees(p, k) for k in after_conv)), ex.names


def test_an_activation_over_the_convolutions_input_moves_to_a_scratch_slot() -> None:
    """The planner's ping-pong: y = silu(conv(x)) takes x's bytes, which the convolution still
    reads; folded, the result goes to a slot past the arena and y's readers read it there."""
    from kn_cuda_eval.cpu.passes import fuse

    g = _act_graph("silu", keep_x=False)
    p = plan(g)
    c0 = _convs(p)[0]
    act = p.steps[c0 + 1]
    assert isinstance(act, st.Elementwise)
    x = p.steps[c0].x
    assert act.outputs[0].byte_extent()[0] < x.byte_extent()[1]  # the overlap this is about
    steps, posts, used = fuse.fold_activations(p.steps, p.outputs, _convs(p), p.arena_size)
    folds = HAVE and _agrees(p, c0 + 1)  # oneDNN usable here, and its SiLU keeps NaN
    assert (c0 in posts) == folds
    if folds:
        assert used >= p.steps[c0].out.nbytes
        assert steps[c0].out.offset >= p.arena_size  # type: ignore[union-attr]
        assert steps[c0 + 2].x.offset == steps[c0].out.offset  # type: ignore[union-attr]
    feed = [(RNG.standard_normal((1, 16, 9, 9)) * 3).astype(np.float32)]
    ex = HostExecutor(p, threads=2)
    for _ in range(2):
        for got, ref in zip(ex.eval(feed), evaluate(g, feed), strict=True):
            assert_close(got, ref, "moved")
    assert (ex.arena.size > p.arena_size) == folds


def test_a_moved_activation_may_be_partly_overwritten_once_dead() -> None:
    """`fuse._moved` (the scratch slot's readers): y's reads move to the slot while y lives; a
    later step writing part of y's bytes after its last read ends it (EfficientNet: the
    projection's smaller output over the depthwise activation's bytes), but not while the rest
    of y is still read."""
    from kn_cuda_eval.cpu.passes import fuse
    from kn_cuda_eval.planning.view import StridedView

    f32 = DType.F32
    y = StridedView.dense(0, (1024,), f32)
    read = st.Copy(y, StridedView.dense(8192, (1024,), f32))  # reads y
    part = st.Copy(StridedView.dense(16384, (16,), f32), StridedView.dense(0, (16,), f32))
    tail = st.Copy(StridedView.dense(64, (16,), f32), StridedView.dense(20480, (16,), f32))
    slot = 100_000
    got = fuse._moved([read, read, part], [], 0, y, slot)
    assert got is not None
    steps_, last = got
    assert last == 1 and steps_[0].src.offset == slot  # type: ignore[union-attr]
    assert steps_[1] == part  # after y's life: unchanged
    # the rest of y is read after the partial write: y still lives, so no move
    assert fuse._moved([read, read, part, tail], [], 0, y, slot) is None
