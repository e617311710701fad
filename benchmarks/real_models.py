"""Real-size models (random weights) on the fast CPU backend against onnxruntime.

    .venv/bin/python benchmarks/real_models.py [--cache /work/bigmodels] [--threads 2]
        [--runs 10] [--warmup 2] [-k NAME ...] [--no-rss]

Phase 1 exports each model once into the cache folder (outside the repository; skipped when the
file exists) with the TorchScript exporter (`dynamo=False`, opset 17, batch 1, fixed shapes),
running this very file as `<venv>/bin/python benchmarks/real_models.py --export-only NAME` under
the venv that has torch (torchvision models: /work/venv-tv; transformers models: /work/venv-fx).
A failed export is recorded and the model skipped.

Phase 2, per model, in this process: `load_onnx`, `Device.cpu(threads=N).prepare(graph)`
(which optimizes with the device's settings); the first call (plan + C compile + arena) is timed on its own; then
ours and onnxruntime (intra-op N threads, inter-op 1, sequential) are called in turn (`--pause` seconds before each call), median of
`--runs` after `--warmup` rounds. Agreement is max |ours - ort| / max |ort| over all outputs.

Phase 3 (ResNet-50 and BERT-base): the RSS growth of one (first) evaluation, each side in a fresh
subprocess: peak RSS during the call (VmHWM, reset through /proc/self/clear_refs just before)
minus RSS just before it.

Prints a Markdown table and the geometric mean of the ratios. Writes nothing into the repository.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
VENV_TV = Path("/work/venv-tv/bin/python")
VENV_FX = Path("/work/venv-fx/bin/python")
SEQ = 128

# name -> (venv, kind, argument, batch)
MODELS: dict[str, tuple[Path, str, str, int]] = {
    "resnet50": (VENV_TV, "tv", "resnet50", 1),
    "resnet50_b8": (VENV_TV, "tv", "resnet50", 8),
    "mobilenet_v2": (VENV_TV, "tv", "mobilenet_v2", 1),
    "efficientnet_b0": (VENV_TV, "tv", "efficientnet_b0", 1),
    "vit_b_16": (VENV_TV, "tv", "vit_b_16", 1),
    "bert_base": (VENV_FX, "bert", "base", 1),
    "gpt2_small": (VENV_FX, "gpt2", "small", 1),
    "minilm": (VENV_FX, "bert", "minilm", 1),
    # quantized with onnxruntime's tools from the float exports above (benchmarks/_quantize.py)
    "resnet50_int8": (Path(sys.executable), "quant", "resnet50:qdq_per_channel", 1),
    "mobilenet_v2_int8": (Path(sys.executable), "quant", "mobilenet_v2:qdq", 1),
    "bert_base_dynamic": (Path(sys.executable), "quant", "bert_base:dynamic", 1),
    "gpt2_small_4bit": (Path(sys.executable), "quant", "gpt2_small:nbits", 1),
}
RSS_MODELS = ("resnet50", "bert_base")


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cache", type=Path, default=Path("/work/bigmodels"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument(
        "--pause",
        type=float,
        default=0.05,
        help="seconds before each timed call (default 0.05): onnxruntime's workers spin after "
        "a run and take the cores of whatever runs next; 0 measures back to back",
    )
    ap.add_argument("-k", dest="only", action="append", help="only these models (repeatable)")
    ap.add_argument("--no-rss", action="store_true", help="skip the RSS measurements")
    ap.add_argument("--export-only", metavar="NAME", help=argparse.SUPPRESS)
    ap.add_argument("--rss", nargs=2, metavar=("NAME", "SIDE"), help=argparse.SUPPRESS)
    return ap.parse_args()


ARGS = _parse()
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = str(ARGS.threads)


def model_path(name: str) -> Path:
    return ARGS.cache / f"{name}.onnx"


# ---------------------------------------------------------------- export (runs under a torch venv)


def export(name: str) -> None:
    """Export one model with random weights; runs under the venv that has torch (a quantized
    variant: under this venv, from its float export)."""
    _venv, kind, arg, batch = MODELS[name]
    if kind == "quant":
        source, recipe = arg.split(":")
        if (why := ensure_exported(source)) is not None:
            raise RuntimeError(f"float model {source}: {why}")
        sys.path.insert(0, str(Path(__file__).parent))
        from _quantize import quantize

        quantize(model_path(source), model_path(name), recipe, (batch, 3, 224, 224))
        return
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(ARGS.threads)
    # ViT in eval mode takes the fused aten::_native_multi_head_attention path, which the
    # TorchScript exporter cannot export: use the plain path
    torch.backends.mha.set_fastpath_enabled(False)
    if kind == "tv":
        import torchvision

        model = getattr(torchvision.models, arg)(weights=None).eval()
        if arg.startswith("vit"):  # torchvision zero-initialises the head: logits all 0
            torch.nn.init.normal_(model.heads.head.weight, std=0.02)
            torch.nn.init.normal_(model.heads.head.bias, std=0.02)
        args: tuple = (torch.randn(batch, 3, 224, 224),)
        in_names, out_names = ["input"], ["logits"]
    else:
        import transformers as tf

        class Wrap(torch.nn.Module):
            def __init__(self, m: torch.nn.Module, n_out: int, mask: bool = False) -> None:
                super().__init__()
                self.m, self.n_out, self.mask = m, n_out, mask

            def forward(self, ids: torch.Tensor) -> tuple:
                # GPT-2 without a mask looks for packed sequences (aten::diff: not exportable)
                mask = torch.ones_like(ids) if self.mask else None
                out = self.m(input_ids=ids, attention_mask=mask, return_dict=False)
                return tuple(out[: self.n_out])

        if kind == "bert":
            cfg = (
                tf.BertConfig()
                if arg == "base"
                else tf.BertConfig(
                    hidden_size=384,
                    num_hidden_layers=12,
                    num_attention_heads=12,
                    intermediate_size=1536,
                )
            )
            cfg._attn_implementation = "eager"
            m = tf.BertModel(cfg)
            model, out_names = Wrap(m, 2), ["last_hidden_state", "pooler_output"]
        else:
            cfg = tf.GPT2Config(use_cache=False)
            cfg._attn_implementation = "eager"
            m = tf.GPT2Model(cfg)
            model, out_names = Wrap(m, 1, mask=True), ["last_hidden_state"]
        model.eval()
        args = (torch.randint(0, cfg.vocab_size, (batch, SEQ)),)
        in_names = ["input_ids"]
    path = model_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.onnx")
    with torch.no_grad():
        torch.onnx.export(
            model,
            args,
            str(tmp),
            dynamo=False,
            opset_version=17,
            input_names=in_names,
            output_names=out_names,
        )
    tmp.rename(path)


def ensure_exported(name: str) -> str | None:
    """None when the model file is there (exported now or before), else why not."""
    if model_path(name).exists():
        return None
    venv = MODELS[name][0]
    cmd = [str(venv), str(Path(__file__).resolve()), "--export-only", name]
    cmd += ["--cache", str(ARGS.cache), "--threads", str(ARGS.threads)]
    print(f"exporting {name} ...", flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not model_path(name).exists():
        lines = [x for x in (r.stderr or r.stdout).strip().splitlines() if x.strip()]
        return lines[-1][:200] if lines else f"exit status {r.returncode}"
    return None


# ---------------------------------------------------------------- timing (runs under .venv)


def feeds_for(path: Path) -> dict:
    import numpy as np
    import onnx

    from kn_graph.onnx.mapped import MappedFile, strip_initializers

    rng = np.random.default_rng(0)
    # the graph without the weights' bytes: a whole onnx.load would set the process's peak
    # RSS of the phase-3 children (both sides) to twice the weights
    mf = MappedFile(path)
    stripped = strip_initializers(mf.map) if mf.map is not None else None
    m = onnx.load_from_string(stripped) if stripped else onnx.load(str(path))
    inits = {i.name for i in m.graph.initializer}
    out = {}
    for i in m.graph.input:
        if i.name in inits:
            continue
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if i.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            out[i.name] = rng.integers(0, 1000, size=shape, dtype=np.int64)
        else:
            out[i.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def ort_session(path: Path) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = ARGS.threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def ours_prepared(path: Path) -> Any:
    from kn_graph.onnx import load_onnx
    from kn_runtime import Device

    # the device optimizes with its own settings (QDQ fusion where it has integer steps)
    return Device.cpu(ARGS.threads).prepare(load_onnx(path))


def time_model(name: str) -> dict:
    import statistics
    import time

    import numpy as np

    path = model_path(name)
    feeds = feeds_for(path)
    t0 = time.perf_counter()
    ours = ours_prepared(path)
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = ours.eval(feeds)
    t_first = time.perf_counter() - t0
    sess = ort_session(path)
    ref = sess.run(None, feeds)
    if not any(np.any(r) for r in ref):
        raise RuntimeError("the reference outputs are all zero: agreement would be vacuous")
    err = max(
        float(np.max(np.abs(np.asarray(g, np.float64) - r)) / max(float(np.max(np.abs(r))), 1e-30))
        for g, r in zip(got, ref, strict=True)
    )
    fs = {"ours": lambda: ours.eval(feeds), "ort": lambda: sess.run(None, feeds)}
    for _ in range(ARGS.warmup):
        for f in fs.values():
            f()
    ts: dict[str, list[float]] = {k: [] for k in fs}
    for _ in range(ARGS.runs):
        for k, f in fs.items():
            time.sleep(ARGS.pause)  # the other side's pool stops spinning
            t0 = time.perf_counter()
            f()
            ts[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in ts.items()}
    return {"load": t_load, "first": t_first, "err": err, **med}


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def rss_child(name: str, side: str) -> None:
    """In a fresh process: print 'RSS <before> <first delta> <second delta> <process peak>' (MB):
    the RSS growth of the first and of a second evaluation (peak during the call minus RSS just
    before it) and the peak RSS of the whole process (loading included)."""
    import resource

    path = model_path(name)
    feeds = feeds_for(path)
    if side == "ours":
        p = ours_prepared(path)
        f = lambda: p.eval(feeds)  # noqa: E731
    else:
        s = ort_session(path)
        f = lambda: s.run(None, feeds)  # noqa: E731
    peaks = [_status_kb("VmHWM")]
    deltas = []
    before0 = _status_kb("VmRSS")
    for _ in range(2):
        before = _status_kb("VmRSS")
        try:  # reset the high-water mark: the peak then covers the evaluation alone
            Path("/proc/self/clear_refs").write_text("5")
            f()
            peak = _status_kb("VmHWM")
        except OSError:
            f()
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        deltas.append(peak - before)
        peaks.append(peak)
    print(
        f"RSS {before0 / 1024:.1f} {deltas[0] / 1024:.1f} {deltas[1] / 1024:.1f} "
        f"{max(peaks) / 1024:.1f}",
        flush=True,
    )


def rss(name: str, side: str) -> str:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--rss", name, side]
    cmd += ["--cache", str(ARGS.cache), "--threads", str(ARGS.threads)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if line.startswith("RSS "):
            before, d1, d2, peak = (float(x) for x in line.split()[1:])
            return f"{before:.0f} | +{d1:.0f} | +{d2:.0f} | {peak:.0f}"
    lines = (r.stderr or "").strip().splitlines()
    return f"failed: {lines[-1][:120] if lines else r.returncode} | | |"


def main() -> int:
    import math
    import platform

    names = [n for n in MODELS if not ARGS.only or n in ARGS.only]
    failures: dict[str, str] = {}
    for n in names:  # phase 1: all exports before any timing
        why = ensure_exported(n)
        if why is not None:
            failures[n] = why
            print(f"export of {n} failed: {why}", flush=True)
    rows = []
    for n in names:
        if n in failures:
            continue
        try:
            r = time_model(n)
        except Exception as e:  # record and go on
            failures[n] = f"{type(e).__name__}: {str(e)[:200]}"
            print(f"{n}: {failures[n]}", flush=True)
            continue
        rows.append((n, r))
        print(
            f"{n:16s} ours {r['ours'] * 1e3:8.2f} ms  ort {r['ort'] * 1e3:8.2f} ms  "
            f"ratio {r['ours'] / r['ort']:5.2f}  load+optimize {r['load']:.1f} s  "
            f"first call {r['first']:.1f} s  agreement {r['err']:.2e}",
            flush=True,
        )
    rss_rows = []
    if not ARGS.no_rss:
        for n in RSS_MODELS:
            if n in names and n not in failures:
                rss_rows.append((n, rss(n, "ours"), rss(n, "ort")))
    import numpy as np
    import onnxruntime as ort

    print()
    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, NumPy {np.__version__}, "
        f"onnxruntime {ort.__version__}; {ARGS.threads} threads each; optimized graph on "
        f"Device.cpu(); median of {ARGS.runs} interleaved calls after {ARGS.warmup} "
        f"warm-up rounds; random weights, batch 1 unless named, sequence {SEQ}.\n"
    )
    print("| model | ours (ms) | onnxruntime (ms) | ratio | first call (s) | agreement |")
    print("|---|---:|---:|---:|---:|---:|")
    for n, r in rows:
        print(
            f"| {n} | {r['ours'] * 1e3:.2f} | {r['ort'] * 1e3:.2f} | {r['ours'] / r['ort']:.2f} "
            f"| {r['first']:.1f} | {r['err']:.1e} |"
        )
    if rows:
        geo = math.exp(sum(math.log(r["ours"] / r["ort"]) for _, r in rows) / len(rows))
        print(f"| **geometric mean** | | | **{geo:.2f}** | | |")
    if rss_rows:
        print(
            "\nRSS (MB), fresh process per side: before the first evaluation, growth during the "
            "first and a second evaluation (peak in the call minus RSS before it), peak of the "
            "whole process (loading included):\n"
        )
        print("| model | side | RSS before | first eval | second eval | process peak |")
        print("|---|---|---:|---:|---:|---:|")
        for n, a, b in rss_rows:
            print(f"| {n} | ours | {a} |")
            print(f"| {n} | onnxruntime | {b} |")
    for n, why in failures.items():
        print(f"\nfailed: {n}: {why}")
    return 0


if __name__ == "__main__":
    if ARGS.export_only:
        export(ARGS.export_only)
    elif ARGS.rss:
        rss_child(*ARGS.rss)
    else:
        sys.exit(main())
