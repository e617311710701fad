"""The cost of the data-dependent ops that every device runs on the host (NonZero, TopK, NMS,
Unique at detector sizes), side by side with onnxruntime running the same one-node model, in one
process, median of --repeat calls; plus the segment overhead of a NonZero → Gather → MatMul
graph through the plan emulator.

    .venv/bin/python benchmarks/dynamic_ops.py [--repeat 30]

Prints a Markdown table (ours / onnxruntime as a ratio) for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.timing import median_time
from kn_graph.onnx import load_onnx
from kn_runtime import Device


def _model(
    op: str, feed: dict, outs: list[str], inits: dict | None = None, **attrs: object
) -> onnx.ModelProto:
    ins = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
        for n, a in feed.items()
    ]
    inits = inits or {}
    node = helper.make_node(op, [*feed, *inits], outs, **attrs)
    g = helper.make_graph(
        [node],
        op,
        ins,
        [helper.ValueInfoProto(name=o) for o in outs],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def cases(rng: np.random.Generator) -> list[tuple[str, onnx.ModelProto, dict]]:
    n = 8400  # YOLOv8 at 640x640: 8400 candidate boxes
    c = rng.uniform(0, 640, (n, 2))
    wh = rng.uniform(4, 120, (n, 2))
    boxes = np.concatenate([c, c + wh], 1)[None].astype(np.float32)
    scores = rng.uniform(0, 1, (1, 80, n)).astype(np.float32)
    out = [
        (
            "TopK k=300 of 8400 scores",
            _model("TopK", {"x": scores[:, 0]}, ["v", "i"], {"k": np.array([300])}, axis=1),
            {"x": scores[:, 0]},
        ),
        (
            "NonZero of a 1x80x8400 mask",
            _model("NonZero", {"m": scores > 0.995}, ["y"]),
            {"m": scores > 0.995},
        ),
        (
            "NMS 8400 boxes x 80 classes",
            _model(
                "NonMaxSuppression",
                {"b": boxes, "s": scores},
                ["sel"],
                {
                    "k": np.array([100]),
                    "iou": np.array([0.5], np.float32),
                    "thr": np.array([0.9], np.float32),
                },
            ),
            {"b": boxes, "s": scores},
        ),
    ]
    ids = {"x": rng.integers(0, 5000, 100_000)}
    out.append(("Unique of 100k int64", _model("Unique", ids, ["y", "i", "inv", "c"]), ids))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    print("| host op | ours (ms) | onnxruntime (ms) | ratio | result size |")
    print("|---|---|---|---|---|")
    for name, m, feed in cases(rng):
        prepared = Device.cpu().prepare(load_onnx(m.SerializeToString()))
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        t_ours, got = median_time(lambda p=prepared, f=feed: p.eval(f), args.repeat)
        t_ort, want = median_time(lambda s=sess, f=feed: s.run(None, f), args.repeat)
        same = all(
            np.array_equal(a, b) or np.allclose(a, b) for a, b in zip(got, want, strict=True)
        )
        print(
            f"| {name} | {t_ours * 1e3:.2f} | {t_ort * 1e3:.2f} | {t_ours / t_ort:.2f} | "
            f"{list(got[-1].shape) if len(got) < 3 else list(got[0].shape)}"
            f"{'' if same else ' MISMATCH'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
