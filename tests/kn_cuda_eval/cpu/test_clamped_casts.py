"""A float cast to a small integer after a clamp by constants (every QuantizeLinear: round, add
the zero point, clamp, cast) is printed without its own saturation (`codegen.printer` follows
the clamp's bounds; `exprs.cast(in_range=True)`), a form the C compiler vectorizes. The values
must not change: NaN → 0, ±inf, the bounds and just past them, and truncation toward zero, on
`Device.cpu()`, the CUDA kernels run by the host kernel checker and NVRTC, against the reference;
a cast whose clamp does not fit the type keeps the saturating form."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kn_cuda_eval import plan
from kn_cuda_eval.cpu.executor import HostExecutor
from kn_cuda_eval.cuda.hostcheck import check_plan, unavailable
from kn_graph import DType, Graph, Shape
from kn_graph.ops import BinaryOp
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_cuda_eval.helpers import compile_all

_EDGES = [np.nan, np.inf, -np.inf, -0.0, 0.4, -0.5, 0.99, 1.0, 126.9, 127.0, 127.5, 128.0]
_EDGES += [-127.9, -128.0, -128.5, -129.0, 254.6, 255.0, 255.9, 256.0, 300.0, -200.0]
_EDGES += [32767.5, 32768.0, -32768.9, 65535.2, 65536.0, 1e9, -1e9]

# (dtype, clamp low, clamp high, short form expected)
_CASES = [
    (DType.U8, 0.0, 255.0, True),
    (DType.I8, -128.0, 127.0, True),
    (DType.U16, 0.0, 65535.0, True),
    (DType.I16, -32768.0, 32767.0, True),
    (DType.I8, 0.0, 100.0, True),  # narrower than the type
    (DType.U8, -5.0, 255.0, False),  # the clamp reaches below the type
    (DType.I32, -5.0, 5.0, False),  # 32 bits: the saturating form always
]


def _graph(n: int) -> Graph:
    """One input per cast, so that no two clamps share a step."""
    g = Graph()
    for k, (dt, lo, hi, _) in enumerate(_CASES):
        x = g.input(Shape.of(n), DType.F32, f"x{k}")
        g.add_output(g.cast(g.minimum(g.maximum(x, lo), hi), dt), f"{dt.name}_{lo:g}_{hi:g}")
    x = g.input(Shape.of(n), DType.F32, "x")
    g.add_output(g.cast(g.add(x, 0.5), DType.U8), "unclamped")
    # a select inside the program, clamped after (the bounds follow every instruction kind)
    s = g.select(g.binary(BinaryOp.GT, x, 0.0), g.mul(x, 2.0), g.neg(x))
    g.add_output(g.cast(g.minimum(g.maximum(s, -3.0), 90.0), DType.I8), "selected")
    return g


def _inputs(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    out = []
    for _ in range(len(_CASES) + 1):
        x = (rng.standard_normal(n) * 200).astype(np.float32)
        x[: len(_EDGES)] = np.array(_EDGES, np.float32)
        out.append(x)
    return out


@pytest.mark.parametrize("n", [len(_EDGES), 100_003])  # one chunk; vector loops and tails
def test_values_match_the_reference_on_the_cpu_backend(n: int) -> None:
    g, xs = _graph(n), _inputs(n)
    got = Device.cpu(threads=2).prepare(g).eval(xs)
    for name, a, b in zip(g.output_names, got, evaluate(g, xs), strict=True):
        assert a.dtype == b.dtype, name
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_the_short_form_is_printed_only_where_the_clamp_fits() -> None:
    ex = HostExecutor(plan(_graph(64)), threads=1)
    src = "\n".join(c.kernel.source for c in ex.calls if c is not None)
    short = sum(1 for _, _, _, s in _CASES if s) + 1  # and the select's
    assert len(re.findall(r"\)\(int\)\((v\d+) != \1 \? 0\.0f : \1\)\)", src)) == short, src
    assert src.count("!= v") >= len(_CASES) + 1  # NaN → 0 in every cast, short or not


@pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
def test_the_cuda_kernels_agree_under_the_host_checker() -> None:
    n = 4099
    checks = check_plan(plan(_graph(n)), _inputs(n))
    assert checks
    assert [c.problem for c in checks if c.problem is not None] == []


def test_the_cuda_kernels_compile_with_nvrtc() -> None:
    assert compile_all(plan(_graph(4099)))
