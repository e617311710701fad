#!/usr/bin/env python3
"""Developer-run generator of the quantized fixture models (tests/models/quant/).

Not run by CI. It quantizes float fixtures of tests/models (made by make_models.py) with
onnxruntime's own quantization tools, as a user of onnxruntime would, and writes next to this
file, in quant/ (or into ``--out``):

* ``<name>.onnx``     the quantized model, weights embedded
* ``<name>.npz``      for every data set k of the float fixture: ``in{k}:<input>`` (the float
                      fixture's inputs) and ``out{k}:<output>``, onnxruntime's outputs of the
                      quantized model run node by node (graph optimizations off), the layout
                      of make_models.py's fixtures; and ``fused{k}:<output>``, onnxruntime's
                      outputs with its default optimizations

Why node by node: with its optimizations on, onnxruntime fuses DequantizeLinear → Conv →
QuantizeLinear into QLinearConv (and MatMul likewise), integer kernels that requantize with
their own rounding; a one-unit difference in an early activation then grows through the
network (0.6 on logits of magnitude 1.5 for mobilenetv2_qdq_per_channel). Node by node, every
op is onnxruntime's kernel for that op, which is what a loader's handlers are compared with.
The manifest records how far the fused outputs are (``max_abs_fused_vs_nodewise``).
* ``manifest.json``   one entry per fixture: source fixture, recipe, op types with their
                      domains and counts, data sets (bindings, input/output dtypes and shapes),
                      and how far the quantized outputs are from the float ones

Where integer kernels run (QOperator, dynamic quantization) with u8 activations and int8
weights, the recipes set ``reduce_range`` (7-bit weights): onnxruntime's u8 x s8 kernels on x86
CPUs without VNNI add pairs of products in saturating int16 (``vpmaddubsw``), so with 8-bit
weights its outputs are clipped sums on such CPUs and exact ones on others; 7-bit weights make
them exact everywhere, which is what our exact integer ops are compared with
(tests/kn_graph/onnx/test_quant_gemm.py checks full-range weights against exact sums).

Recipes (``RECIPES``): ``quantize_dynamic`` (weights int8/uint8 ahead of time, activations
quantized at run time: DynamicQuantizeLinear + MatMulInteger / ConvInteger); ``quantize_static``
calibrated with MinMax on a few random but structured inputs (smooth images; token ids with
padding), in ``QuantFormat.QDQ`` per tensor and per channel and in ``QuantFormat.QOperator``
(QLinearConv, QLinearMatMul, QLinearAdd, ... of the com.microsoft domain); and 4-bit MatMul
weights with ``matmul_nbits_quantizer.MatMulNBitsQuantizer`` (block size 32, symmetric and
asymmetric) on the transformers.

How to run (from the repository root; onnx_ir is what the MatMulNBits quantizer needs)::

    python3 -m venv /tmp/venv-q
    /tmp/venv-q/bin/pip install onnxruntime==1.32.0 onnx==1.23.2 onnx-ir numpy
    /tmp/venv-q/bin/python tests/models/make_quant_models.py [--out DIR] [--only NAME ...]

Everything is seeded. Each fixture is checked: every output finite with a nonzero spread,
within a loose bound of the float model's output (quantization error, not a wrong model),
the .onnx file under 2 MB. Versions used for the committed fixtures: onnxruntime 1.32.0,
onnx 1.23.2, onnx-ir 1.1.0, numpy 2.4.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "quant")
MAX_ONNX_BYTES = 2 * 1024 * 1024
CALIBRATION_SAMPLES = 8
MAX_REL_ERR = 0.5
"""A quantized output further than this (max abs diff / max abs float output) from the float
model's is a broken recipe, not quantization error."""

Feed = dict[str, np.ndarray]


# -- calibration inputs ----------------------------------------------------------------------------
def smooth_images(rng: np.random.Generator, n: int) -> Iterator[Feed]:
    """Images with structure at several scales (upsampled coarse noise plus fine noise),
    roughly zero mean and unit spread like the fixtures' normalized inputs; every other one
    has a larger share of pixel noise, as the float fixtures' data sets are white noise (the
    calibrated ranges must cover them)."""
    for i in range(n):
        coarse = rng.standard_normal((1, 3, 8, 8))
        mid = rng.standard_normal((1, 3, 16, 16))
        img = np.kron(coarse, np.ones((8, 8))) + 0.5 * np.kron(mid, np.ones((4, 4)))
        img += (0.3 if i % 2 else 2.0) * rng.standard_normal(img.shape)
        yield {"input": (img / img.std()).astype(np.float32)}


def token_batches(names: tuple[str, ...]) -> Callable[[np.random.Generator, int], Iterator[Feed]]:
    """Token ids (vocabulary 1000, as the fixtures), right padding, BERT's segment ids."""

    def make(rng: np.random.Generator, n: int) -> Iterator[Feed]:
        for i in range(n):
            s = int(rng.integers(5, 13))
            mask = np.ones((1, s), np.int64)
            mask[0, s - i % 3 :] = 0  # 0, 1 or 2 padding positions
            segments = np.zeros((1, s), np.int64)
            segments[:, s // 2 :] = 1
            feed = {
                "input_ids": rng.integers(0, 1000, (1, s), dtype=np.int64),
                "attention_mask": mask,
                "token_type_ids": segments,
            }
            yield {k: feed[k] for k in names}

    return make


SOURCES: dict[str, Callable[[np.random.Generator, int], Iterator[Feed]]] = {
    "resnet18_ts": smooth_images,
    "mobilenetv2_ts": smooth_images,
    "bert_ts": token_batches(("input_ids", "attention_mask", "token_type_ids")),
    "gpt2_ts": token_batches(("input_ids", "attention_mask")),
}

# name, source fixture, recipe, options
RECIPES: list[tuple[str, str, str, dict[str, object]]] = [
    ("resnet18_dynamic", "resnet18_ts", "dynamic", {"weight_type": "QUInt8"}),
    ("resnet18_qdq", "resnet18_ts", "static", {"format": "QDQ", "per_channel": False}),
    ("resnet18_qdq_per_channel", "resnet18_ts", "static", {"format": "QDQ", "per_channel": True}),
    ("resnet18_qoperator", "resnet18_ts", "static", {"format": "QOperator", "reduce_range": True}),
    (
        "mobilenetv2_qdq_per_channel",
        "mobilenetv2_ts",
        "static",
        {"format": "QDQ", "per_channel": True},
    ),
    (
        "mobilenetv2_qoperator",
        "mobilenetv2_ts",
        "static",
        {"format": "QOperator", "reduce_range": True},
    ),
    ("bert_dynamic", "bert_ts", "dynamic", {"weight_type": "QInt8", "reduce_range": True}),
    ("bert_qdq", "bert_ts", "static", {"format": "QDQ", "per_channel": False}),
    ("bert_qoperator", "bert_ts", "static", {"format": "QOperator", "reduce_range": True}),
    ("bert_nbits_sym", "bert_ts", "nbits", {"symmetric": True}),
    ("bert_nbits_asym", "bert_ts", "nbits", {"symmetric": False}),
    ("gpt2_dynamic", "gpt2_ts", "dynamic", {"weight_type": "QInt8", "reduce_range": True}),
    ("gpt2_qdq_per_channel", "gpt2_ts", "static", {"format": "QDQ", "per_channel": True}),
    ("gpt2_nbits_sym", "gpt2_ts", "nbits", {"symmetric": True}),
    ("gpt2_nbits_asym", "gpt2_ts", "nbits", {"symmetric": False}),
]


# -- quantization ----------------------------------------------------------------------------------
def quantize(src: str, dst: str, recipe: str, opts: dict[str, object], seed: int) -> None:
    from onnxruntime import quantization as q

    match recipe:
        case "dynamic":
            q.quantize_dynamic(
                src,
                dst,
                weight_type=getattr(q.QuantType, str(opts["weight_type"])),
                reduce_range=bool(opts.get("reduce_range", False)),
            )
        case "static":
            name = os.path.basename(src).removesuffix(".onnx")
            reader = Calibration(SOURCES[name](np.random.default_rng(seed), CALIBRATION_SAMPLES))
            qdq = opts["format"] == "QDQ"
            q.quantize_static(
                src,
                dst,
                reader,
                quant_format=q.QuantFormat.QDQ if qdq else q.QuantFormat.QOperator,
                per_channel=bool(opts.get("per_channel", False)),
                # QDQ: signed activations (onnxruntime's default); QOperator: the u8 x s8 pair
                # its x86 kernels run fastest
                activation_type=q.QuantType.QInt8 if qdq else q.QuantType.QUInt8,
                weight_type=q.QuantType.QInt8,
                reduce_range=bool(opts.get("reduce_range", False)),
            )
        case "nbits":
            import onnx
            from onnxruntime.quantization.matmul_nbits_quantizer import (
                DefaultWeightOnlyQuantConfig,
                MatMulNBitsQuantizer,
            )

            config = DefaultWeightOnlyQuantConfig(
                block_size=32, is_symmetric=bool(opts["symmetric"])
            )
            quantizer = MatMulNBitsQuantizer(gemm_as_matmul(onnx.load(src)), algo_config=config)
            quantizer.process()
            quantizer.model.save_model_to_file(dst, use_external_data_format=False)
        case _:
            raise ValueError(f"unknown recipe {recipe}")


def gemm_as_matmul(model):
    """Gemm(A, B, C) with a constant B (torch's addmm: GPT-2's Conv1D, BERT's pooler) as
    MatMul(A, B') + C, B' = alpha · B (transposed for transB): the MatMulNBits quantizer only
    takes MatMul nodes. The rest of the graph is left as it was."""
    from onnx import helper, numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    nodes = []
    for n in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type != "Gemm" or n.input[1] not in inits or attrs.get("transA", 0):
            nodes.append(n)
            continue
        w = numpy_helper.to_array(inits[n.input[1]])
        w = (w.T if attrs.get("transB", 0) else w) * np.float32(attrs.get("alpha", 1.0))
        inits[n.input[1]].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(w), n.input[1]))
        product = n.output[0] + "_matmul"
        nodes.append(helper.make_node("MatMul", n.input[:2], [product], n.name + "_matmul"))
        if len(n.input) > 2 and n.input[2]:
            beta = np.float32(attrs.get("beta", 1.0))
            c = n.input[2]
            if beta != 1.0:
                c = n.input[2] + "_beta"
                nodes.append(helper.make_node("Mul", [n.input[2], beta_name(model, beta)], [c]))
            nodes.append(helper.make_node("Add", [product, c], [n.output[0]], n.name + "_add"))
        else:
            nodes.append(helper.make_node("Identity", [product], [n.output[0]]))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def beta_name(model, beta: np.float32) -> str:
    from onnx import numpy_helper

    name = f"gemm_beta_{float(beta)}"
    if all(t.name != name for t in model.graph.initializer):
        model.graph.initializer.append(numpy_helper.from_array(np.array(beta), name))
    return name


class Calibration:
    """onnxruntime's CalibrationDataReader over a list of feeds."""

    def __init__(self, feeds: Iterator[Feed]) -> None:
        self.feeds = iter(list(feeds))

    def get_next(self) -> Feed | None:
        return next(self.feeds, None)

    def rewind(self) -> None:  # not needed by MinMax; part of the protocol
        pass


def op_counts(model) -> Counter[str]:
    """Node op types (domain::op outside ONNX's domain), subgraphs included."""
    counts: Counter[str] = Counter()
    stack = [model.graph]
    while stack:
        g = stack.pop()
        for n in g.node:
            counts[n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"] += 1
            for a in n.attribute:
                stack.extend([a.g] if a.HasField("g") else [])
                stack.extend(a.graphs)
    return counts


def output_scales(model) -> dict[str, float]:
    """Graph outputs made by a DequantizeLinear with a constant per-tensor scale: that scale
    (one unit of the quantized value the output was)."""
    from onnx import numpy_helper

    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    made = {o: n for n in model.graph.node for o in n.output}
    out = {}
    for o in model.graph.output:
        n = made.get(o.name)
        if n is not None and n.op_type == "DequantizeLinear" and inits.get(n.input[1]) is not None:
            scale = inits[n.input[1]]
            if scale.size == 1:
                out[o.name] = float(scale.reshape(()))
    return out


def make_fixture(name: str, source: str, recipe: str, opts: dict, out: str, seed: int) -> dict:
    import onnx
    import onnxruntime as ort

    src = os.path.join(HERE, source + ".onnx")
    dst = os.path.join(out, name + ".onnx")
    with tempfile.TemporaryDirectory() as tmp:  # the calibrator's augmented model goes here
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            quantize(src, dst, recipe, opts, seed)
        finally:
            os.chdir(cwd)
    size = os.path.getsize(dst)
    if size > MAX_ONNX_BYTES:
        raise RuntimeError(f"{name}: {size} bytes, over {MAX_ONNX_BYTES}")
    model = onnx.load(dst)
    counts = op_counts(model)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    fused = ort.InferenceSession(dst, so, providers=["CPUExecutionProvider"])
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(dst, so, providers=["CPUExecutionProvider"])
    scales = output_scales(model)
    inputs = [i.name for i in sess.get_inputs()]
    outputs = [o.name for o in sess.get_outputs()]
    ref = np.load(os.path.join(HERE, source + ".npz"))
    npz: dict[str, np.ndarray] = {}
    datasets = []
    k = 0
    while f"in{k}:{inputs[0]}" in ref:
        feed = {n: ref[f"in{k}:{n}"] for n in inputs}
        ds: dict[str, object] = {"inputs": {}, "outputs": {}}
        for n, a in feed.items():
            npz[f"in{k}:{n}"] = a
            ds["inputs"][n] = {"dtype": str(a.dtype), "shape": list(a.shape)}
        fused_out = fused.run(outputs, feed)
        for n, got, f in zip(outputs, sess.run(outputs, feed), fused_out, strict=True):
            want = ref[f"out{k}:{n}"]
            if not np.all(np.isfinite(got)) or float(np.std(got)) == 0.0:
                raise RuntimeError(f"{name}: degenerate output {n}")
            err = float(np.max(np.abs(got - want))) / float(np.max(np.abs(want)))
            if err > MAX_REL_ERR:
                raise RuntimeError(f"{name}: output {n} is {err:.3g} (relative) from the float's")
            npz[f"out{k}:{n}"] = got
            npz[f"fused{k}:{n}"] = f
            info = {
                "dtype": str(got.dtype),
                "shape": list(got.shape),
                "rel_err_vs_float": err,
                "max_abs_fused_vs_nodewise": float(np.max(np.abs(f - got))),
            }
            if n in scales:
                info["output_scale"] = scales[n]
            if n == "logits":  # does the quantized model pick the float model's class?
                info["top1_agrees_with_float"] = float(np.mean(got.argmax(-1) == want.argmax(-1)))
            ds["outputs"][n] = info
        datasets.append(ds)
        k += 1
    npz_path = os.path.join(out, name + ".npz")
    np.savez(npz_path, **npz)
    print(f"  {name}: {size / 1024:.0f} KB, {sum(counts.values())} nodes")
    for op, c in sorted(counts.items()):
        print(f"      {c:4d} {op}")
    for ds in datasets:
        for n, info in ds["outputs"].items():
            print(f"      {n}: {info}")
    return OrderedDict(
        name=name,
        file=name + ".onnx",
        reference=name + ".npz",
        source=source,
        recipe=recipe,
        options=opts,
        opset_imports={(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        input_names=inputs,
        output_names=outputs,
        datasets=datasets,
        op_counts=dict(sorted(counts.items())),
        onnx_bytes=size,
        npz_bytes=os.path.getsize(npz_path),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=OUT, help="output directory (default: tests/models/quant)")
    ap.add_argument("--only", nargs="*", help="only these fixtures (their entries are replaced)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    os.makedirs(args.out, exist_ok=True)

    import onnx
    import onnxruntime

    versions = {"onnxruntime": onnxruntime.__version__, "onnx": onnx.__version__}
    try:
        import onnx_ir

        versions["onnx_ir"] = onnx_ir.__version__
    except ImportError:
        pass
    versions["numpy"] = np.__version__
    print("versions:", versions)
    manifest_path = os.path.join(args.out, "manifest.json")
    old = {}
    if args.only and os.path.exists(manifest_path):
        with open(manifest_path) as f:
            old = {e["name"]: e for e in json.load(f)["fixtures"]}
    entries, failed = [], {}
    for i, (name, source, recipe, opts) in enumerate(RECIPES):
        if args.only and name not in args.only:
            if name in old:
                entries.append(old[name])
            continue
        print(f"== {name} ({recipe} {opts} of {source})")
        try:
            entries.append(make_fixture(name, source, recipe, opts, args.out, 500 + i))
        except Exception as e:  # recorded, and the other fixtures still made
            logging.exception("%s failed", name)
            failed[name] = f"{type(e).__name__}: {e}"
    manifest = OrderedDict(
        generator="tests/models/make_quant_models.py",
        versions=versions,
        npz_layout="for data set k: in{k}:<input name>, out{k}:<output name>; outputs computed "
        "by onnxruntime from the quantized model; inputs are the float fixture's",
        fixtures=entries,
        failed=failed,
    )
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    for n, why in failed.items():
        print(f"FAILED {n}: {why}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
