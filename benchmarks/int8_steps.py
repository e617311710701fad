"""The CPU backend's integer steps timed per shape: oneDNN's int8 runner
(`kn_cuda_eval.cpu.onednn.int8`, each activation layout), the float32 step of the same shape
(`conv_runner` / `gemm_runner`: what a dequantized model runs), and the exact float64 fallback
(the emulator's step: im2col + BLAS dgemm for a convolution, BLAS dgemm for a matmul).

    python benchmarks/int8_steps.py [--threads 2] [--runs 15]

Weights are 7-bit (|w - w_zero| <= 64), so the oneDNN path is taken on every CPU (the module
docstring of `kn_cuda_eval.cpu.onednn.int8`); the sources u8 with a nonzero zero point. Runs are
interleaved (one of each contender per round, after warm-ups) and the median in ms per call is
printed as a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np

from kn_cuda_eval import PlanSettings, plan
from kn_cuda_eval.cpu import onednn
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.emulator import emulate_step, load_arena
from kn_graph import DType, Graph, Shape

RNG = np.random.default_rng(0)

CONVS = [  # name, (n, c, hw), k, kernel, stride
    ("conv 3x3 64->64 56x56", (1, 64, 56), 64, 3, 1),
    ("conv 1x1 256->64 56x56", (1, 256, 56), 64, 1, 1),
    ("conv 3x3 128->128 28x28 s2", (1, 128, 56), 128, 3, 2),
]
GEMMS = [  # name, (m, k, n)
    ("matmul 128x768 @ 768x768", (128, 768, 768)),
    ("matmul 128x768 @ 768x3072", (128, 768, 3072)),
]


def _conv_graphs(n: int, c: int, hw: int, k: int, ks: int, stride: int) -> tuple[Graph, Graph]:
    w = RNG.integers(-64, 65, (k, c, ks, ks)).astype(np.int8)
    gi = Graph()
    x = gi.input(Shape.of(n, c, hw, hw), DType.U8, "x")
    y = gi.int_conv(
        x,
        gi.constant(w),
        gi.scalar(7, DType.U8),
        gi.scalar(0, DType.I8),
        [stride] * 2,
        [ks // 2] * 2,
    )
    gi.add_output(y, "y")
    gf = Graph()
    xf = gf.input(Shape.of(n, c, hw, hw), DType.F32, "x")
    gf.add_output(gf.conv(xf, gf.constant(w.astype(np.float32)), [stride] * 2, [ks // 2] * 2), "y")
    return gi, gf


def _gemm_graphs(m: int, k: int, n: int) -> tuple[Graph, Graph]:
    w = RNG.integers(-64, 65, (1, k, n)).astype(np.int8)
    gi = Graph()
    a = gi.input(Shape.of(1, m, k), DType.U8, "a")
    gi.add_output(
        gi.int_matmul(a, gi.constant(w), gi.scalar(7, DType.U8), gi.scalar(0, DType.I8)), "y"
    )
    gf = Graph()
    af = gf.input(Shape.of(1, m, k), DType.F32, "a")
    gf.add_output(gf.matmul(af, gf.constant(w.astype(np.float32))), "y")
    return gi, gf


def _contenders(gi: Graph, gf: Graph, threads: int) -> dict[str, Callable[[], None] | None]:
    feed_i = [RNG.integers(0, 256, gi[v].shape.eval({})).astype(np.uint8) for v in gi.inputs]
    pi = plan(gi, settings=PlanSettings(integer_steps=True))
    ai = load_arena(pi, feed_i)
    k, si = next((k, s) for k, s in enumerate(pi.steps) if isinstance(s, st.IntConv | st.IntMatMul))
    consts = onednn.Constants(pi.constants, pi.const_size)
    out: dict[str, Callable[[], None] | None] = {}
    if isinstance(si, st.IntConv):
        for lay in onednn.INT_CONV_LAYOUTS[1:]:
            r = onednn.int_conv_runner(si, ai, threads, constants=consts, layout=lay)
            out[f"int8 oneDNN {lay}" + ("" if r is None else f" ({r.impl})")] = r
    else:
        r = onednn.int_matmul_runner(si, ai, threads, constants=consts)
        out["int8 oneDNN" + ("" if r is None else f" ({r.impl})")] = r
    pf = plan(gf)
    af = load_arena(pf, [np.asarray(a, np.float32) for a in feed_i])
    sf = next(s for s in pf.steps if isinstance(s, st.Conv | st.MatMul))
    if isinstance(sf, st.Conv):
        rf = onednn.conv_runner(sf, af, threads)
    else:
        rf = onednn.gemm_runner(sf, af, threads, constant_weights=True)
    out["f32 step" + (f" ({rf.impl})" if isinstance(rf, onednn.Runner) else "")] = rf
    out["f64 fallback (emulator)"] = lambda: emulate_step(ai, k, si)
    return out


def _time(fns: dict[str, Callable[[], None] | None], runs: int) -> dict[str, float | None]:
    live = {n: f for n, f in fns.items() if f is not None}
    for f in live.values():
        f()
        f()
    times: dict[str, list[float]] = {n: [] for n in live}
    for _ in range(runs):
        for n, f in live.items():
            t0 = time.perf_counter()
            f()
            times[n].append((time.perf_counter() - t0) * 1e3)
    return {n: (statistics.median(times[n]) if n in times else None) for n in fns}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    isa = int(onednn.load_dnnl().fn("dnnl_get_effective_cpu_isa")())
    print(
        f"# int8 steps, {args.threads} threads, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cpus, oneDNN {onednn.load_dnnl().version()} isa {isa:#x} "
        f"(VNNI: {onednn.has_vnni()})\n"
    )
    print("| shape | contender | ms per call |")
    print("|---|---|---:|")
    cases = [(name, _conv_graphs(n, c, hw, k, ks, s)) for name, (n, c, hw), k, ks, s in CONVS]
    cases += [(name, _gemm_graphs(*mkn)) for name, mkn in GEMMS]
    for name, (gi, gf) in cases:
        for who, ms in _time(_contenders(gi, gf, args.threads), args.runs).items():
            print(f"| {name} | {who} | {'refused' if ms is None else f'{ms:.2f}'} |")


if __name__ == "__main__":
    main()
