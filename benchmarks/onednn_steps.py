"""One convolution or GEMM step per shape class, timed four ways in one process: the oneDNN
runner (`kn_cuda_eval.cpu.onednn`), the plan emulator's NumPy step, onnxruntime on the same
single-op ONNX model, and (GEMMs) NumPy/OpenBLAS matmul on the arena views — the numbers behind
the per-shape-class pick in `gemm_runner` and `conv_runner`.

    python benchmarks/onednn_steps.py [--threads 2] [--runs 12] [--pause 0.2] [--layouts]
        [--filter gemm]

Runs are interleaved (one of each per round, after warm-ups) and the median is printed as a
Markdown table. Thread pools that spin are the trap here: on 2 cores an OpenMP region started
while OpenBLAS's workers still spin (about 0.1 s after a call) or while onnxruntime's spin runs
10-30x slower. So the "cold" number sleeps `--pause` seconds before every timed call, with the
onnxruntime session not spinning (`session.intra_op.allow_spinning=0`); the "warm" number times
back-to-back blocks of one contender (onnxruntime spinning, its default), as a model's layers
run. Medians are robust, not immune, to other processes on the machine: run it on a quiet one.
The oneDNN column is the runners' default (for a convolution the layout "auto" picks);
`--layouts` adds rows for both convolution layouts, "blocked" (oneDNN's choice, reorders
included) and "plain" (the arena's NCHW views).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from kn_cuda_eval import plan
from kn_cuda_eval.cpu import onednn
from kn_cuda_eval.planning import steps as st
from kn_cuda_eval.planning.emulator import emulate_step, load_arena
from kn_graph.onnx import load_onnx

RNG = np.random.default_rng(0)


def _conv_model(n: int, c: int, hw: int, k: int, ks: int, groups: int) -> onnx.ModelProto:
    w = RNG.standard_normal((k, c // groups, ks, ks)).astype(np.float32) * 0.1
    b = RNG.standard_normal(k).astype(np.float32)
    node = helper.make_node(
        "Conv", ["x", "w", "b"], ["y"], pads=[ks // 2] * 4, group=groups, kernel_shape=[ks, ks]
    )
    graph = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, c, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _gemm_model(a: tuple[int, ...], b: tuple[int, ...], const_b: bool) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a))]
    inits = []
    if const_b:
        inits.append(numpy_helper.from_array(RNG.standard_normal(b).astype(np.float32), "b"))
    else:
        inputs.append(helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b)))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])],
        "matmul",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


CASES: list[tuple[str, onnx.ModelProto]] = [
    ("conv 3x3 64→64 56² b1 (ResNet)", _conv_model(1, 64, 56, 64, 3, 1)),
    ("conv 3x3 64→64 56² b8 (ResNet)", _conv_model(8, 64, 56, 64, 3, 1)),
    ("conv 3x3 256→256 14² b1 (ResNet)", _conv_model(1, 256, 14, 256, 3, 1)),
    ("depthwise 3x3 144 56² b1 (MobileNetV2)", _conv_model(1, 144, 56, 144, 3, 144)),
    ("conv 1x1 256→64 56² b1 (ResNet)", _conv_model(1, 256, 56, 64, 1, 1)),
    ("gemm 128x768 @ 768x768 (BERT)", _gemm_model((128, 768), (768, 768), True)),
    ("gemm 128x768 @ 768x3072 (BERT)", _gemm_model((128, 768), (768, 3072), True)),
    ("gemm 12x128x64 @ 12x64x128 (attention)", _gemm_model((12, 128, 64), (12, 64, 128), False)),
    ("gemm 12x128x128 @ 12x128x64 (attention)", _gemm_model((12, 128, 128), (12, 128, 64), False)),
]


def _feed(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    shapes = {
        i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input
    }
    return {n: RNG.standard_normal(s).astype(np.float32) for n, s in shapes.items()}


def _block(f: Callable[[], object], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        f()
        out.append(time.perf_counter() - t0)
    return out


def _contenders(
    model: onnx.ModelProto, threads: int, layouts: bool
) -> dict[str, Callable[[], object]]:
    graph = load_onnx(model.SerializeToString())
    p = plan(graph)
    feed = _feed(model)
    arena = load_arena(p, feed)
    for k, s in enumerate(p.steps):  # everything before the step, so its inputs are there
        if isinstance(s, st.Conv | st.MatMul):
            break
        emulate_step(arena, k, s)
    else:
        raise SystemExit(f"no conv or matmul step in {model.graph.name}")
    out: dict[str, Callable[[], object]] = {}
    if isinstance(s, st.Conv):
        r = onednn.conv_runner(s, arena, threads)  # layout "auto": the pick
        out[f"oneDNN ({r.impl if r else 'none'})"] = r or (lambda: None)
        for layout in ("blocked", "plain") if layouts else ():
            r2 = onednn.conv_runner(s, arena, threads, layout=layout)
            out[f"oneDNN {layout} ({r2.impl if r2 else 'none'})"] = r2 or (lambda: None)
    else:
        const = any(o <= s.a.offset < o + d.nbytes for o, d in p.constants)
        g = onednn.gemm_runner(s, arena, threads, backend="onednn", constant_weights=const)
        out[f"oneDNN ({getattr(g, 'impl', 'none')})"] = g or (lambda: None)
        blas = onednn.gemm_runner(s, arena, threads, backend="blas")
        assert blas is not None
        out["NumPy/OpenBLAS"] = blas
    blas_threads = onednn.blas_thread_setter()

    def emulated() -> None:
        blas_threads(threads)
        emulate_step(arena, k, s)

    out["emulator"] = emulated
    out["onnxruntime"] = _ort(model, threads, False, feed)
    return out


def _ort(
    model: onnx.ModelProto, threads: int, spinning: bool, feed: dict[str, np.ndarray]
) -> Callable[[], object]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, feed)


def _rounds(fs: dict[str, Callable[[], object]], runs: int, pause: float) -> dict[str, float]:
    """Cold: interleaved rounds, one call of each per round, `pause` s before every call."""
    times: dict[str, list[float]] = {n: [] for n in fs}
    for _ in range(runs):
        for n, f in fs.items():
            time.sleep(pause)
            t0 = time.perf_counter()
            f()
            times[n].append(time.perf_counter() - t0)
    return {n: statistics.median(t) * 1e3 for n, t in times.items()}


def _blocks(fs: dict[str, Callable[[], object]], runs: int, pause: float) -> dict[str, float]:
    """Warm: three interleaved rounds of back-to-back blocks (`runs` calls after 2 warm-ups)."""
    times: dict[str, list[float]] = {n: [] for n in fs}
    for _ in range(3):
        for n, f in fs.items():
            time.sleep(pause)
            f()
            f()
            times[n] += _block(f, runs)
    return {n: statistics.median(t) * 1e3 for n, t in times.items()}


def _cell(cold: dict[str, float], warm: dict[str, float], n: str) -> str:
    return f"{cold[n]:.3f} / {warm[n]:.3f}" if n in cold else "—"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--pause", type=float, default=0.2)
    ap.add_argument("--layouts", action="store_true")
    ap.add_argument("--filter", default="", help="only shape classes whose name contains this")
    args = ap.parse_args()
    if onednn.available() is not None:
        raise SystemExit(onednn.available())
    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, oneDNN "
        f"{onednn.load_dnnl().version()}, NumPy {np.__version__}, onnxruntime {ort.__version__}; "
        f"{args.threads} threads each; medians in ms, each cell cold / warm: cold = "
        f"{args.runs} interleaved rounds, {args.pause:g} s pause before every call, "
        "onnxruntime not spinning; warm = back-to-back blocks of "
        f"{args.runs}, three interleaved rounds, onnxruntime spinning (its default).\n"
    )
    print(
        "| shape class | oneDNN impl | oneDNN | NumPy/OpenBLAS | emulator | onnxruntime "
        "| oneDNN / ORT |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, model in CASES:
        if args.filter not in name:
            continue
        fs = _contenders(model, args.threads, args.layouts)
        for _ in range(args.warmup):
            for f in fs.values():
                f()
        cold = _rounds(fs, args.runs, args.pause)
        fs["onnxruntime"] = _ort(model, args.threads, True, _feed(model))
        warm = _blocks(fs, args.runs, args.pause)

        for n in fs:
            if not n.startswith("oneDNN"):
                continue
            impl = n.split("(", 1)[1].removesuffix(")")
            layout = n.split(" ")[1]
            label = name if n.startswith("oneDNN (") else f"  ↳ layout={layout}"
            ratio = f"{cold[n] / cold['onnxruntime']:.2f} / {warm[n] / warm['onnxruntime']:.2f}"
            print(
                f"| {label} | {impl} | {_cell(cold, warm, n)} "
                f"| {_cell(cold, warm, 'NumPy/OpenBLAS')} | {_cell(cold, warm, 'emulator')} "
                f"| {_cell(cold, warm, 'onnxruntime')} | {ratio} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
