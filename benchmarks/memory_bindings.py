"""Memory under changing shapes: peak resident memory (Rss + shared memory) over many evaluations
at many input sizes, ours (`Device.cpu()`) against onnxruntime, side by side.

    .venv/bin/python benchmarks/memory_bindings.py [--cache /work/bigmodels] [--threads 2]
        [--evals 100] [--sizes 20] [-k bert_base|resnet50] [--plot memory_bindings.png]

BERT-base at 20 random sequence lengths (16-256) and ResNet-50 at 20 random image sizes
(128-288), 100 evaluations cycling through them in a seeded random order. The models are
exported once into the cache folder with dynamic axes (TorchScript exporter, opset 17, random
weights) by this file under the torch venvs of `real_models.py` (`--export-only NAME`).

Each side runs in a fresh subprocess: load, prepare (ours) or session (onnxruntime, default
options: its arena on), then the evaluations; after each one the process's Rss
(/proc/self/smaps_rollup, which counts the shared-memory pages it maps) plus the growth of the
machine's Shmem since the start (pages of shared memory no longer mapped: what `madvise` on a
shared mapping leaves behind) is sampled. VmHWM (peak Rss inside calls) is reported as well.
Prints a Markdown table (MB): after the first evaluation, after 10, peak, at the end, VmHWM;
`--plot` draws Rss + shmem per evaluation for both sides (Pillow).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = {"resnet50": Path("/work/venv-tv/bin/python"), "bert_base": Path("/work/venv-fx/bin/python")}
MODELS = ("bert_base", "resnet50")


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cache", type=Path, default=Path("/work/bigmodels"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--evals", type=int, default=100)
    ap.add_argument("--sizes", type=int, default=20)
    ap.add_argument("-k", dest="only", action="append", default=[])
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument("--export-only", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "SIDE"), help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def model_path(args: argparse.Namespace, name: str) -> Path:
    return args.cache / f"{name}_dynamic.onnx"


# ------------------------------------------------------------- export (runs under a torch venv)


def export(args: argparse.Namespace, name: str) -> None:
    import torch

    torch.manual_seed(0)
    if name == "resnet50":
        import torchvision

        model = torchvision.models.resnet50(weights=None).eval()
        example: tuple = (torch.randn(1, 3, 224, 224),)
        names, outs = ["input"], ["logits"]
        axes = {"input": {2: "height", 3: "width"}}
    else:
        import transformers as tf

        cfg = tf.BertConfig()
        cfg._attn_implementation = "eager"
        bert = tf.BertModel(cfg).eval()

        class Wrap(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.m = bert

            def forward(self, ids: torch.Tensor) -> tuple:
                return tuple(self.m(input_ids=ids, return_dict=False)[:2])

        model = Wrap().eval()
        example = (torch.randint(0, cfg.vocab_size, (1, 128)),)
        names, outs = ["input_ids"], ["last_hidden_state", "pooler_output"]
        axes = {"input_ids": {1: "seq"}, "last_hidden_state": {1: "seq"}}
    path = model_path(args, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.onnx")
    with torch.no_grad():
        torch.onnx.export(
            model,
            example,
            str(tmp),
            dynamo=False,
            opset_version=17,
            input_names=names,
            output_names=outs,
            dynamic_axes=axes,
        )
    tmp.rename(path)


def ensure_exported(args: argparse.Namespace, name: str) -> str | None:
    if model_path(args, name).exists():
        return None
    cmd = [str(VENV[name]), __file__, "--export-only", name, "--cache", str(args.cache)]
    print(f"exporting {name} ...", flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not model_path(args, name).exists():
        lines = [x for x in (r.stderr or r.stdout).strip().splitlines() if x.strip()]
        return lines[-1][:200] if lines else f"exit status {r.returncode}"
    return None


# ------------------------------------------------------------------- measuring (a subprocess)


def _rollup_rss() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Rss:"):
                return int(line.split()[1]) * 1024
    return 0


def _meminfo(field: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def feeds(name: str, count: int, evals: int) -> list[dict]:
    import numpy as np

    rng = np.random.default_rng(0)
    if name == "bert_base":
        sizes = sorted({int(s) for s in rng.integers(16, 257, 4 * count)})[:count]
        sizes = [int(s) for s in rng.permutation(sizes)]
        make = lambda s: {"input_ids": rng.integers(0, 30522, (1, s)).astype(np.int64)}  # noqa: E731
    else:
        sizes = sorted({int(s) for s in rng.integers(128, 289, 4 * count)})[:count]
        sizes = [int(s) for s in rng.permutation(sizes)]
        make = lambda s: {"input": rng.standard_normal((1, 3, s, s)).astype(np.float32)}  # noqa: E731
    order = [sizes[i % len(sizes)] for i in range(evals)]
    rng.shuffle(order[len(sizes) :])  # every size once first, then a random walk over them
    return [make(s) for s in order]


def child(args: argparse.Namespace, name: str, side: str) -> None:
    path = model_path(args, name)
    shm0 = _meminfo("Shmem")
    if side == "ours":
        from kn_graph.onnx import load_onnx
        from kn_runtime import Device

        prepared = Device.cpu(threads=args.threads).prepare(load_onnx(path))
        run = lambda feed: prepared.eval(feed)  # noqa: E731
    else:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        run = lambda feed: sess.run(None, feed)  # noqa: E731
    samples = []
    for feed in feeds(name, args.sizes, args.evals):
        run(feed)
        samples.append(_rollup_rss() + max(0, _meminfo("Shmem") - shm0))
    print(json.dumps({"samples": samples, "hwm": _status("VmHWM")}))


def measure(args: argparse.Namespace, name: str, side: str) -> dict:
    cmd = [sys.executable, __file__, "--child", name, side, "--cache", str(args.cache)]
    cmd += ["--threads", str(args.threads), "--evals", str(args.evals), "--sizes", str(args.sizes)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"{name} {side} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def plot(results: dict[str, dict[str, dict]], out: Path) -> None:
    from PIL import Image, ImageDraw

    w, h, pad = 900, 340, 50
    img = Image.new("RGB", (w, h * len(results)), "white")
    d = ImageDraw.Draw(img)
    colors = {"ours": (200, 40, 40), "ort": (40, 80, 200)}
    for row, (name, sides) in enumerate(results.items()):
        top = row * h
        peak = max(max(s["samples"]) for s in sides.values()) / 2**20
        n = max(len(s["samples"]) for s in sides.values())
        d.text((pad, top + 8), f"{name}: Rss + shmem (MB) per evaluation", fill="black")
        d.rectangle([pad, top + 30, w - pad, top + h - pad], outline="black")
        for frac in (0.25, 0.5, 0.75, 1.0):
            y = top + h - pad - frac * (h - pad - 40)
            d.text((5, y - 6), f"{peak * frac:.0f}", fill="black")
        for i, (side, s) in enumerate(sides.items()):
            pts = [
                (
                    pad + (w - 2 * pad) * k / max(n - 1, 1),
                    top + h - pad - (v / 2**20) / peak * (h - pad - 40),
                )
                for k, v in enumerate(s["samples"])
            ]
            d.line(pts, fill=colors[side], width=2)
            d.text((w - pad - 160, top + h - pad - 40 + 14 * i), side, fill=colors[side])
    img.save(out)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.export_only:
        export(args, args.export_only)
        return 0
    if args.child:
        child(args, *args.child)
        return 0
    names = [m for m in MODELS if not args.only or m in args.only]
    mb = lambda b: f"{b / 2**20:.0f}"  # noqa: E731
    print(
        f"{args.evals} evaluations at {args.sizes} sizes, {args.threads} threads; MB of Rss + "
        "shmem\n"
    )
    print("| model | side | after 1 | after 10 | peak | end | VmHWM |")
    print("|---|---|---|---|---|---|---|")
    results: dict[str, dict[str, dict]] = {}
    for name in names:
        why = ensure_exported(args, name)
        if why is not None:
            print(f"| {name} | export failed: {why} | | | | | |")
            continue
        results[name] = {}
        for side in ("ours", "ort"):
            r = measure(args, name, side)
            results[name][side] = r
            s = r["samples"]
            print(
                f"| {name} | {side} | {mb(s[0])} | {mb(s[min(9, len(s) - 1)])} | {mb(max(s))} "
                f"| {mb(s[-1])} | {mb(r['hwm'])} |",
                flush=True,
            )
        ours, ort = (max(results[name][k]["samples"]) for k in ("ours", "ort"))
        print(f"| {name} | peak ours / ort | | | {ours / ort:.2f} | | |", flush=True)
    if args.plot is not None and results:
        plot(results, args.plot)
        print(f"\nplot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
