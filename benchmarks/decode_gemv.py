"""The decode step's products, Qwen2-0.5B's shapes: every weight matrix of 24 layers (q, k, v,
o: 896 wide; gate, up: 896x4864; down: 4864x896) and the LM head (896x151936), 2 GB of float32
weights read once per token, against 1 or 4 rows. Three contenders on the same ONNX file, in
one process, interleaved rounds:
- `kn_gemv`: `Device.cpu()`, the products of up to 4 rows by `gemv.c` over oneDNN's packed
  weights (where oneDNN packed them in strips; its matmul otherwise);
- `oneDNN matmul`: the same with `gemv.GEMV_ROWS = 0` (the primitive's M=1 kernel);
- `onnxruntime`: an InferenceSession (MLAS), the peer.

    .venv/bin/python benchmarks/decode_gemv.py [--threads 2] [--runs 10] [--layers 24]

The model is written once (external data) to --cache (default /tmp/kn-decode-gemv). A token's
weights do not fit in any cache: each evaluation streams them from memory, as decoding does.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN, INTER, KV, VOCAB = 896, 4864, 128, 151936
LAYER = {"q": (HIDDEN, HIDDEN), "k": (HIDDEN, KV), "v": (HIDDEN, KV), "o": (HIDDEN, HIDDEN),
         "gate": (HIDDEN, INTER), "up": (HIDDEN, INTER), "down": (INTER, HIDDEN)}  # fmt: skip


def _model(path: Path, layers: int) -> Path:
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    inits, nodes, outs = [], [], []
    for i in range(layers):
        for name, (k, n) in LAYER.items():
            w = f"l{i}.{name}"
            inits.append(numpy_helper.from_array(rng.standard_normal((k, n), np.float32) * 0.03, w))
            nodes.append(
                helper.make_node("MatMul", ["h" if name == "down" else "x", w], [w + ".y"])
            )
            outs.append(helper.make_tensor_value_info(w + ".y", TensorProto.FLOAT, ["rows", n]))
    inits.append(
        numpy_helper.from_array(rng.standard_normal((HIDDEN, VOCAB), np.float32) * 0.03, "head")
    )
    nodes.append(helper.make_node("MatMul", ["x", "head"], ["logits"]))
    outs.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["rows", VOCAB]))
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", HIDDEN]),
        helper.make_tensor_value_info("h", TensorProto.FLOAT, ["rows", INTER]),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "decode_products", inputs, outs, inits),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    onnx.save(model, path, save_as_external_data=True, location=path.name + ".data")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/kn-decode-gemv"))
    args = ap.parse_args()
    import onnxruntime as ort

    from kn_cuda_eval.cpu.onednn import gemv
    from kn_graph.onnx import load_onnx
    from kn_runtime.device import Device

    path = _model(args.cache / f"decode_{args.layers}.onnx", args.layers)
    graph = load_onnx(str(path))
    ours = Device.cpu(args.threads).prepare(graph)
    rows_kept = gemv.GEMV_ROWS
    gemv.GEMV_ROWS = 0  # runners built from here on keep oneDNN's primitive
    primitive = Device.cpu(args.threads).prepare(load_onnx(str(path)))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    # its threads would otherwise spin after each run, on the cores the next contender needs
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    nbytes = sum(k * n * 4 for k, n in LAYER.values()) * args.layers + HIDDEN * VOCAB * 4
    print(f"{args.layers} layers + LM head: {nbytes / 1e9:.2f} GB of weights per token, "
          f"{args.threads} threads")  # fmt: skip
    print("\n| rows | kn_gemv ms | oneDNN matmul ms | onnxruntime ms | kn_gemv GB/s "
          "| vs matmul | vs onnxruntime |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(1)
    for rows in (1, 4):
        x = rng.standard_normal((rows, HIDDEN), np.float32)
        h = rng.standard_normal((rows, INTER), np.float32)
        gemv.GEMV_ROWS = rows_kept
        mine = ours.eval([x, h])
        gemv.GEMV_ROWS = 0
        theirs = primitive.eval([x, h])
        peer = session.run(None, {"x": x, "h": h})
        for a, b, c in zip(mine, theirs, peer, strict=True):
            np.testing.assert_allclose(a, c, rtol=1e-3, atol=1e-3)
            np.testing.assert_allclose(b, c, rtol=1e-3, atol=1e-3)
        feed = [x, h]
        contenders: dict[str, Callable[[], object]] = {
            "kn_gemv": lambda feed=feed: ours.eval(feed),
            "matmul": lambda feed=feed: primitive.eval(feed),
            "onnxruntime": lambda feed=feed: session.run(None, {"x": feed[0], "h": feed[1]}),
        }
        times: dict[str, list[float]] = {k: [] for k in contenders}
        names = list(contenders)
        for i in range(args.runs):  # interleaved, each first in turn: the VM's speed drifts
            for name in names[i % 3 :] + names[: i % 3]:
                t = time.perf_counter()
                contenders[name]()
                times[name].append(time.perf_counter() - t)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(
            f"| {rows} | {med['kn_gemv']:.1f} | {med['matmul']:.1f} | {med['onnxruntime']:.1f} "
            f"| {nbytes / med['kn_gemv'] / 1e6:.1f} | {med['matmul'] / med['kn_gemv']:.2f}x "
            f"| {med['onnxruntime'] / med['kn_gemv']:.2f}x |",
            flush=True,
        )
    gemv.GEMV_ROWS = rows_kept


if __name__ == "__main__":
    main()
