"""Quantized variants of the real-size benchmark models, made with onnxruntime's own tools (as a
user of onnxruntime makes them) from the float exports of `real_models.py`:

- `qdq_per_channel`: `quantize_static`, QDQ format, per-channel int8 weights, int8 activations
  calibrated (MinMax) on 16 smooth random images; `reduce_range` (7-bit weights), onnxruntime's
  advice for CPUs without VNNI, where its u8 x s8 kernels clip 8-bit weights;
- `qdq`: the same, per tensor;
- `dynamic`: `quantize_dynamic` with int8 weights (reduce_range as above);
- `nbits`: `MatMulNBitsQuantizer`, 4-bit weights in blocks of 32, symmetric (Gemm rewritten as
  MatMul + Add first: the quantizer skips Gemm).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

__all__ = ["RECIPES", "quantize"]

RECIPES = ("qdq_per_channel", "qdq", "dynamic", "nbits")


def smooth_images(shape: tuple[int, ...], n: int, seed: int) -> Iterator[dict[str, np.ndarray]]:
    """Images with structure (low-frequency noise, normalized like ImageNet inputs), not white
    noise: calibration ranges then look like real activations'."""
    rng = np.random.default_rng(seed)
    b, c, h, w = shape
    for _ in range(n):
        small = rng.standard_normal((b, c, h // 16 + 1, w // 16 + 1)).astype(np.float32)
        big = small.repeat(16, axis=2).repeat(16, axis=3)[:, :, :h, :w]
        for axis in (2, 3):  # a 9-tap box blur along each spatial axis
            big = np.apply_along_axis(_blur, axis, big)
        yield {"input": big.astype(np.float32)}


def _blur(v: np.ndarray) -> np.ndarray:
    return np.convolve(v, np.ones(9, np.float32) / 9, mode="same")


def _gemm_as_matmul(model):
    """Gemm (transB allowed, alpha = beta = 1) as MatMul + Add, which the 4-bit quantizer takes."""
    import onnx
    from onnx import helper, numpy_helper

    inits = {t.name: t for t in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type != "Gemm" or attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0:
            nodes.append(node)
            continue
        a, b = node.input[0], node.input[1]
        if attrs.get("transB", 0):
            w = numpy_helper.to_array(inits[b]).T.copy()
            b = f"{b}_t"
            model.graph.initializer.append(numpy_helper.from_array(w, b))
        out = node.output[0]
        if len(node.input) > 2 and node.input[2]:
            nodes.append(helper.make_node("MatMul", [a, b], [f"{out}_mm"]))
            nodes.append(helper.make_node("Add", [f"{out}_mm", node.input[2]], [out]))
        else:
            nodes.append(helper.make_node("MatMul", [a, b], [out]))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.checker.check_model(model)
    return model


def quantize(src: Path, dst: Path, recipe: str, input_shape: tuple[int, ...]) -> None:
    """Write the `recipe` variant of the float model `src` to `dst`."""
    import onnx
    from onnxruntime import quantization as q

    tmp = dst.with_suffix(".tmp.onnx")
    if recipe in ("qdq_per_channel", "qdq"):

        class Reader(q.CalibrationDataReader):
            def __init__(self) -> None:
                self.it = smooth_images(input_shape, 16, 0)

            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(self.it, None)

        q.quantize_static(
            str(src),
            str(tmp),
            Reader(),
            quant_format=q.QuantFormat.QDQ,
            per_channel=recipe == "qdq_per_channel",
            activation_type=q.QuantType.QInt8,
            weight_type=q.QuantType.QInt8,
            reduce_range=True,
        )
    elif recipe == "dynamic":
        q.quantize_dynamic(str(src), str(tmp), weight_type=q.QuantType.QInt8, reduce_range=True)
    elif recipe == "nbits":
        from onnxruntime.quantization.matmul_nbits_quantizer import (
            DefaultWeightOnlyQuantConfig,
            MatMulNBitsQuantizer,
        )

        config = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=True)
        quantizer = MatMulNBitsQuantizer(_gemm_as_matmul(onnx.load(str(src))), algo_config=config)
        quantizer.process()
        quantizer.model.save_model_to_file(str(tmp), use_external_data_format=False)
    else:
        raise ValueError(f"unknown recipe {recipe}; known: {', '.join(RECIPES)}")
    tmp.rename(dst)
