"""Time a full Stable Diffusion 1.5 UNet (random weights, exported by
`examples/make_tiny_sd.py --full-unet DIR`) on the CPU backend (`--reference`: the NumPy
reference executor): load_onnx, optimize, and one
UNet step at batch 2 (classifier-free guidance), 64x64 latents, 77 tokens.

    python benchmarks/sd15_unet_cpu.py /work/sd15_unet [--check-ort] [--reference]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

from kn_graph.onnx import load_onnx
from kn_graph.optimizer import optimize
from kn_runtime import Device


def rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", type=Path, help="folder with unet/model.onnx (+ model.onnx_data)")
    ap.add_argument("--check-ort", action="store_true", help="also run onnxruntime and compare")
    ap.add_argument(
        "--reference",
        action="store_true",
        help="the NumPy reference executor (Device.cpu(reference=True)) instead of the CPU backend",
    )
    args = ap.parse_args()
    path = args.folder / "unet" / "model.onnx"
    shapes = {"sample": [2, 4, 64, 64], "timestep": [2], "encoder_hidden_states": [2, 77, 768]}
    rng = np.random.default_rng(0)
    feeds = {
        "sample": rng.standard_normal((2, 4, 64, 64)).astype(np.float32),
        "timestep": np.array([981, 981], np.int64),
        "encoder_hidden_states": rng.standard_normal((2, 77, 768)).astype(np.float32),
    }

    print(
        f"{path}: {len(onnx.load(str(path), load_external_data=False).graph.node)} ONNX nodes",
        flush=True,
    )
    t0, c0 = time.perf_counter(), time.process_time()
    graph = load_onnx(path, input_shapes=shapes)
    t_load, c_load = time.perf_counter() - t0, time.process_time() - c0
    n_loaded = len(graph)
    print(
        f"load_onnx: {t_load:.1f} s wall, {c_load:.1f} s CPU, {n_loaded} values (max RSS {rss_gb():.1f} GB)",
        flush=True,
    )
    t0, c0 = time.perf_counter(), time.process_time()
    graph = optimize(graph)
    t_opt, c_opt = time.perf_counter() - t0, time.process_time() - c0
    kinds = Counter(type(graph[v].op).__name__ for v in graph.values())
    print(
        f"optimize: {t_opt:.1f} s wall, {c_opt:.1f} s CPU, {len(graph)} values (max RSS {rss_gb():.1f} GB)",
        flush=True,
    )
    print("  ops:", ", ".join(f"{k} {n}" for k, n in kinds.most_common()), flush=True)
    t0 = time.perf_counter()
    prepared = Device.cpu(reference=args.reference).prepare(graph)  # fixed shapes: plans now
    if not args.reference:
        print(f"prepare (plan, compile, pack): {time.perf_counter() - t0:.1f} s wall", flush=True)
    t0, c0 = time.perf_counter(), time.process_time()
    (out,) = prepared.eval(feeds)
    t_step, c_step = time.perf_counter() - t0, time.process_time() - c0
    if not args.reference:  # time a second call too
        print(f"first step: {t_step:.1f} s wall", flush=True)
        t0, c0 = time.perf_counter(), time.process_time()
        (out,) = prepared.eval(feeds)
        t_step, c_step = time.perf_counter() - t0, time.process_time() - c0
    print(
        f"one UNet step (batch 2, 64x64, seq 77): {t_step:.1f} s wall, {c_step:.1f} s CPU, output {out.dtype}{list(out.shape)} "
        f"std {float(out.std()):.4g} (max RSS {rss_gb():.1f} GB)",
        flush=True,
    )
    if args.check_ort:
        import onnxruntime as ort

        del prepared, graph
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        t0 = time.perf_counter()
        (ref,) = sess.run(None, feeds)
        t_ort = time.perf_counter() - t0
        t0 = time.perf_counter()
        sess.run(None, feeds)
        t_ort2 = time.perf_counter() - t0
        err = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
        print(
            f"onnxruntime step: {t_ort:.1f} s (second run {t_ort2:.1f} s); max |kyanite - ort| / max |ort| = {err:.3g}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
