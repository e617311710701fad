"""Generated kernels executed on the CPU (kn_cuda_eval.cuda.hostcheck): the CUDA semantics of the
host header (fibers at barriers, lockstep warps, f16 rounding, launch checks), the disk cache,
deliberately wrong kernels reported as mismatches, and `host_check` over the built-in small-grid
cases and the whole test corpus."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys
from collections.abc import Callable
from contextlib import redirect_stdout

import numpy as np
import pytest

from kn_cuda_eval import plan
from kn_cuda_eval.cuda.hostcheck import check as hk
from kn_cuda_eval.cuda.hostcheck import check_plan, run_launch, unavailable
from kn_cuda_eval.cuda.hostcheck import compile as hb
from kn_cuda_eval.cuda.hostcheck import sweep as hc
from kn_cuda_eval.cuda.kernels import FloatArg, IntArg, Kernel, KernelLaunch, PtrArg, launch
from kn_cuda_eval.cuda.kernels.dispatch import plan_launches
from kn_cuda_eval.planning import steps
from kn_cuda_eval.planning.emulator import load_arena
from kn_cuda_eval.planning.plan import Plan
from kn_graph import DType, Graph, ReduceOp, Shape
from kn_graph.errors import EvaluationError, KernelCompileError
from tests.paths import ROOT

needs_cxx = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
RNG = np.random.default_rng(5)


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _kernel(name: str, body: str, params: str) -> Kernel:
    src = f'#include <cuda_fp16.h>\nextern "C" __global__ void {name}({params})\n{{\n{body}\n}}\n'
    return Kernel(name, src)


def _launch(k: Kernel, args: tuple, grid: int = 1, block: int = 64) -> KernelLaunch:
    return KernelLaunch(k, (grid, 1, 1), (block, 1, 1), 0, args)


# -- the header's CUDA semantics -------------------------------------------------------------------
@needs_cxx
def test_barriers_and_shuffles_run_in_lockstep() -> None:
    """Each thread writes its index to shared memory, meets the block, reads its neighbour's; then
    a butterfly sum over each warp and a ballot of the odd lanes."""
    k = _kernel(
        "kn_t_lockstep",
        """    __shared__ int sh[64];
    const int t = threadIdx.x;
    sh[t] = t * 10;
    __syncthreads();
    int v = sh[(t + 1) % 64];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    out[t] = v;
    out[64 + t] = (int)__ballot_sync(0xffffffffu, t & 1);
    out[128 + t] = __shfl_down_sync(0xffffffffu, t, 3) + 1000 * blockIdx.x;""",
        "int* out",
    )
    arena = np.zeros(3 * 64 * 4, np.uint8)
    run_launch(_launch(k, (PtrArg(0),)), arena)
    got = arena.view(np.int32)
    nb = (np.arange(64) + 1) % 64 * 10
    sums = np.repeat([nb[:32].sum(), nb[32:].sum()], 32)
    assert (got[:64] == sums).all()
    assert (got[64:128].astype(np.uint32) == 0xAAAAAAAA).all()
    lane = np.arange(64) % 32
    assert (got[128:] == np.where(lane + 3 < 32, np.arange(64) + 3, np.arange(64))).all()


@needs_cxx
@pytest.mark.parametrize(
    "body,message",
    [
        (  # half of each warp waits for the other half at __syncwarp, which waits at the block
            "if (threadIdx.x % 32 < 16) __syncwarp(); else __syncthreads();\n    out[threadIdx.x] = 1;",
            "deadlock",
        ),
        (
            "if (threadIdx.x == 0) return;\n    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1, 1);",
            "exited",
        ),
    ],
    ids=["barriers that never meet", "shuffle naming an exited lane"],
)
def test_undefined_behaviour_is_reported(body: str, message: str) -> None:
    k = _kernel(f"kn_t_ub_{message[:4]}", "    " + body, "int* out")
    with pytest.raises(EvaluationError, match=message):
        run_launch(_launch(k, (PtrArg(0),)), np.zeros(256, np.uint8))


@needs_cxx
def test_half_conversions_round_to_nearest_even() -> None:
    k = _kernel(
        "kn_t_half",
        """    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        hf[i] = __float2half(xf[i]);
        hd[i] = __double2half(xd[i]);
        back[i] = __half2float(hf[i]);
    }""",
        "const int n, const float* xf, const double* xd, half* hf, half* hd, float* back",
    )
    ties = (np.arange(-2048, 2048, dtype=np.float64) + 0.5) * 2.0**-10  # halfway between halves
    special = [0.0, -0.0, 65504, 65519.9, 65520, 1e6, -1e6, 2.0**-25, 3 * 2.0**-26, 6e-8, 1e-30]
    xd = np.concatenate([ties, special, RNG.standard_normal(3000) * 100, [np.inf, -np.inf]])
    xd = np.concatenate([xd, np.nextafter(xd, np.inf), np.nextafter(xd, -np.inf)])
    with np.errstate(over="ignore"):
        xf = xd.astype(np.float32)
        want_f, want_d = xf.astype(np.float16), xd.astype(np.float16)
    n = xd.size
    offs = np.cumsum([0, 4 * n, 8 * n, 2 * n, 2 * n, 4 * n])
    arena = np.zeros(int(offs[-1]), np.uint8)
    arena[offs[0] : offs[1]] = xf.view(np.uint8)
    arena[offs[1] : offs[2]] = xd.view(np.uint8)
    args = (IntArg(n, 32), *(PtrArg(int(o)) for o in offs[:-1]))
    run_launch(_launch(k, args, block=256), arena)
    hf = arena[offs[2] : offs[3]].view(np.float16)
    hd = arena[offs[3] : offs[4]].view(np.float16)
    assert (hf.view(np.uint16) == want_f.view(np.uint16)).all()
    assert (hd.view(np.uint16) == want_d.view(np.uint16)).all()
    assert (arena[offs[4] :].view(np.float32) == want_f.astype(np.float32)).all()


@needs_cxx
def test_launches_are_checked_against_the_kernel() -> None:
    k = _kernel(
        "kn_t_args", "    out[threadIdx.x] = n * s;", "const int n, const float s, float* out"
    )
    arena = np.zeros(1024, np.uint8)
    good = (IntArg(3, 32), FloatArg(0.5), PtrArg(0))
    run_launch(_launch(k, good), arena)
    assert (arena[:256].view(np.float32) == 1.5).all()
    with pytest.raises(EvaluationError, match="takes parameters 'ifp', the launch passes 'lfp'"):
        run_launch(_launch(k, (IntArg(3, 64), *good[1:])), arena)
    bounded = dataclasses.replace(k, source=k.source.replace("void", "void __launch_bounds__(64)"))
    with pytest.raises(EvaluationError, match="launch bounds allow 64"):
        run_launch(_launch(bounded, good, block=128), arena)


@needs_cxx
def test_host_objects_are_cached_on_disk(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KN_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(hb, "_loaded", {})
    k = _kernel("kn_t_cached", "    out[threadIdx.x] = 7;", "int* out")
    first = hb.build(k)
    assert first.path.is_relative_to(tmp_path / "host")
    hb._loaded.clear()
    monkeypatch.setattr(hb, "_compile", lambda *a: pytest.fail("should come from the disk cache"))
    assert hb.build(k).path == first.path


@needs_cxx
def test_compile_errors_carry_the_numbered_source(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("KN_KERNEL_CACHE", str(tmp_path))
    bad = Kernel(
        "kn_t_broken", 'extern "C" __global__ void kn_t_broken() {\n    this is not C;\n}\n'
    )
    with pytest.raises(KernelCompileError) as e:
        hb.build(bad)
    assert "--- log ---" in str(e.value) and "   2      this is not C;" in str(e.value)


def test_no_compiler_skips_with_one_line(monkeypatch) -> None:
    monkeypatch.setattr(hb, "compiler", lambda: None)
    out = io.StringIO()
    with redirect_stdout(out):
        assert hc.main([]) == 0
    assert out.getvalue().count("\n") == 1 and "no C++ compiler" in out.getvalue()


# -- a wrong kernel is a mismatch ------------------------------------------------------------------
def _mutate(monkeypatch, old: str, new: str) -> None:
    """Every launch the checker builds runs a kernel with `old` replaced by `new`."""
    real: Callable = hk.launch_for

    def wrong(step, status):
        ln = real(step, status)
        if ln is None or old not in ln.kernel.source:
            return ln
        return dataclasses.replace(
            ln, kernel=Kernel(ln.kernel.name, ln.kernel.source.replace(old, new, 1))
        )

    monkeypatch.setattr(hk, "launch_for", wrong)


def _problems(p: Plan, inputs: list[np.ndarray]) -> list[str]:
    return [c.problem for c in check_plan(p, inputs) if c.problem is not None]


@needs_cxx
def test_a_flipped_operator_is_a_mismatch(monkeypatch) -> None:
    g = Graph()
    a, b = (g.input(Shape.of(40, 30), DType.F32, n) for n in "ab")
    g.add_output(g.add(g.mul(a, b), a), "y")
    p = plan(g)
    xs = [f32(40, 30), f32(40, 30)]
    assert _problems(p, xs) == []
    _mutate(monkeypatch, "(v0 * v1)", "(v0 / v1)")
    (why,) = _problems(p, xs)
    assert "max relative difference" in why


@needs_cxx
@pytest.mark.parametrize(
    "old,new",
    [
        ("o > 0; o >>= 1) v = f(", "o > 1; o >>= 1) v = f("),  # the last butterfly step
        ("first += (kn_idx)gridDim.x * RPB", "first += (kn_idx)gridDim.x * RPB * 2"),  # rows
    ],
    ids=["short warp reduction", "row loop skipping rows"],
)
def test_a_wrong_row_kernel_is_a_mismatch(monkeypatch, old: str, new: str) -> None:
    monkeypatch.setattr(launch, "GRID_CAP", 8)  # 300 rows: 8 blocks of 8 rows loop 5 times
    g = Graph()
    x = g.input(Shape.of(300, 40), DType.F32, "x")
    g.add_output(g.reduce(x, [1], ReduceOp.SUM), "r")
    p = plan(g)
    assert plan_launches(p)[0].grid == (8, 1, 1)
    assert _problems(p, [f32(300, 40)]) == []
    _mutate(monkeypatch, old, new)
    assert _problems(p, [f32(300, 40)])


@needs_cxx
def test_a_write_outside_the_outputs_is_a_mismatch(monkeypatch) -> None:
    g = Graph()
    x = g.input(Shape.of(10), DType.F32, "x")
    y = g.exp(x)
    g.add_output(y, "e")
    g.add_output(g.softmax(g.view(y, Shape.of(2, 5)), 1), "s")
    p = plan(g)
    assert _problems(p, [f32(10)]) == []
    (ew,) = (s.outputs[0] for s in p.steps if isinstance(s, steps.Elementwise))
    assert ew.offset + ew.nbytes + 4 <= p.arena_size  # one element past it is still the arena
    _mutate(monkeypatch, "out0[i] = ", "if (i == 0) out0[n] = 1.0f;\n        out0[i] = ")
    (why,) = _problems(p, [f32(10)])
    assert "outside the step's outputs differ" in why, why


@needs_cxx
def test_the_arena_is_the_emulators() -> None:
    g = Graph()
    x = g.input(Shape.of(3, 4), DType.F32, "x")
    g.add_output(g.mul(g.permute(x, [1, 0]), 2.0), "y")
    p = plan(g)
    xs = [f32(3, 4)]
    arena = load_arena(p, xs)
    run_launch(plan_launches(p)[0], arena)
    out = p.outputs[0]
    got = arena[out.offset : out.offset + out.nbytes].view(np.float32).reshape(4, 3)
    assert (got == xs[0].T * 2).all()


# -- host_check ------------------------------------------------------------------------------------
def _run_main(argv: list[str]) -> tuple[int, list[str]]:
    out = io.StringIO()
    with redirect_stdout(out):
        rc = hc.main(argv)
    return rc, out.getvalue().splitlines()


@needs_cxx
def test_host_check_builtin_cases_past_the_grid_cap() -> None:
    cases = hc.builtin_cases()
    looped = [c.label for c in cases if any(ln.grid[0] == hc.SMALL_CAP for ln in c.launches())]
    assert len(looped) == len(cases), "every built-in case loops past the capped grid"
    rc, lines = _run_main([])
    n = len({ln.kernel.source for c in cases for ln in c.launches()})
    assert lines[-1] == f"kernels executed on the host: {n}/{n} match", lines
    assert rc == 0


@needs_cxx
@pytest.mark.slow
def test_host_check_corpus() -> None:
    """The CLI as CI runs it, from the repository root, in its own process (harvesting the
    planner tests draws from their modules' random generators; this session's stay untouched):
    every distinct kernel of the fixture corpus and the planner tests, about 570."""
    root = ROOT
    res = subprocess.run(
        [sys.executable, "-m", "kn_cuda_eval.cuda.hostcheck.sweep", "--corpus"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    lines = res.stdout.splitlines()
    assert lines, res.stderr[-3000:]
    last = lines[-1]
    assert last.startswith("kernels executed on the host: "), (last, res.stderr[-3000:])
    m, n = last.removeprefix("kernels executed on the host: ").removesuffix(" match").split("/")
    assert m == n and int(n) > 400 and res.returncode == 0, "\n".join(lines[-20:])
