"""Our CUDA executor against onnxruntime's CUDA provider and PyTorch eager, on the same weights,
in one run: ResNet-50 (batch 1, 64), a BERT-base encoder (seq 128, batch 1, 32), the tiny and the
full-size Stable Diffusion 1.5 UNet (batch 2, 64x64 latents, 77 tokens; random weights), plus the
evaluation overhead of a 1,000-step plan.

    python benchmarks/gpu_vs_peers.py [--out DIR] [--budget S] [--only resnet50,bert] [--dry-run]

Every model is built in plain torch (transformers' BertModel and diffusers' UNet when importable;
diffusers may come as a wheel in benchmarks/wheels/), exported to ONNX (TorchScript exporter,
opset 17) in a temporary folder, then loaded, optimized and run by us, by onnxruntime and by
torch. Latency: median wall time per call (device-resident inputs and outputs, synchronised),
after warm-up. F32 everywhere (TF32 off); separate TF32 (ours, torch, onnxruntime) and F16
autocast (torch) columns. Memory: our one allocation against torch.cuda.max_memory_allocated.
Correctness: our output against torch's (max |d| / max |ref|).

Rows that cannot run say why ("skipped: ...") and the script goes on; results are written as they
come to DIR/bench.jsonl, and at the end DIR/bench_table.md and DIR/results_section.md (ready to
append to benchmarks/RESULTS.md). DIR is $OUT when set, else a temporary folder.

--dry-run builds the models at tiny size and runs our CPU executor, onnxruntime's CPU provider and
torch on the CPU, so that the code is exercised on a machine without a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OPSET = 17


# -- environment ----------------------------------------------------------------------------------
def add_wheels() -> list[str]:
    """Unpack pure-Python wheels from benchmarks/wheels/ (e.g. diffusers, missing on the GPU
    machine) into a temporary folder on sys.path, for the packages not importable already."""
    added = []
    folder = ROOT / "benchmarks" / "wheels"
    for whl in sorted(folder.glob("*.whl")):
        name = whl.name.split("-")[0]
        try:
            __import__(name)
            continue
        except ImportError:
            pass
        target = Path(tempfile.mkdtemp(prefix=f"kn_whl_{name}_"))
        with zipfile.ZipFile(whl) as z:
            z.extractall(target)
        sys.path.append(str(target))
        added.append(whl.name)
    return added


def cuda_problem(dry: bool) -> str | None:
    if dry:
        return None
    from kn_cuda_eval.cuda.device import probe

    return probe(0)


def torch_or_none() -> Any:
    try:
        import torch

        return torch
    except Exception:
        return None


# -- measuring ----------------------------------------------------------------------------------
def median_ms(
    f: Callable[[], Any], sync: Callable[[], None], runs: int, seconds: float
) -> tuple[float, int]:
    """Median wall time of f() + sync() in ms, after warm-up; at least 5 runs, at most `runs`,
    stopping early after `seconds`."""
    for _ in range(3):
        f()
        sync()
    ts: list[float] = []
    stop = time.perf_counter() + seconds
    while len(ts) < runs and (len(ts) < 5 or time.perf_counter() < stop):
        t0 = time.perf_counter()
        f()
        sync()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3, len(ts)


def rel_diff(got: np.ndarray, ref: np.ndarray) -> float:
    g, r = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if not np.isfinite(g).all():
        return float("nan")
    return float(np.max(np.abs(g - r)) / max(float(np.max(np.abs(r))), 1e-30))


@dataclass
class Row:
    model: str
    batch: int
    note: str = ""
    ours_ms: float | None = None
    ort_ms: float | None = None
    torch_ms: float | None = None
    ours_tf32_ms: float | None = None
    ort_tf32_ms: float | None = None
    torch_tf32_ms: float | None = None
    torch_f16_ms: float | None = None
    arena_mb: float | None = None
    torch_peak_mb: float | None = None
    diff_vs_torch: float | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


# -- models ---------------------------------------------------------------------------------------
@dataclass
class Model:
    name: str
    module: Any
    input_names: list[str]
    output_name: str
    inputs: Callable[[int, np.random.Generator], dict[str, np.ndarray]]
    batches: list[int]
    note: str


def resnet50(torch: Any, width: int, image: int, batches: list[int]) -> Model:
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, planes: int, stride: int) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(cin, planes, 1, bias=False)
            self.b1 = nn.BatchNorm2d(planes)
            self.c2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
            self.b2 = nn.BatchNorm2d(planes)
            self.c3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.b3 = nn.BatchNorm2d(planes * 4)
            self.down = None
            if stride != 1 or cin != planes * 4:
                self.down = nn.Sequential(
                    nn.Conv2d(cin, planes * 4, 1, stride, bias=False), nn.BatchNorm2d(planes * 4)
                )

        def forward(self, x: Any) -> Any:
            r = x if self.down is None else self.down(x)
            y = torch.relu(self.b1(self.c1(x)))
            y = torch.relu(self.b2(self.c2(y)))
            return torch.relu(self.b3(self.c3(y)) + r)

    class ResNet50(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(
                nn.Conv2d(3, width, 7, 2, 3, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                nn.MaxPool2d(3, 2, 1),
            )
            layers, cin = [], width
            for k, n in enumerate((3, 4, 6, 3)):
                planes = width * 2**k
                for j in range(n):
                    layers.append(Bottleneck(cin, planes, 2 if j == 0 and k > 0 else 1))
                    cin = planes * 4
            self.layers = nn.Sequential(*layers)
            self.fc = nn.Linear(cin, 1000)

        def forward(self, x: Any) -> Any:
            y = self.layers(self.stem(x))
            return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(y, 1), 1))

    torch.manual_seed(50)
    m = ResNet50().eval()
    g = torch.Generator().manual_seed(51)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):  # non-trivial statistics, as after training
                mod.running_mean.copy_(torch.randn(mod.num_features, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(mod.num_features, generator=g) + 0.5)
                mod.weight.copy_(torch.rand(mod.num_features, generator=g) * 0.5 + 0.5)
                mod.bias.copy_(torch.randn(mod.num_features, generator=g) * 0.1)

    def inputs(b: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"input": rng.standard_normal((b, 3, image, image)).astype(np.float32)}

    n = sum(p.numel() for p in m.parameters()) / 1e6
    return Model(
        "resnet50", m, ["input"], "logits", inputs, batches,
        f"plain-torch ResNet-50 (Bottleneck [3,4,6,3], width {width}), {image}x{image}, {n:.1f}M params",
    )  # fmt: skip


def bert(
    torch: Any, hidden: int, layers: int, heads: int, ffn: int, seq: int, batches: list[int]
) -> Model:
    nn = torch.nn
    torch.manual_seed(60)
    try:
        from transformers import BertConfig, BertModel

        cfg = BertConfig(
            vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
            num_attention_heads=heads, intermediate_size=ffn, max_position_embeddings=512,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        )  # fmt: skip
        cfg._attn_implementation = "eager"
        inner = BertModel(cfg).eval()
        kind = "transformers BertModel"

        class Wrapped(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.m = inner

            def forward(self, ids: Any, mask: Any) -> Any:
                return self.m(
                    input_ids=ids, attention_mask=mask, return_dict=True
                ).last_hidden_state

        m = Wrapped().eval()
    except Exception as e:  # transformers missing or incompatible: the same shape in plain torch
        kind = f"plain-torch BERT encoder (transformers unavailable: {type(e).__name__})"

        class Layer(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.qkv = nn.Linear(hidden, 3 * hidden)
                self.o = nn.Linear(hidden, hidden)
                self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
                self.f1 = nn.Linear(hidden, ffn)
                self.f2 = nn.Linear(ffn, hidden)
                self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

            def forward(self, x: Any, bias: Any) -> Any:
                b, s, _ = x.shape
                q, k, v = self.qkv(x).view(b, s, 3, heads, hidden // heads).permute(2, 0, 3, 1, 4)
                a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hidden // heads) + bias, -1)
                x = self.ln1(x + self.o((a @ v).transpose(1, 2).reshape(b, s, hidden)))
                return self.ln2(x + self.f2(torch.nn.functional.gelu(self.f1(x))))

        class Encoder(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.tok = nn.Embedding(30522, hidden)
                self.pos = nn.Embedding(512, hidden)
                self.ln = nn.LayerNorm(hidden, eps=1e-12)
                self.layers = nn.ModuleList(Layer() for _ in range(layers))

            def forward(self, ids: Any, mask: Any) -> Any:
                x = self.ln(self.tok(ids) + self.pos.weight[: ids.shape[1]])
                bias = (1.0 - mask[:, None, None, :].float()) * -10000.0
                for layer in self.layers:
                    x = layer(x, bias)
                return x

        m = Encoder().eval()

    def inputs(b: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        mask = np.ones((b, seq), np.int64)
        mask[:, seq - seq // 4 :] = 0  # padded tails, so the mask matters
        return {
            "input_ids": rng.integers(0, 30522, (b, seq)).astype(np.int64),
            "attention_mask": mask,
        }

    return Model(
        "bert-base" if hidden == 768 else "bert-tiny", m, ["input_ids", "attention_mask"],
        "last_hidden_state", inputs, batches,
        f"{kind} (hidden {hidden}, {layers} layers, {heads} heads, ffn {ffn}), seq {seq}",
    )  # fmt: skip


def sd_unet(torch: Any, full: bool, latent: int, seq: int, batches: list[int]) -> Model:
    from diffusers import UNet2DConditionModel

    nn = torch.nn
    if full:  # SD 1.5's configuration (as examples/make_tiny_sd.py --full-unet)
        torch.manual_seed(15)
        cfg = dict(
            sample_size=64, layers_per_block=2, block_out_channels=(320, 640, 1280, 1280),
            down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
            up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
            cross_attention_dim=768, attention_head_dim=8, norm_num_groups=32,
        )  # fmt: skip
    else:  # the tiny fixture's configuration (tests/models/make_models.py)
        torch.manual_seed(7)
        cfg = dict(
            sample_size=16, block_out_channels=(16, 32), layers_per_block=1,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
            attention_head_dim=8, norm_num_groups=8,
        )  # fmt: skip
    unet = UNet2DConditionModel(in_channels=4, out_channels=4, **cfg).eval()
    g = torch.Generator().manual_seed(16)
    with torch.no_grad():  # diffusers zero-initialises some output layers: random instead
        for name, p in unet.named_parameters():
            if p.ndim >= 2 and torch.count_nonzero(p) == 0:
                p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(p[0].numel()))
            elif p.ndim == 1 and name.endswith("bias") and torch.count_nonzero(p) == 0:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    cross = cfg["cross_attention_dim"]

    class Wrapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.unet = unet

        def forward(self, sample: Any, timestep: Any, ehs: Any) -> Any:
            return self.unet(sample, timestep, ehs, return_dict=False)[0]

    def inputs(b: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {
            "sample": rng.standard_normal((b, 4, latent, latent)).astype(np.float32),
            "timestep": np.full((b,), 981, np.int64),
            "encoder_hidden_states": rng.standard_normal((b, seq, cross)).astype(np.float32),
        }

    n = sum(p.numel() for p in unet.parameters()) / 1e6
    return Model(
        "sd15-unet" if full else "sd-unet-tiny", Wrapped().eval(),
        ["sample", "timestep", "encoder_hidden_states"], "out_sample", inputs, batches,
        f"diffusers UNet2DConditionModel {'SD 1.5' if full else 'tiny fixture'} config, "
        f"{n:.1f}M params, latents 4x{latent}x{latent}, {seq} tokens",
    )  # fmt: skip


def export(torch: Any, m: Model, folder: Path, rng: np.random.Generator) -> Path:
    """TorchScript export with a dynamic batch axis; weights over 2 GB go to external files."""
    path = folder / f"{m.name}.onnx"
    example = m.inputs(2, rng)  # batch 2: a batch of 1 can get specialised into the trace
    args = tuple(torch.from_numpy(example[n]) for n in m.input_names)
    dyn = {n: {0: "batch"} for n in m.input_names}
    dyn[m.output_name] = {0: "batch"}
    with torch.no_grad(), warnings_off():
        torch.onnx.export(
            m.module, args, str(path), dynamo=False, opset_version=OPSET,
            input_names=m.input_names, output_names=[m.output_name], dynamic_axes=dyn,
            do_constant_folding=True,
        )  # fmt: skip
    return path


@contextlib.contextmanager
def warnings_off() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


# -- the three runners ------------------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dry = args.dry_run
        self.t0 = time.perf_counter()
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.rows: list[Row] = []
        self.torch = torch_or_none()
        self.cuda = cuda_problem(self.dry)

    def left(self) -> float:
        return self.args.budget - (time.perf_counter() - self.t0)

    def log(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t0:6.1f}s] {msg}", flush=True)

    def record(self, row: Row) -> None:
        self.rows.append(row)
        with open(self.out / "bench.jsonl", "a") as f:
            f.write(json.dumps(row.__dict__, default=str) + "\n")
        self.log(f"{row.model} b={row.batch}: " + summary(row))

    # -- ours -----------------------------------------------------------------------------------
    def ours(
        self, name: str, graph: Any, batch: int, feeds: dict[str, np.ndarray], tf32: bool
    ) -> tuple[float, np.ndarray, float | None]:
        """(median ms, output, arena MB) of our executor (CPU executor in a dry run)."""
        if self.dry:
            from kn_graph.reference import evaluate

            out = evaluate(graph, feeds)[0]
            ms, _ = median_ms(lambda: evaluate(graph, feeds), lambda: None, 5, 2.0)
            return ms, out, None
        import cupy as cp

        from kn_cuda_eval.cuda.device import CudaExecutor, ExecutorSettings

        ex = CudaExecutor(graph, batch_size=batch, settings=ExecutorSettings(tf32=tf32))
        try:
            dev = {k: cp.asarray(v) for k, v in feeds.items()}
            out = ex.eval(dev, return_device=True)[0].get()
            ms, _ = median_ms(
                lambda: ex.eval(dev, return_device=True),
                lambda: None,
                self.args.runs,
                self.args.seconds,
            )
            if ex.graph_error:
                self.log(f"  (CUDA graph capture failed: {ex.graph_error})")
            if not tf32 and self.args.profile:
                prof = ex.profile(dev)
                (self.out / "profiles.txt").open("a").write(
                    f"\n== {name} b={batch}\n{prof.table(top=25)}\n"
                )
            return ms, out, ex.arena_bytes / 2**20
        finally:
            ex.close()
            cp.get_default_memory_pool().free_all_blocks()

    # -- onnxruntime -----------------------------------------------------------------------------
    def ort(self, path: Path, feeds: dict[str, np.ndarray], tf32: bool) -> tuple[float | None, str]:
        try:
            import onnxruntime as ort
        except Exception as e:
            return None, f"onnxruntime not importable: {e}"
        provider = "CPUExecutionProvider" if self.dry else "CUDAExecutionProvider"
        if provider not in ort.get_available_providers():
            return (
                None,
                f"onnxruntime {ort.__version__} has no {provider} ({', '.join(ort.get_available_providers())})",
            )
        so = ort.SessionOptions()
        so.log_severity_level = 3
        opts = {} if self.dry else {"device_id": "0", "use_tf32": "1" if tf32 else "0"}
        sess = ort.InferenceSession(str(path), so, providers=[(provider, opts)])
        if self.dry:
            ms, _ = median_ms(lambda: sess.run(None, feeds), lambda: None, 5, 2.0)
            return ms, ""
        import cupy as cp

        io = sess.io_binding()
        keep = {}
        for name, a in feeds.items():
            d = cp.asarray(a)
            keep[name] = d
            io.bind_input(name, "cuda", 0, a.dtype.type, list(a.shape), int(d.data.ptr))
        for o in sess.get_outputs():
            io.bind_output(o.name, "cuda", 0)
        ms, _ = median_ms(
            lambda: sess.run_with_iobinding(io),
            io.synchronize_outputs,
            self.args.runs,
            self.args.seconds,
        )
        return ms, ""

    # -- torch eager -------------------------------------------------------------------------------
    def torch_runs(self, m: Model, feeds: dict[str, np.ndarray], row: Row) -> np.ndarray | None:
        torch = self.torch
        dev = "cpu" if self.dry else "cuda"
        mod = m.module.to(dev)
        xs = [torch.from_numpy(feeds[n]).to(dev) for n in m.input_names]
        sync = (lambda: None) if self.dry else torch.cuda.synchronize
        runs, secs = (5, 2.0) if self.dry else (self.args.runs, self.args.seconds)
        out = None
        for mode in ("f32", "tf32", "f16"):
            if self.dry and mode != "f32":
                continue
            if not self.dry:
                torch.backends.cuda.matmul.allow_tf32 = mode == "tf32"
                torch.backends.cudnn.allow_tf32 = mode == "tf32"
            ctx = (
                torch.autocast("cuda", torch.float16) if mode == "f16" else contextlib.nullcontext()
            )

            def call(ctx: Any = ctx) -> Any:
                with torch.inference_mode(), ctx:
                    return mod(*xs)

            if mode == "f32":
                if not self.dry:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                out = call().float().cpu().numpy()
            try:
                ms, _ = median_ms(call, sync, runs, secs)
            except Exception as e:
                row.skipped[f"torch {mode}"] = f"{type(e).__name__}: {str(e)[:120]}"
                continue
            if mode == "f32":
                row.torch_ms = ms
                if not self.dry:
                    row.torch_peak_mb = torch.cuda.max_memory_allocated() / 2**20
            elif mode == "tf32":
                row.torch_tf32_ms = ms
            else:
                row.torch_f16_ms = ms
        if not self.dry:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        m.module.to("cpu")
        if not self.dry:
            torch.cuda.empty_cache()
        return out

    # -- one model ----------------------------------------------------------------------------------
    def model(self, name: str, build: Callable[[], Model], min_seconds: float) -> None:
        dims = {"resnet50": [1, 64], "bert-base": [1, 32], "sd-unet-tiny": [2], "sd15-unet": [2]}
        if self.args.only and name not in self.args.only:
            return
        skip = None
        if self.cuda is not None:
            skip = f"no CUDA device: {self.cuda}"
        elif self.torch is None:
            skip = "torch is not installed (the models are built with it)"
        elif self.left() < min_seconds:
            skip = (
                f"time budget: {self.left():.0f} s left, this model needs about {min_seconds:.0f} s"
            )
        if skip is not None:
            for b in dims.get(name, [1]):
                self.record(Row(name, b, skipped={"all": skip}))
            return
        rng = np.random.default_rng(0)
        try:
            t = time.perf_counter()
            m = build()
            with tempfile.TemporaryDirectory(prefix=f"kn_{name}_") as tmp:
                path = export(self.torch, m, Path(tmp), rng)
                t_export = time.perf_counter() - t
                from kn_graph.onnx import load_onnx
                from kn_graph.optimizer import optimize

                t = time.perf_counter()
                graph = optimize(load_onnx(path))
                t_load = time.perf_counter() - t
                self.log(
                    f"{m.name}: built and exported in {t_export:.1f} s, loaded and optimized in {t_load:.1f} s ({len(graph)} values)"
                )
                for b in m.batches:
                    self.batch(
                        m, graph, path, b, rng, {"export_s": t_export, "load_optimize_s": t_load}
                    )
        except Exception as e:
            traceback.print_exc(file=(self.out / "errors.txt").open("a"))
            self.record(Row(name, 0, skipped={"all": f"error: {type(e).__name__}: {str(e)[:200]}"}))
        gc.collect()

    def batch(
        self,
        m: Model,
        graph: Any,
        path: Path,
        b: int,
        rng: np.random.Generator,
        extra: dict[str, Any],
    ) -> None:
        row = Row(m.name, b, note=m.note, extra=dict(extra))
        feeds = m.inputs(b, rng)
        ref = None
        try:
            ref = self.torch_runs(m, feeds, row)
        except Exception as e:
            row.skipped["torch"] = f"{type(e).__name__}: {str(e)[:200]}"
        for tf32 in (False, True):
            if self.dry and tf32:
                continue
            try:
                t = time.perf_counter()
                ms, out, arena = self.ours(m.name, graph, b, feeds, tf32)
                if tf32:
                    row.ours_tf32_ms = ms
                else:
                    row.ours_ms, row.arena_mb = ms, arena
                    row.extra["ours_prepare_and_time_s"] = time.perf_counter() - t
                    if ref is not None:
                        row.diff_vs_torch = rel_diff(out, ref)
            except Exception as e:
                traceback.print_exc(file=(self.out / "errors.txt").open("a"))
                row.skipped[f"ours{' tf32' if tf32 else ''}"] = (
                    f"{type(e).__name__}: {str(e)[:200]}"
                )
        for tf32 in (False, True):
            if self.dry and tf32:
                continue
            try:
                ms, why = self.ort(path, feeds, tf32)
                if ms is None:
                    row.skipped["onnxruntime"] = why
                    break
                if tf32:
                    row.ort_tf32_ms = ms
                else:
                    row.ort_ms = ms
            except Exception as e:
                row.skipped["onnxruntime"] = f"{type(e).__name__}: {str(e)[:200]}"
                break
        self.record(row)

    # -- overhead -----------------------------------------------------------------------------------
    def overhead(self) -> None:
        """A 1,000-step plan of tiny kernels: host submit time and wall time per evaluation."""
        if self.args.only and "overhead" not in self.args.only:
            return
        steps = 100 if self.dry else 1000
        if self.cuda is not None:
            self.record(
                Row(f"overhead-{steps}-steps", 1, skipped={"all": f"no CUDA device: {self.cuda}"})
            )
            return
        from kn_graph import DType, Graph, Shape, UnaryOp

        g = Graph()
        x = g.input(Shape.of(1, 32), DType.F32, "x")
        y = x
        for k in range(steps):
            y = g.unary(UnaryOp.SIN if k % 2 else UnaryOp.COS, y)
        g.add_output(y, "y")
        xv = np.ones((1, 32), np.float32)
        row = Row(
            f"overhead-{steps}-steps",
            1,
            note="1-element-wide chain of sin/cos, unfused: one kernel per step",
        )
        if self.dry:
            from kn_graph.reference import evaluate

            row.ours_ms, _ = median_ms(lambda: evaluate(g, [xv]), lambda: None, 5, 2.0)
            self.record(row)
            return
        from kn_cuda_eval import PlanSettings
        from kn_cuda_eval.cuda.device import CudaExecutor, ExecutorSettings

        for graphs in (True, False):
            sets = ExecutorSettings(cuda_graphs=graphs, plan=PlanSettings(fuse_elementwise=False))
            with CudaExecutor(g, settings=sets) as ex:
                for _ in range(3):
                    ex.eval([xv])
                subs, walls = [], []
                for _ in range(50):
                    t0 = time.perf_counter()
                    ex.run_device(sync=False)
                    t1 = time.perf_counter()
                    ex.synchronize()
                    subs.append(t1 - t0)
                    walls.append(time.perf_counter() - t0)
                ev, _ = median_ms(lambda: ex.eval([xv]), lambda: None, 50, 3.0)
                prof = ex.profile([xv])
                key = "graphs" if graphs else "steps"
                row.extra[f"{key}_submit_us"] = statistics.median(subs) * 1e6
                row.extra[f"{key}_wall_us"] = statistics.median(walls) * 1e6
                row.extra[f"{key}_eval_with_io_us"] = ev * 1e3
                row.extra["device_sum_of_steps_us"] = prof.total_ms * 1e3
                row.extra[f"{key}_uses_graph"] = ex.uses_cuda_graph
        row.ours_ms = row.extra["graphs_wall_us"] / 1e3
        self.record(row)


def fmt(v: float | None, digits: int = 2) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def summary(r: Row) -> str:
    if "all" in r.skipped:
        return f"skipped: {r.skipped['all']}"
    parts = [f"ours {fmt(r.ours_ms)} ms", f"ort {fmt(r.ort_ms)}", f"torch {fmt(r.torch_ms)}"]
    if r.diff_vs_torch is not None:
        parts.append(f"max|d|/max|ref| {r.diff_vs_torch:.2g}")
    if r.skipped:
        parts.append("; ".join(f"{k} skipped: {v}" for k, v in r.skipped.items()))
    if r.extra:
        parts.append(
            ", ".join(
                f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.extra.items()
            )
        )
    return ", ".join(parts)


def ratio(a: float | None, b: float | None) -> str:
    return "" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def table(rows: list[Row], dry: bool = False) -> str:
    dev = "CPU" if dry else "CUDA"
    head = (
        f"| model | batch | ours {dev} F32 ms | ORT {dev} F32 ms | torch {dev} F32 ms | ours/ORT "
        "| ours/torch | ours TF32 | ORT TF32 | torch TF32 | torch F16 | arena MiB | torch peak MiB "
        "| max abs diff / max ref |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    notes: list[str] = []
    reasons: dict[str, list[str]] = {}
    for r in rows:
        if "all" in r.skipped:
            why = r.skipped["all"]
            short = why.split(":")[0] if why.startswith(("no CUDA device", "error")) else why
            lines.append(f"| {r.model} | {r.batch} | skipped: {short} |" + " |" * 11)
            if short != why:
                reasons.setdefault(why, []).append(f"{r.model} b={r.batch}")
            continue
        diff = "" if r.diff_vs_torch is None else f"{r.diff_vs_torch:.1e}"
        lines.append(
            f"| {r.model} | {r.batch} | {fmt(r.ours_ms, 3)} | {fmt(r.ort_ms, 3)} | {fmt(r.torch_ms, 3)} "
            f"| {ratio(r.ours_ms, r.ort_ms)} | {ratio(r.ours_ms, r.torch_ms)} | {fmt(r.ours_tf32_ms, 3)} "
            f"| {fmt(r.ort_tf32_ms, 3)} | {fmt(r.torch_tf32_ms, 3)} | {fmt(r.torch_f16_ms, 3)} "
            f"| {fmt(r.arena_mb, 1)} | {fmt(r.torch_peak_mb, 1)} | {diff} |"
        )
        for k, v in r.skipped.items():
            notes.append(f"- {r.model} b={r.batch}: {k} skipped: {v}")
        if r.model.startswith("overhead") and r.extra:
            notes.append(
                f"- {r.model}: "
                + ", ".join(
                    f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in r.extra.items()
                )
            )
    notes += [f"- skipped ({', '.join(who)}): {why}" for why, who in reasons.items()]
    return "\n".join(lines + (["", *notes] if notes else []))


def versions(torch: Any) -> dict[str, str]:
    out: dict[str, str] = {"python": platform.python_version(), "numpy": np.__version__}
    try:
        from kn_cuda_eval.cuda.device import versions as kv

        out.update(kv(0))
    except Exception as e:
        out["kn_cuda_eval"] = f"unavailable: {e}"
    out["torch"] = getattr(torch, "__version__", "not installed")
    try:
        import onnxruntime as ort

        out["onnxruntime"] = f"{ort.__version__} ({', '.join(ort.get_available_providers())})"
    except Exception as e:
        out["onnxruntime"] = f"unavailable: {e}"
    for pkg in ("transformers", "diffusers"):
        try:
            out[pkg] = __import__(pkg).__version__
        except Exception as e:
            out[pkg] = f"unavailable: {type(e).__name__}"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp(prefix="kn_bench_"))
    ap.add_argument("--budget", type=float, default=240.0, help="seconds for the whole run")
    ap.add_argument("--runs", type=int, default=30, help="timed calls per measurement (at most)")
    ap.add_argument("--seconds", type=float, default=3.0, help="stop a measurement after this")
    ap.add_argument(
        "--only", type=lambda s: s.split(","), default=None, help="comma-separated rows"
    )
    ap.add_argument("--profile", action="store_true", help="write our per-step profiles")
    ap.add_argument("--dry-run", action="store_true", help="tiny models on the CPU (no GPU needed)")
    ap.add_argument("--table-from", type=Path, help="only print the table of a bench.jsonl")
    ap.add_argument(
        "--no-final-table", action="store_true", help="do not print the table at the end"
    )
    args = ap.parse_args()
    if args.table_from is not None:
        rows = [
            Row(**json.loads(line)) for line in args.table_from.read_text().splitlines() if line
        ]
        print(table(rows))
        return 0
    added = add_wheels()
    bench = Bench(args)
    torch = bench.torch
    if torch is not None:
        torch.set_num_threads(os.cpu_count() or 1)
    info = versions(torch)
    info["wheels added"] = ", ".join(added) or "none"
    info["date"] = datetime.date.today().isoformat()
    info["mode"] = "dry run (tiny models, CPU)" if args.dry_run else "GPU"
    (bench.out / "versions.json").write_text(json.dumps(info, indent=1))
    for k, v in info.items():
        print(f"{k:>22}: {v}")
    dry = args.dry_run
    bench.overhead()
    small = (8, 32, [1, 2]) if dry else (64, 224, [1, 64])
    enc = (64, 2, 4, 128, 16) if dry else (768, 12, 12, 3072, 128)
    bench.model("resnet50", lambda: resnet50(torch, *small), 30)
    bench.model("bert-base", lambda: bert(torch, *enc, [1, 2] if dry else [1, 32]), 40)
    bench.model(
        "sd-unet-tiny", lambda: sd_unet(torch, False, 16 if dry else 64, 8 if dry else 77, [2]), 20
    )
    if dry:
        bench.record(Row("sd15-unet", 2, skipped={"all": "--dry-run (full size only on the GPU)"}))
    else:
        bench.model("sd15-unet", lambda: sd_unet(torch, True, 64, 77, [2]), 90)
    text = table(bench.rows, dry)
    (bench.out / "bench_table.md").write_text(text + "\n")
    section = [
        f"\n## CUDA executor vs onnxruntime CUDA and PyTorch eager — {info['date']}\n",
        "Command: `bash benchmarks/gpu_check.sh` (`python benchmarks/gpu_vs_peers.py`). "
        + "; ".join(f"{k} {v}" for k, v in info.items() if k not in ("date",))
        + ".\n",
        "Median wall time per call, device-resident inputs and outputs, after warm-up; F32 unless the column says otherwise.\n",
        text,
    ]
    (bench.out / "results_section.md").write_text("\n".join(section) + "\n")
    if not args.no_final_table:
        print("\n" + text)
    print(f"\n(results in {bench.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
