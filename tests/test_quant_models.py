"""The quantized fixture corpus (tests/models/quant, made by tests/models/make_quant_models.py
with onnxruntime's own quantization tools: dynamic, static QDQ per tensor and per channel,
static QOperator, 4-bit MatMulNBits): each model loads with its dynamic dims symbolic, and the
reference executor and the CPU device match onnxruntime's stored outputs at every data set.

The stored outputs are onnxruntime's node by node (its graph optimizations off): with them on,
onnxruntime fuses QDQ groups into integer kernels that requantize with their own rounding, a
different computation than the model's nodes (the npz's fused{k} outputs; the manifest's
max_abs_fused_vs_nodewise says how far)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kn_graph.onnx import load_onnx
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.paths import MODELS

QUANT = MODELS / "quant"
MANIFEST = json.loads((QUANT / "manifest.json").read_text())
FIXTURES = MANIFEST["fixtures"]

OUTPUT_UNITS = 4
"""Bound of a quantized output, in units of its scale, for the graph as loaded. Node by node,
our arithmetic is the model's: dequantize, the float op, quantize. What differs is float
evaluation order (the CPU device's fused kernels, oneDNN's convolution sums): an activation at
a rounding tie may land one unit over, and that unit reaches the output through the following
layers scaled by their weights, a few output units at most (measured: at most 1). The same
bound holds for the optimized graph: the optimizer leaves a quantization's arithmetic as written
(kn_graph.optimizer.patterns.feeds_round); before it did, reciprocal multiplies and collapsed
chains moved ties and MobileNetV2's output drifted by 18 units."""

FLOAT_SHARE = 0.02
"""Bound of an output that is no quantized value (dynamic quantization, 4-bit weights, a float
op after the last DequantizeLinear), as a share of the output's largest magnitude: a one-unit
flip of a dynamically quantized activation is 1/255 of its range, and it moves the next
layer's output by about as much; over a few layers, 2%."""


CASES = [pytest.param(fx, id=fx["name"]) for fx in FIXTURES]


def test_corpus_covers_every_recipe() -> None:
    recipes = {(fx["recipe"], fx["options"].get("format")) for fx in FIXTURES}
    assert recipes >= {
        ("dynamic", None),
        ("static", "QDQ"),
        ("static", "QOperator"),
        ("nbits", None),
    }, recipes


@pytest.mark.parametrize("fx", CASES)
def test_quantized_fixture_matches_onnxruntime(fx: dict) -> None:
    graph = load_onnx(QUANT / fx["file"])  # once: every data set binds its own dims
    data = np.load(QUANT / fx["reference"])
    cpu = Device.cpu()
    as_loaded, optimized = cpu.prepare(graph, optimize=False), cpu.prepare(graph)
    for k, ds in enumerate(fx["datasets"]):
        feed = {n: data[f"in{k}:{n}"] for n in graph.input_names}
        want = [data[f"out{k}:{n}"] for n in graph.output_names]
        runs = [("reference", evaluate(graph, feed), OUTPUT_UNITS)]
        runs.append(("cpu", optimized.eval(feed), OUTPUT_UNITS))
        if k == 0:  # the graph as loaded at one binding: each binding compiles its own kernels
            runs.append(("cpu as loaded", as_loaded.eval(feed), OUTPUT_UNITS))
        for who, outs, units in runs:
            for name, got, ref in zip(graph.output_names, outs, want, strict=True):
                scale = ds["outputs"][name].get("output_scale")
                bound = units * scale if scale else FLOAT_SHARE * float(np.max(np.abs(ref)))
                _compare(f"{fx['name']} data set {k} {who} output {name}", got, ref, bound)


def _compare(where: str, got: np.ndarray, ref: np.ndarray, bound: float) -> None:
    assert got.shape == ref.shape and got.dtype == ref.dtype, (where, got.shape, ref.shape)
    err = float(np.max(np.abs(got.astype(np.float64) - ref)))
    assert err <= bound, f"{where}: max abs diff {err:.4g} > {bound:.4g}"
    if got.ndim == 2 and ref.shape[-1] > 1:
        # the class (or strongest feature): where onnxruntime's first two are further apart
        # than twice the bound, no output within the bound can swap them
        top2 = np.sort(ref, axis=-1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 2 * bound
        agree = got.argmax(-1) == ref.argmax(-1)
        assert np.all(agree[clear]), f"{where}: top-1 differs in rows {np.flatnonzero(~agree)}"


@pytest.mark.parametrize("fx", CASES)
def test_quantized_fixture_on_the_plan_emulator_and_the_fake_cuda_device(fx: dict) -> None:
    """The optimized graph planned for data set 0 (integer products as exact float64 GEMMs and
    convolutions, kn_graph.integer), run by the plan emulator and by the CUDA executor on the
    fake device, within the same bounds of onnxruntime's outputs."""
    from kn_cuda_eval import emulate, plan
    from kn_graph.binding import bind_shapes
    from kn_graph.optimizer import optimize
    from tests.kn_cuda_eval.helpers import run_fake

    graph = optimize(load_onnx(QUANT / fx["file"]))
    data = np.load(QUANT / fx["reference"])
    ds = fx["datasets"][0]
    feed = {n: data[f"in0:{n}"] for n in graph.input_names}
    want = [data[f"out0:{n}"] for n in graph.output_names]
    p = plan(graph, bindings=bind_shapes(graph, feed))
    for who, outs in (("emulator", emulate(p, feed)), ("fake cuda", run_fake(p, feed))):
        for name, got, ref in zip(graph.output_names, outs, want, strict=True):
            scale = ds["outputs"][name].get("output_scale")
            bound = OUTPUT_UNITS * scale if scale else FLOAT_SHARE * float(np.max(np.abs(ref)))
            _compare(f"{fx['name']} {who} output {name}", got, ref, bound)


@pytest.mark.cuda
@pytest.mark.parametrize("fx", CASES)
def test_quantized_fixture_on_the_gpu(fx: dict) -> None:
    """The same on a real CUDA device (integer products as float64 cuBLAS / cuDNN steps)."""
    from kn_cuda_eval import plan
    from kn_cuda_eval.cuda.device.executor import CudaExecutor
    from kn_graph.binding import bind_shapes
    from kn_graph.optimizer import optimize
    from tests.kn_cuda_eval.helpers import need_gpu

    need_gpu()
    graph = optimize(load_onnx(QUANT / fx["file"]))
    data = np.load(QUANT / fx["reference"])
    for k, ds in enumerate(fx["datasets"]):
        feed = {n: data[f"in{k}:{n}"] for n in graph.input_names}
        with CudaExecutor.from_plan(plan(graph, bindings=bind_shapes(graph, feed))) as ex:
            outs = ex.eval(feed)
        for name, got in zip(graph.output_names, outs, strict=True):
            ref = data[f"out{k}:{name}"]
            scale = ds["outputs"][name].get("output_scale")
            bound = OUTPUT_UNITS * scale if scale else FLOAT_SHARE * float(np.max(np.abs(ref)))
            _compare(f"{fx['name']} data set {k} on the GPU output {name}", got, ref, bound)
