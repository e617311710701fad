"""Top-1 agreement of the int8 ResNet-50 (static QDQ, per channel; `real_models.py` makes it with
onnxruntime's quantizer) between us and onnxruntime, on synthetic but structured images (smooth
random images, the calibration recipe of `_quantize.py` with other seeds).

    .venv/bin/python benchmarks/quantized_accuracy.py [--cache /work/bigmodels] [--images 512]
        [--model resnet50_int8] [--threads 2]

Random weights make the classes meaningless, but the question is numerical: whether our integer
(or exact float) arithmetic picks the same class as onnxruntime's kernels. Prints the agreement,
how far apart the two top logits are where they disagree, and the largest logit difference.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).parent))
from _quantize import smooth_images


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path("/work/bigmodels"))
    ap.add_argument("--model", default="resnet50_int8")
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import onnxruntime as ort

    from kn_graph.onnx import load_onnx
    from kn_runtime import Device

    path = args.cache / f"{args.model}.onnx"
    if not path.exists():
        print(f"{path} is missing: run benchmarks/real_models.py -k {args.model} first")
        return 1
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    ours = Device.cpu(args.threads).prepare(load_onnx(path))
    agree, worst, gaps = 0, 0.0, []
    feeds = smooth_images((1, 3, 224, 224), args.images, 1)
    for feed in tqdm(feeds, total=args.images, desc=args.model, unit="image"):
        a = ours.eval(feed)[0].reshape(-1)
        b = np.asarray(sess.run(None, feed)[0]).reshape(-1)
        worst = max(worst, float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), 1e-30)))
        if a.argmax() == b.argmax():
            agree += 1
        else:
            top2 = np.sort(b)[-2:]
            gaps.append(float(top2[1] - top2[0]))
    print(
        f"{args.model}: top-1 agreement {agree}/{args.images} = {agree / args.images:.2%}; "
        f"largest logit difference {worst:.2e} of the largest logit"
    )
    if gaps:
        print(
            f"where they disagree, onnxruntime's top two logits were {max(gaps):.3g} apart at most"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
