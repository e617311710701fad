"""Load, optimize and plan times of the fixture corpus (and optionally the full SD 1.5 UNet),
for comparing two versions of the shape algebra on one machine in one run.

    python benchmarks/shape_times.py [--sd DIR] [--only-original] [--repeat 3]
    PYTHONPATH=/path/to/other/checkout python benchmarks/shape_times.py ...   # the other side

Prints one line per fixture (median of --repeat runs) and the totals; the planning time is at
the manifest's last binding of the optimized graph. Fixtures that a version cannot load are
reported as such (`--only-original` keeps the 18 fixtures every version loads).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from timing import median_time  # benchmarks/ is the script folder on sys.path

MODELS = Path(__file__).resolve().parent.parent / "tests" / "models"
ORIGINAL = 18  # the fixtures before the dynamic-shape ones were added


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sd", type=Path, help="folder with unet/model.onnx (SD 1.5, random weights)")
    ap.add_argument("--only-original", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    import kn_graph
    from kn_cuda_eval import plan
    from kn_graph.binding import bind_inputs
    from kn_graph.errors import KnError
    from kn_graph.onnx import load_onnx
    from kn_graph.optimizer import optimize

    print(f"kn_graph from {Path(kn_graph.__file__).parent}")
    fixtures = json.loads((MODELS / "manifest.json").read_text())["fixtures"]
    if args.only_original:
        fixtures = fixtures[:ORIGINAL]
    totals = [0.0, 0.0, 0.0]
    print(f"{'fixture':28s} {'load ms':>9s} {'optimize ms':>12s} {'plan ms':>9s}")
    for fx in fixtures:
        try:
            t_load, g = median_time(lambda fx=fx: load_onnx(MODELS / fx["file"]), args.repeat)
            if not hasattr(g, "outputs"):  # a model specialized on input values
                print(f"{fx['name']:28s} (shapes from input values: not timed)")
                continue
            t_opt, o = median_time(lambda g=g: optimize(g), args.repeat)
            data = np.load(MODELS / fx["reference"])
            k = len(fx["datasets"]) - 1
            feed = {n: data[f"in{k}:{n}"] for n in o.input_names}
            binds = bind_inputs(o, feed)[1]
            t_plan, _ = median_time(lambda o=o, b=binds: plan(o, bindings=b), args.repeat)
        except KnError as e:
            print(f"{fx['name']:28s} does not load: {str(e)[:80]}")
            continue
        totals = [a + b for a, b in zip(totals, (t_load, t_opt, t_plan), strict=True)]
        print(f"{fx['name']:28s} {t_load * 1e3:9.1f} {t_opt * 1e3:12.1f} {t_plan * 1e3:9.1f}")
    print(f"{'total':28s} {totals[0] * 1e3:9.1f} {totals[1] * 1e3:12.1f} {totals[2] * 1e3:9.1f}")
    if args.sd:
        path = args.sd / "unet" / "model.onnx"
        pinned = {"sample": [2, 4, 64, 64], "timestep": [2], "encoder_hidden_states": [2, 77, 768]}
        for label, kwargs in (("pinned shapes", {"input_shapes": pinned}), ("symbolic", {})):
            t0 = time.perf_counter()
            try:
                g = load_onnx(path, **kwargs)
            except KnError as e:
                print(f"SD 1.5 UNet ({label}): does not load: {str(e)[:120]}")
                continue
            t_load = time.perf_counter() - t0
            t0 = time.perf_counter()
            o = optimize(g)
            t_opt = time.perf_counter() - t0
            print(
                f"SD 1.5 UNet ({label}): load {t_load:.2f} s ({len(g)} values), optimize "
                f"{t_opt:.2f} s ({len(o)} values), load + optimize {t_load + t_opt:.2f} s"
            )
            print(
                f"  inputs: {[f'{n}{g[v].shape}' for n, v in zip(g.input_names, g.inputs, strict=True)]}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
