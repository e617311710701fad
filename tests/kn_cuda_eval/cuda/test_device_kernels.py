"""On a GPU (`-m cuda`): every generated kernel of the tiny graphs and of the transformer fixtures
runs on the device through the CUDA executor and matches the emulator. Skips, saying so, where
there is no CUDA device."""

from __future__ import annotations

import numpy as np
import pytest

from kn_cuda_eval import PlanSettings, emulate, plan
from kn_cuda_eval.cuda.device.calls import pack_args
from kn_cuda_eval.cuda.kernels import FloatArg, IntArg, PtrArg
from kn_graph import BinaryOp, DType, Graph, ReduceOp, Shape, Size, UnaryOp
from kn_graph.optimizer import optimize
from tests.kn_cuda_eval.corpus import FIXTURES, datasets, load
from tests.kn_cuda_eval.helpers import assert_close, need_gpu

B = Size.sym("B")
RNG = np.random.default_rng(9)


def test_marshalling_of_launch_arguments() -> None:
    got = pack_args([PtrArg(256), IntArg(7, 32), IntArg(2**40, 64), FloatArg(0.5)], 1 << 33)
    assert [type(x) for x in got] == [np.uint64, np.int32, np.int64, np.float32]
    assert int(got[0]) == (1 << 33) + 256 and int(got[2]) == 2**40


def run_on_device(p, xs, graphs: bool = False):  # type: ignore[no-untyped-def]
    """Two evaluations (with graphs: a warm-up, then a captured replay); the last one's outputs."""
    from kn_cuda_eval.cuda.device import ExecutorSettings
    from kn_cuda_eval.cuda.device.executor import CudaExecutor

    with CudaExecutor.from_plan(p, settings=ExecutorSettings(cuda_graphs=graphs)) as ex:
        ex.eval(xs)
        return ex.eval(xs)


def _graphs() -> list[tuple[str, Graph, list[np.ndarray], dict]]:
    out = []
    for dt in (DType.F32, DType.F16):
        g = Graph()
        x = g.input(Shape.of(5, 33), dt, "x")
        y = g.permute(g.input(Shape.of(33, 5), dt, "y"), [1, 0])
        for op in (
            UnaryOp.EXP,
            UnaryOp.TANH,
            UnaryOp.GELU,
            UnaryOp.SILU,
            UnaryOp.ERF,
            UnaryOp.SIGMOID,
        ):
            g.add_output(g.unary(op, g.mul(x, 0.5)), op.value)
        for bop in (
            BinaryOp.ADD,
            BinaryOp.DIV,
            BinaryOp.MAX,
            BinaryOp.MOD,
            BinaryOp.POW,
            BinaryOp.LT,
        ):
            g.add_output(
                g.binary(bop, g.unary(UnaryOp.ABS, x), g.add(g.unary(UnaryOp.ABS, y), 0.5)),
                bop.value,
            )
        g.add_output(g.softmax(x, 1), "softmax")
        g.add_output(g.layernorm(g.flip(x, 1), 1, 1e-5), "layernorm")
        for rop in ReduceOp:
            g.add_output(g.reduce(x, [1], rop), rop.value)
        g.add_output(g.gather(x, 1, g.input(Shape.of(4), DType.I64, "i")), "gather")
        g.add_output(g.concat([x, y], 0), "concat")
        xs = [
            RNG.standard_normal((5, 33)).astype(dt.np),
            RNG.standard_normal((33, 5)).astype(dt.np),
            np.array([3, 0, 32, 1]),
        ]
        out.append((f"ops-{dt}", g, xs, {}))
    g = Graph()
    x = g.input(Shape.of(3, 4, 5000), DType.F32, "x")
    g.add_output(g.softmax(x, 2), "s")
    g.add_output(g.reduce(x, [2], ReduceOp.ARGMAX), "a")
    g.add_output(g.layernorm(x, 2, 1e-5), "l")
    out.append(("long-rows", g, [RNG.standard_normal((3, 4, 5000)).astype(np.float32)], {}))
    for causal in (False, True):
        g = Graph()
        q = g.input(Shape.of(4, 9, 64), DType.F32, "q")
        kv = g.input(Shape.of(4, 11, 64), DType.F32, "kv")
        m = g.input(Shape.of(4, 9, 11), DType.F32, "m")
        g.add_output(g.attention(q, kv, kv, m, None, causal), "o")
        xs = [
            RNG.standard_normal(s).astype(np.float32) for s in ((4, 9, 64), (4, 11, 64), (4, 9, 11))
        ]
        out.append((f"attention-causal={causal}", g, xs, {}))
    return out


GRAPHS = _graphs()


@pytest.mark.cuda
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("case", range(len(GRAPHS)), ids=[c[0] for c in GRAPHS])
def test_kernels_on_device_match_the_emulator(case: int, fused: bool) -> None:
    need_gpu()
    _, g, xs, binds = GRAPHS[case]
    for graph in (g, optimize(g)):
        p = plan(graph, bindings=binds, settings=PlanSettings(fused_attention=fused))
        want = emulate(p, xs)
        for graphs in (False, True):
            got = run_on_device(p, xs, graphs)
            for k, (a, b) in enumerate(zip(got, want, strict=True)):
                assert_close(a, b, f"output {k} {graph.output_names[k]} (graphs={graphs})")


TRANSFORMERS = [
    f["name"] for f in FIXTURES if not any(s in f["name"] for s in ("resnet", "mobilenet", "sd_"))
]


@pytest.mark.cuda
@pytest.mark.parametrize("name", TRANSFORMERS)
def test_transformer_fixtures_on_device(name: str) -> None:
    need_gpu()
    g = optimize(load(name))
    for feed, binds in datasets(name):
        p = plan(g, bindings=binds)
        xs = [feed[n] for n in p.input_names]
        for k, (a, b) in enumerate(zip(run_on_device(p, xs), emulate(p, xs), strict=True)):
            assert_close(a, b, f"{name} {binds} output {k}")
