"""Edge values through the fast CPU backend (`Device.cpu()`), checked against the reference
executor: integer division and remainder by 0 and by -1 (INT_MIN / -1 traps on x86), in the
host C prelude, the CUDA prelude run by the host kernel checker, and the CUDA prelude under NVRTC;
NaN and ±inf through activations after a convolution, which oneDNN's post-ops may turn into a
clamp bound (`kn_cuda_eval.cpu.passes.fuse` folds only what its probe finds agreeing).

Kernels that could kill the process with a signal run in a child process, so a regression is one
failing test naming the signal, not a dead test run."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from kn_cuda_eval import PlanSettings, plan
from kn_cuda_eval.cpu import onednn
from kn_cuda_eval.cpu.executor import HostExecutor
from kn_cuda_eval.cpu.passes import fuse
from kn_cuda_eval.cuda.hostcheck import unavailable
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.emulator import emulate_step, view_array
from kn_cuda_eval.planning.emulator_ops import eval_program
from kn_cuda_eval.planning.program import Bin, Const, Load, Program, Un
from kn_cuda_eval.planning.view import StridedView
from kn_graph import DType, Shape
from kn_graph.graph import Graph
from kn_graph.onnx import load_onnx
from kn_graph.ops import BinaryOp, UnaryOp, Value
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_cuda_eval.helpers import assert_close, compile_all
from tests.paths import ROOT

needs_cxx = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))


def _run_child(code: str, *args: str) -> str:
    """Run `code` in a fresh interpreter (argv[1:] = args); its stdout, or a failure that names
    the signal that ended it."""
    r = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    if r.returncode < 0:
        pytest.fail(f"the child died of {signal.Signals(-r.returncode).name}:\n{r.stderr[-2000:]}")
    assert r.returncode == 0, r.stderr[-4000:]
    return r.stdout


# -- integer division and remainder ------------------------------------------------------------
_INT_TYPES = {"int32": TensorProto.INT32, "int64": TensorProto.INT64}
_N = 8 * 8 + 40  # the edge pairs and some ordinary ones


def _division_model(dtype: str, n: int = _N) -> onnx.ModelProto:
    """Div, Mod (fmod=0: the divisor's sign) and Mod (fmod=1: C's remainder) of a by b, and the
    same three by a constant -1 (a divisor the code generator could spell as a literal)."""
    t = _INT_TYPES[dtype]
    minus_one = helper.make_tensor("minus_one", t, [1], [-1])
    nodes = []
    outs = []
    for divisor in ("b", "minus_one"):
        for op, attrs in (("Div", {}), ("Mod", {"fmod": 0}), ("Mod", {"fmod": 1})):
            name = f"{op.lower()}{attrs.get('fmod', '')}_{divisor}"
            nodes.append(helper.make_node(op, ["a", divisor], [name], name=name, **attrs))
            outs.append(helper.make_tensor_value_info(name, t, [n]))
    g = helper.make_graph(
        nodes,
        "int_division",
        [helper.make_tensor_value_info(x, t, [n]) for x in "ab"],
        outs,
        [minus_one],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _edge_operands(dtype: str) -> list[np.ndarray]:
    """Every pair of INT_MIN, INT_MIN + 1, -7, -1, 0, 1, 7, INT_MAX (and a few ordinary values)."""
    info = np.iinfo(dtype)
    edge = np.array([info.min, info.min + 1, -7, -1, 0, 1, 7, info.max], dtype)
    a, b = (x.ravel() for x in np.meshgrid(edge, edge, indexing="ij"))
    rng = np.random.default_rng(3)
    ra, rb = (rng.integers(-1000, 1000, 40).astype(dtype) for _ in range(2))
    return [np.concatenate([a, ra]), np.concatenate([b, rb])]


def _division_graph(dtype: str, n: int = _N) -> Graph:
    g = load_onnx(_division_model(dtype, n).SerializeToString())
    assert isinstance(g, Graph)
    return g


def test_reference_defines_division_by_zero_and_minus_one() -> None:
    """The semantics every backend matches: x / 0 = 0, x % 0 = 0, INT_MIN / -1 wraps to INT_MIN
    (two's complement, as onnxruntime), x % -1 = 0 in both remainder conventions."""
    lo = np.iinfo(np.int32).min
    a = np.array([lo, lo, 7, -7, lo], np.int32)
    b = np.array([-1, 0, 0, -1, 1], np.int32)
    div, mod, fmod, *_ = evaluate(_division_graph("int32", 5), [a, b])
    assert div.tolist() == [lo, 0, 0, 7, lo]
    assert mod.tolist() == [0, 0, 0, 0, 0]
    assert fmod.tolist() == [0, 0, 0, 0, 0]


_FAST_CPU_CHILD = """
import sys
import numpy as np
from kn_graph.onnx import load_onnx
from kn_runtime import Device
model = open(sys.argv[1], "rb").read()
ins = np.load(sys.argv[2])
outs = Device.cpu().prepare(load_onnx(model)).eval([ins["a"], ins["b"]])
np.savez(sys.argv[3], *outs)
"""


@pytest.mark.parametrize("dtype", sorted(_INT_TYPES))
def test_fast_cpu_integer_division_by_zero_and_minus_one(dtype: str, tmp_path: Path) -> None:
    model = tmp_path / "div.onnx"
    model.write_bytes(_division_model(dtype).SerializeToString())
    a, b = _edge_operands(dtype)
    np.savez(tmp_path / "in.npz", a=a, b=b)
    _run_child(_FAST_CPU_CHILD, str(model), str(tmp_path / "in.npz"), str(tmp_path / "out.npz"))
    got = np.load(tmp_path / "out.npz")
    ref = evaluate(_division_graph(dtype), [a, b])
    names = [o.name for o in _division_model(dtype).graph.output]
    for k, (name, r) in enumerate(zip(names, ref, strict=True)):
        assert_close(got[f"arr_{k}"], r, f"{dtype} {name}")


_HOST_CHECK_CHILD = """
import sys
import numpy as np
from kn_cuda_eval import plan
from kn_cuda_eval.cuda.hostcheck import check_plan
from kn_graph.onnx import load_onnx
ins = np.load(sys.argv[2])
checks = check_plan(plan(load_onnx(open(sys.argv[1], "rb").read())), [ins["a"], ins["b"]])
print(len(checks))
for c in checks:
    if c.problem is not None:
        print(c.kernel, c.problem)
"""


@needs_cxx
@pytest.mark.parametrize("dtype", sorted(_INT_TYPES))
def test_host_checked_cuda_integer_division_by_zero_and_minus_one(
    dtype: str, tmp_path: Path
) -> None:
    """The CUDA prelude compiled for the host (the kernel checker) runs the division kernels over
    the edge values and agrees with the emulator (which computes with the reference)."""
    model = tmp_path / "div.onnx"
    model.write_bytes(_division_model(dtype).SerializeToString())
    a, b = _edge_operands(dtype)
    np.savez(tmp_path / "in.npz", a=a, b=b)
    ran, *problems = _run_child(
        _HOST_CHECK_CHILD, str(model), str(tmp_path / "in.npz")
    ).splitlines()
    assert int(ran) >= 1, "no kernel was checked"
    assert problems == []


@pytest.mark.parametrize("dtype", sorted(_INT_TYPES))
def test_cuda_integer_division_kernels_compile_with_nvrtc(dtype: str) -> None:
    assert compile_all(plan(_division_graph(dtype)))


# -- NaN and infinities through activations after a convolution ---------------------------------
_ACTIVATIONS = {
    "relu6": lambda g, c: g.clamp(c, 0.0, 6.0),
    "clamp": lambda g, c: g.clamp(c, -0.5, 0.7),
    "lower bound": lambda g, c: g.maximum(c, -0.25),
    "upper bound": lambda g, c: g.minimum(c, 0.5),
    "silu": lambda g, c: g.silu(c),
    "sigmoid": lambda g, c: g.unary(UnaryOp.SIGMOID, c),
    "tanh": lambda g, c: g.unary(UnaryOp.TANH, c),
    "gelu": lambda g, c: g.gelu(c),
    "gelu tanh": lambda g, c: g.gelu(c, "tanh"),
    "hardswish": lambda g, c: g.mul(c, g.clamp(g.add(g.mul(c, 1.0 / 6.0), 0.5), 0.0, 1.0)),
}


def _conv_act_graph(act, relu_first: bool = False) -> Graph:
    """conv → act → depthwise 1x1 conv by 1: the activation's output is hidden (read by the
    second convolution only), so the executor may fold it into the first; the output is the
    activation's, infinities included."""
    rng = np.random.default_rng(7)
    g = Graph()
    x = g.input(Shape.of(1, 8, 10, 10), DType.F32, "x")
    w1 = g.constant(rng.standard_normal((16, 8, 3, 3)).astype(np.float32))
    ones = g.constant(np.ones((16, 1, 1, 1), np.float32))
    h: Value = g.conv(x, w1, padding=[1, 1])
    if relu_first:
        h = g.relu(h)
    g.add_output(g.conv(act(g, h), ones, groups=16), "y")
    return g


def _special_input() -> np.ndarray:
    x = np.random.default_rng(8).standard_normal((1, 8, 10, 10)).astype(np.float32)
    x[0, 3, 4, 4] = np.nan
    x[0, 5, 0, 7] = np.inf
    x[0, 1, 8, 1] = -np.inf
    return x


def _act_program(s: st.Step) -> st.Elementwise | None:
    return s if isinstance(s, st.Elementwise) and len(s.inputs) == 1 else None


@pytest.mark.parametrize("name", list(_ACTIVATIONS))
def test_fast_cpu_keeps_nan_through_activations_after_a_conv(name: str) -> None:
    g = _conv_act_graph(_ACTIVATIONS[name])
    x = _special_input()
    (ref,) = evaluate(g, [x])
    assert np.isnan(ref).any()
    (got,) = Device.cpu().prepare(g).eval([x])
    assert_close(got, ref, name)


@pytest.mark.parametrize("name", list(_ACTIVATIONS))
def test_activations_fold_exactly_where_the_probe_agrees(name: str) -> None:
    """The executor folds an activation into its convolution iff oneDNN computes it as the
    reference does here: folding is not given up for the activations that keep NaN."""
    p = plan(_conv_act_graph(_ACTIVATIONS[name]))
    ex = HostExecutor(p, 1)
    acts = [(k, s) for k, s in enumerate(p.steps) if _act_program(s) is not None]
    assert len(acts) == 1
    k, act = acts[0]
    assert isinstance(act, st.Elementwise)
    ops = fuse.post_ops(act.program)
    assert ops is not None
    want = onednn.available() is None and fuse.agrees(act.program, ops, DType.F32)
    assert isinstance(ex.steps[k], fuse.Folded) == want
    assert (k - 1 in ex._posts) == want


def test_a_relu_step_folds_only_where_it_keeps_nan() -> None:
    """ReLU planned as its own step (the planner's conv fusion off) reaches the folding as
    oneDNN's eltwise relu, whose JIT form is max(x, 0): NaN becomes 0 where it is folded."""
    g = _conv_act_graph(lambda g, c: g.relu(c))
    x = _special_input()
    (ref,) = evaluate(g, [x])
    p = plan(g, settings=PlanSettings(fuse_conv=False))
    ex = HostExecutor(p, 1)
    folded = any(
        isinstance(s, fuse.Folded) and not isinstance(s.original, st.Copy) for s in ex.steps
    )
    assert folded == (onednn.available() is None and fuse.relu_agrees(DType.F32))
    (got,) = ex.eval([x])
    assert_close(got, ref, "relu step")


def test_the_convolutions_own_relu_keeps_nan() -> None:
    """The planner's conv → relu fusion (`st.Conv.relu`) runs as oneDNN's eltwise relu. Where
    that loses NaN (x86 JIT: max(x, 0)) the CPU backend plans with the relu out of the
    convolution (`host_plan_settings`), an elementwise step of its own."""
    from kn_cuda_eval.cpu.executor import host_plan_settings

    g = _conv_act_graph(lambda g, c: c, relu_first=True)
    x = _special_input()
    (ref,) = evaluate(g, [x])
    prepared = Device.cpu().prepare(g)
    (got,) = prepared.eval([x])
    assert_close(got, ref, "conv relu")
    keeps = onednn.available() is not None or fuse.relu_agrees(DType.F32)
    assert host_plan_settings(g).fuse_conv_relu == keeps
    (ex,) = Device.cpu(threads=1).prepare(g).cache.values()
    convs = [s for s in ex.plan.steps if isinstance(s, st.Conv)]
    assert len(convs) == 2 and convs[0].relu == keeps and not convs[1].relu


_PROBED = {
    "relu": (fuse.ELTWISE["relu"], 0.0, 0.0),
    "relu6": (fuse.ELTWISE["clip_v2"], 0.0, 6.0),
    "silu": (fuse.ELTWISE["swish"], 1.0, 0.0),
    "sigmoid": (fuse.ELTWISE["logistic"], 0.0, 0.0),
    "tanh": (fuse.ELTWISE["tanh"], 0.0, 0.0),
    "gelu": (fuse.ELTWISE["gelu_erf"], 0.0, 0.0),
    "gelu tanh": (fuse.ELTWISE["gelu_tanh"], 0.0, 0.0),
}


@pytest.mark.parametrize("name", list(_PROBED))
def test_a_chain_the_probe_accepts_keeps_nan_in_other_convolutions(name: str) -> None:
    """What the probe accepts holds beyond its own shapes: a ResNet-like 3x3 convolution with a
    bias and a pointwise one, with NaN and ±inf in their outputs, agree with the emulator."""
    post = (_PROBED[name],)
    program = _probe_program(name)
    if onednn.available() is not None or not fuse.agrees(program, post, DType.F32):
        return  # not folded here (covered by the tests above)
    for k, c, side in ((3, 24, 9), (1, 32, 7)):
        a = _ProbeArena()
        xv = a.view((1, c, side, side))
        wv = a.view((c, c, k, k))
        bv = a.view((c,))
        ov = a.view((1, c, side, side))
        step = st.Conv(xv, wv, bv, None, ov, (1, 1), (k // 2,) * 2, (1, 1), 1, False)
        arena = a.make()
        x = view_array(arena, xv)
        x[0, 0, 1, 1], x[0, 2, 4, 4], x[0, 5, side - 1, 0] = np.nan, np.inf, -np.inf
        runner = onednn.conv_runner(step, arena, 1, post=post)
        assert runner is not None
        ref = arena.copy()
        runner()
        emulate_step(ref, 0, step)
        t = view_array(ref, ov)
        want = eval_program(program, [t], [])[program.roots[0]].astype(np.float32)
        assert_close(view_array(arena, ov).copy(), want, f"{name} {k}x{k}")


def _probe_program(name: str) -> Program:
    f = DType.F32
    unary = {
        "silu": UnaryOp.SILU,
        "sigmoid": UnaryOp.SIGMOID,
        "tanh": UnaryOp.TANH,
        "gelu": UnaryOp.GELU,
        "gelu tanh": UnaryOp.GELU_TANH,
    }
    if name in unary:
        return Program((Load(0, f), Un(unary[name], 0, f)), (1,))
    if name == "relu":
        return Program((Load(0, f), Const(0.0, f), Bin(BinaryOp.MAX, 0, 1, f)), (2,))
    return Program(
        (
            Load(0, f),
            Const(6.0, f),
            Bin(BinaryOp.MIN, 0, 1, f),
            Const(0.0, f),
            Bin(BinaryOp.MAX, 2, 3, f),
        ),
        (4,),
    )


class _ProbeArena:
    def __init__(self) -> None:
        self.end = 0
        self.views: list[StridedView] = []

    def view(self, shape: tuple[int, ...]) -> StridedView:
        v = StridedView.dense(self.end, shape, DType.F32)
        self.end += -(-v.nbytes // 256) * 256
        self.views.append(v)
        return v

    def make(self) -> np.ndarray:
        rng = np.random.default_rng(9)
        arena = np.zeros(self.end, np.uint8)
        for v in self.views[:-1]:
            view_array(arena, v)[...] = rng.standard_normal(v.shape)
        return arena
