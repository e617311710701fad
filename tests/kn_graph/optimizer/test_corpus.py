"""The optimizer on the whole fixture corpus (tests/models): the optimized graph computes what
the unoptimized graph computes and what onnxruntime computed, and the expected fusions happen
on real exports (batchnorm into convolutions, every layernorm of BERT detected)."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import numpy as np
import onnx
import pytest

from kn_graph import Graph
from kn_graph.onnx import load_onnx
from kn_graph.ops import Binary, BinaryOp, Broadcast, Constant, Conv, Value, View
from kn_graph.optimizer import optimize
from kn_graph.reference import evaluate
from tests.kn_cuda_eval.corpus import cases
from tests.kn_graph.optimizer.util import op_counts
from tests.paths import MODELS

MANIFEST = json.loads((MODELS / "manifest.json").read_text())
FIXTURES = {f["name"]: f for f in MANIFEST["fixtures"]}
REL_TOL = 1e-4
BN_FIXTURES = ["resnet18_ts_bn", "mobilenetv2_ts", "mobilenetv2_dynamo"]


@cache
def _graphs(name: str) -> tuple[Graph, Graph]:
    """(loaded, optimized); a fixture that does not load fails the test that asks for it."""
    g = load_onnx(MODELS / FIXTURES[name]["file"])
    return g, optimize(g)


@pytest.mark.parametrize("name", list(FIXTURES))
def test_optimized_fixture_matches_unoptimized_and_onnxruntime(name: str) -> None:
    fx = FIXTURES[name]
    data = np.load(MODELS / fx["reference"])
    for k, (g, feed, _) in enumerate(cases(name)):  # one graph unless values decide shapes
        o = optimize(g)
        print(f"{name}: {len(g)} values -> {len(o)} after optimize")
        assert len(o) <= len(g)
        plain, optimized = evaluate(g, feed), evaluate(o, feed)
        for out, want, got in zip(g.output_names, plain, optimized, strict=True):
            ref = data[f"out{k}:{out}"]
            assert got.shape == ref.shape and got.dtype == ref.dtype, (out, got.shape, ref.shape)
            scale = float(np.max(np.abs(ref))) or 1.0
            vs_ref = float(np.max(np.abs(got.astype(np.float64) - ref))) / scale
            vs_plain = float(np.max(np.abs(got.astype(np.float64) - want))) / scale
            assert vs_ref <= REL_TOL, (
                f"{name} data set {k} output {out}: {vs_ref:.3g} from onnxruntime"
            )
            assert vs_plain <= REL_TOL, (
                f"{name} data set {k} output {out}: {vs_plain:.3g} from unoptimized"
            )


def _is_constant(g: Graph, v: Value) -> bool:
    while True:
        match g[v].op:
            case View(x) | Broadcast(x):
                v = x
            case Constant():
                return True
            case _:
                return False


@pytest.mark.parametrize("name", BN_FIXTURES)
def test_no_batchnorm_arithmetic_survives_outside_convolution_weights(name: str) -> None:
    """No Mul/Div/Sub by a constant anywhere, and every Add of a constant is the one bias of a
    convolution (or of the classifier's matmul)."""
    _, o = _graphs(name)
    for v in o.values():
        match o[v].op:
            case Binary(a, b, op) if _is_constant(o, a) or _is_constant(o, b):
                assert op in (BinaryOp.ADD, BinaryOp.MIN, BinaryOp.MAX), o.format_value(v)
                if op is BinaryOp.ADD:
                    base = b if _is_constant(o, a) else a
                    assert o[base].op.NAME in ("conv", "matmul", "view"), o.format_value(v)
    counts = op_counts(o)
    assert counts["add"] - _residual_adds(o) <= counts["conv"] + 1


def _residual_adds(g: Graph) -> int:
    return sum(
        1
        for v in g.values()
        if isinstance(op := g[v].op, Binary)
        and op.op is BinaryOp.ADD
        and not (_is_constant(g, op.a) or _is_constant(g, op.b))
    )


def test_batchnorm_resnet_optimizes_to_the_exporter_folded_resnet() -> None:
    """resnet18_ts_bn keeps BatchNormalization nodes; resnet18_ts had them folded by the
    exporter. Optimized, both must have exactly the same ops."""
    _, with_bn = _graphs("resnet18_ts_bn")
    _, folded = _graphs("resnet18_ts")
    assert op_counts(with_bn) == op_counts(folded)
    assert sum(isinstance(with_bn[v].op, Conv) for v in with_bn.values()) == 20


def _bert_layers(path: Path) -> int:
    """Encoder layers, from the node names TorchScript writes (/model/encoder/layer.1/…)."""
    model = onnx.load(path, load_external_data=False)
    names = [n.name for n in model.graph.node]
    return len({m.group(1) for n in names if (m := re.search(r"/encoder/layer\.(\d+)/", n))})


def test_every_bert_layernorm_is_detected() -> None:
    """Opset 14 has no LayerNormalization: TorchScript writes the arithmetic. Two per layer and
    one after the embeddings must all become Layernorm ops."""
    fx = FIXTURES["bert_ts_opset14"]
    layers = _bert_layers(MODELS / fx["file"])
    assert layers >= 1
    _, o = _graphs("bert_ts_opset14")
    counts = op_counts(o)
    assert counts["layernorm"] == 2 * layers + 1
    assert counts["reduce_mean"] == 0 and counts["sqrt"] == 0 and counts["pow"] == 0


@pytest.mark.parametrize(
    "name", ["bert_ts", "bert_ts_opset14", "bert_dynamo", "gpt2_ts", "gpt2_dynamo"]
)
def test_every_gelu_is_detected(name: str) -> None:
    counts = op_counts(_graphs(name)[1])
    assert counts["erf"] == 0
    assert counts["gelu"] + counts["gelu_tanh"] == 2  # one per layer
    if name.startswith("gpt2"):
        assert counts["tanh"] == 0


@pytest.mark.parametrize(
    "name", ["llama_ts", "llama_dynamo", "sd_unet_tiny", "sd_vae_decoder_tiny"]
)
def test_every_silu_is_detected(name: str) -> None:
    counts = op_counts(_graphs(name)[1])
    assert counts["sigmoid"] == 0 and counts["silu"] > 0
