"""Edge values through the fast CPU backend (`Device.cpu()`), checked against the reference
executor: integer division and remainder by 0 and by -1 (INT_MIN / -1 traps on x86), in the
host C prelude, the CUDA prelude run by the host kernel checker, and the CUDA prelude under NVRTC.

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

from kn_cuda_eval import plan
from kn_cuda_eval.kernels.host import unavailable
from kn_graph.cpu import evaluate
from kn_graph.graph import Graph
from kn_graph.onnx import load_onnx
from tests.cuda_eval.helpers import assert_close, compile_all

needs_cxx = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
ROOT = Path(__file__).resolve().parents[2]


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
from kn_cuda_eval.kernels.host import check_plan
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
