"""com.microsoft DynamicQuantizeLSTM, made by onnxruntime's `quantize_dynamic` from an ONNX LSTM:
ours is the LSTM of the dequantized weights (checked against onnxruntime's LSTM run on those
weights, to float precision), and within a derived bound of onnxruntime's own kernel, which also
rounds the activations to uint8 on the fly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from kn_graph.onnx import load_onnx
from kn_graph.reference import evaluate
from kn_runtime import Device

INPUT, H = 16, 32


def _lstm(w: np.ndarray, r: np.ndarray, b: np.ndarray, direction: str) -> onnx.ModelProto:
    node = helper.make_node(
        "LSTM", ["x", "W", "R", "B"], ["y", "yh", "yc"], hidden_size=H, direction=direction
    )
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["t", "b", INPUT])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "yh", "yc")],
        [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (r, "R"), (b, "B"))],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _run(m: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(a) for a in sess.run(None, {"x": x})]


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_dynamic_quantize_lstm(direction: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    d = 2 if direction == "bidirectional" else 1
    w = (rng.standard_normal((d, 4 * H, INPUT)) * 0.3).astype(np.float32)
    r = (rng.standard_normal((d, 4 * H, H)) * 0.3).astype(np.float32)
    b = (rng.standard_normal((d, 8 * H)) * 0.1).astype(np.float32)
    onnx.save(_lstm(w, r, b, direction), tmp_path / "f.onnx")
    # 7-bit weights: onnxruntime's u8 x s8 kernels clip 8-bit ones on CPUs without VNNI
    quantize_dynamic(
        tmp_path / "f.onnx", tmp_path / "q.onnx", weight_type=QuantType.QInt8, reduce_range=True
    )
    qm = onnx.load(tmp_path / "q.onnx")
    assert [n.op_type for n in qm.graph.node] == ["DynamicQuantizeLSTM"]
    inits = {t.name: numpy_helper.to_array(t) for t in qm.graph.initializer}

    def deq(name: str) -> np.ndarray:  # [D, rows, 4H] -> ONNX's [D, 4H, rows]
        q = inits[f"{name}_quantized"].astype(np.float32)
        z = inits[f"{name}_zero_point"].astype(np.float32).reshape(-1, 1, 1)
        return ((q - z) * inits[f"{name}_scale"].reshape(-1, 1, 1)).transpose(0, 2, 1)

    x = rng.standard_normal((7, 3, INPUT)).astype(np.float32)
    same_weights = _run(_lstm(deq("W"), deq("R"), b, direction), x)
    theirs = _run(qm, x)
    g = load_onnx(qm)
    for got in (evaluate(g, [x]), Device.cpu().prepare(g).eval([x])):
        for a, want, their in zip(got, same_weights, theirs, strict=True):
            np.testing.assert_allclose(a, want, rtol=1e-4, atol=1e-5)
            # onnxruntime rounds x and each h to uint8 steps of range/255: a gate input moves
            # by at most half a step times the row's weight mass, per step; over the steps
            # (no contraction assumed) that bounds the outputs
            wmax = np.abs(deq("W")).sum(-1).max()
            rmax = np.abs(deq("R")).sum(-1).max()
            per_step = 0.5 * (np.ptp(x) / 255 * wmax + 2.0 / 255 * rmax)
            assert np.abs(a - their).max() <= per_step * x.shape[0]
