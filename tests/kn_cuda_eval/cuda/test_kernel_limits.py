"""Kernel limits (no GPU): row and attention kernels loop over rows past the grid cap, loop
indices go 64-bit before a 32-bit grid-stride step could wrap, f64 attention runs in double.
Checked by inspecting the launches the planner builds (huge shapes are only planned, never
allocated) and compiling their sources with NVRTC; a shrunk `launch.GRID_CAP` makes the row
loops take several trips at test sizes."""

from __future__ import annotations

import numpy as np
import pytest

from kn_cuda_eval import plan
from kn_cuda_eval.cuda.device.calls import bind
from kn_cuda_eval.cuda.kernels import FloatArg, IntArg, KernelLaunch, launch
from kn_cuda_eval.cuda.kernels.compile import compile_kernel
from kn_cuda_eval.cuda.kernels.dispatch import plan_launches
from kn_graph import DType, Graph, Shape
from kn_graph.ops import ReduceOp
from tests.kn_cuda_eval.helpers import check_plan

ROW_LOOP = (
    "for (kn_idx first = (kn_idx)blockIdx.x * RPB; first < rows; first += (kn_idx)gridDim.x * RPB)"
)
ATTENTION_LOOP = "first < batch * m; first += (kn_idx)gridDim.x * 8)"


def _row_graph(kind: str, rows: int, ncols: int, dt: DType = DType.F32) -> Graph:
    g = Graph()
    x = g.input(Shape.of(rows, ncols), dt, "x")
    match kind:
        case "softmax":
            y = g.softmax(x, 1)
        case "layernorm":
            y = g.layernorm(x, 1, 1e-5)
        case "sum":
            y = g.reduce(x, [1], ReduceOp.SUM)
        case "argmax":
            y = g.reduce(x, [1], ReduceOp.ARGMAX)
    g.add_output(y, "y")
    return g


def _only_launch(g: Graph) -> KernelLaunch:
    (ln,) = plan_launches(plan(g))
    return ln


def _arg(ln: KernelLaunch, name_index: int) -> int:
    ints = [a.value for a in ln.args if isinstance(a, IntArg)]
    return ints[name_index]


def _rows_covered(grid: int, rows_per_block: int, rows: int) -> np.ndarray:
    """How often each row is visited by the row loop of the template (first = block ·
    rows_per_block, stepping by grid · rows_per_block; row = first + group)."""
    seen = np.zeros(rows, np.int64)
    for b in range(grid):
        for first in range(b * rows_per_block, rows, grid * rows_per_block):
            hi = min(first + rows_per_block, rows)
            seen[first:hi] += 1
    return seen


@pytest.mark.parametrize("kind", ["softmax", "layernorm", "sum", "argmax"])
@pytest.mark.parametrize(("ncols", "per_block"), [(8, 8), (4096, 1)])  # a warp / a block per row
def test_row_kernels_past_the_grid_cap_loop_over_rows(
    kind: str, ncols: int, per_block: int
) -> None:
    rows = 2**20 * per_block + 3  # the first sizes whose rows a capped grid used to skip
    ln = _only_launch(_row_graph(kind, rows, ncols))
    assert ln.grid == (2**20, 1, 1) and ln.block == (256, 1, 1)
    assert _arg(ln, 0) == rows and _arg(ln, 1) == ncols
    assert f"#define TPR {256 // per_block}" in ln.kernel.source
    assert ROW_LOOP in ln.kernel.source
    compile_kernel(ln.kernel, 90)


@pytest.mark.parametrize("kind", ["softmax", "layernorm", "sum", "argmax"])
@pytest.mark.parametrize("ncols", [5, 2048])
def test_a_shrunk_grid_cap_makes_the_row_loops_run(
    kind: str, ncols: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((77, ncols)).astype(np.float32)
    g = _row_graph(kind, 77, ncols)
    per_block = 8 if ncols < 2048 else 1
    assert _only_launch(g).grid[0] == -(-77 // per_block)  # the uncapped grid
    monkeypatch.setattr(launch, "GRID_CAP", 3)
    ln = _only_launch(g)
    assert ln.grid == (3, 1, 1)  # read when the launch is built, not at import
    assert (_rows_covered(3, per_block, 77) == 1).all()  # several trips, each row once
    compile_kernel(ln.kernel, 90)
    check_plan(g, [x], optimized=False)


def test_attention_past_the_grid_cap_loops_over_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    g = Graph()
    m = 2**23 + 5  # warp per query row, 8 rows per block
    q = g.input(Shape.of(1, m, 8), DType.F32, "q")
    kv = g.input(Shape.of(1, 4, 8), DType.F32, "kv")
    g.add_output(g.attention(q, kv, kv, None, 0.25, False), "o")
    ln = _only_launch(g)
    assert ln.grid == (2**20, 1, 1) and _arg(ln, 0) * _arg(ln, 2) == m
    assert ATTENTION_LOOP in ln.kernel.source
    compile_kernel(ln.kernel, 90)
    small = Graph()
    q = small.input(Shape.of(2, 37, 8), DType.F32, "q")
    small.add_output(small.attention(q, q, q, None, 0.25, True), "o")
    monkeypatch.setattr(launch, "GRID_CAP", 2)
    ln = _only_launch(small)
    assert ln.grid == (2, 1, 1) and (_rows_covered(2, 8, 2 * 37) == 1).all()
    check_plan(small, [np.random.default_rng(4).standard_normal((2, 37, 8)).astype(np.float32)])


@pytest.mark.parametrize(
    ("n", "wide"),
    [
        (2**31 - 2**28, False),  # the last index plus one full grid stride still fits
        (2**31 - 2**28 + 1, True),  # ... and from here a 32-bit index would wrap negative
        (2**31 - 1, True),
    ],
)
def test_grid_stride_loops_go_64_bit_before_the_index_could_wrap(n: int, wide: bool) -> None:
    g = Graph()
    x = g.input(Shape.of(n), DType.U8, "x")
    g.add_output(g.add(x, x), "y")
    ln = _only_launch(g)
    assert ln.grid == (2**20, 1, 1)
    idx = "long long" if wide else "int"
    assert f"typedef {idx} kn_idx;" in ln.kernel.source
    assert all(a.bits == (64 if wide else 32) for a in ln.args if isinstance(a, IntArg))


def test_row_loops_go_64_bit_with_the_same_rule() -> None:
    for n, idx in [(2**31 - 2**28, "int"), (2**31 - 2**28 + 8, "long long")]:
        ln = _only_launch(_row_graph("sum", n // 8, 8, DType.U8))
        assert f"typedef {idx} kn_idx;" in ln.kernel.source, n


def test_f64_attention_accumulates_in_double() -> None:
    g = Graph()
    q = g.input(Shape.of(2, 6, 40), DType.F64, "q")
    g.add_output(g.attention(q, q, q, None, 1 / 3, False), "o")
    p = plan(g)
    (ln,) = plan_launches(p)
    src = ln.kernel.source
    for decl in ("const double scale", "double acc[DVL]", "double mx", "double dot", "exp(mx"):
        assert decl in src, decl
    assert "float" not in src[src.index('extern "C"') :]  # no f32 anywhere in the kernel
    assert FloatArg(1 / 3, 64) in ln.args  # not rounded to a float
    (call,) = bind(p).calls  # the packed double matches the C parameter (check_kernel_call)
    k = next(i for i, a in enumerate(ln.args) if isinstance(a, FloatArg))
    assert call.packed(0)[k] == np.float64(1 / 3)  # type: ignore[union-attr]
    compile_kernel(ln.kernel, 90)
    f32 = Graph()
    q32 = f32.input(Shape.of(2, 6, 40), DType.F32, "q")
    f32.add_output(f32.attention(q32, q32, q32, None, 1 / 3, False), "o")
    (ln32,) = plan_launches(plan(f32))
    assert "float acc[DVL]" in ln32.kernel.source and FloatArg(1 / 3, 32) in ln32.args
    x = np.random.default_rng(5).standard_normal((2, 6, 40))
    check_plan(g, [x])
