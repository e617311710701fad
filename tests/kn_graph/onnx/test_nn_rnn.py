"""RNN, GRU and LSTM against onnxruntime: directions, layouts, biases, initial states, peepholes,
per-batch sequence lengths, clipping and custom activations."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph.errors import UnsupportedOnnxError
from kn_graph.onnx import load_onnx
from tests.kn_graph.onnx.nn_helpers import check_ort, check_reference, node_model, rand

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
T, B, IN, H = 4, 3, 5, 6


def weights(op: str, dirs: int) -> dict[str, np.ndarray]:
    g = GATES[op] * H
    out = {"w": rand(dirs, g, IN) * 0.5, "r": rand(dirs, g, H) * 0.5, "b": rand(dirs, 2 * g) * 0.5}
    return out


def outputs(op: str) -> tuple[str, ...]:
    return ("y", "y_h", "y_c") if op == "LSTM" else ("y", "y_h")


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_recurrent_directions_and_layouts(op: str, direction: str, layout: int) -> None:
    dirs = 2 if direction == "bidirectional" else 1
    x = rand(T, B, IN) if layout == 0 else rand(B, T, IN)
    h0 = rand(dirs, B, H) if layout == 0 else rand(B, dirs, H)
    inits = weights(op, dirs)
    order = ["x", "w", "r", "b", "", "h0"]
    if op == "LSTM":
        inits["c0"] = rand(dirs, B, H) if layout == 0 else rand(B, dirs, H)
        order.append("c0")
    inits["h0"] = h0
    attrs = {"hidden_size": H, "direction": direction, "layout": layout}
    check = check_ort if layout == 0 else check_reference  # onnxruntime lacks layout 1
    check(op, {"x": x}, attrs, inits=inits, order=order, outputs=outputs(op), rtol=1e-4, atol=1e-5)


def test_lstm_peepholes_without_bias_or_states() -> None:
    inits = {"w": rand(1, 4 * H, IN), "r": rand(1, 4 * H, H), "p": rand(1, 3 * H)}
    check_ort(
        "LSTM",
        {"x": rand(T, B, IN)},
        {"hidden_size": H},
        inits=inits,
        order=["x", "w", "r", "", "", "", "", "p"],
        outputs=outputs("LSTM"),
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_forward_sequence_lengths_freeze_states_and_zero_outputs(op: str) -> None:
    inits = weights(op, 1)
    feed = {"x": rand(T, B, IN), "lens": np.array([4, 2, 1], np.int32)}
    check_ort(
        op,
        feed,
        {"hidden_size": H},
        inits=inits,
        order=["x", "w", "r", "b", "lens"],
        outputs=outputs(op),
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.parametrize("lens", [[5, 2, 1], [4, 0, 1]])
def test_sequence_lengths_out_of_range_are_refused(lens: list[int]) -> None:
    """Known lengths must lie in [1, T] (onnxruntime refuses the others when it runs)."""
    model = node_model(
        "GRU",
        {"x": rand(T, B, IN)},
        {"hidden_size": H, "direction": "reverse"},
        inits={**weights("GRU", 1), "lens": np.array(lens, np.int32)},
        order=["x", "w", "r", "b", "lens"],
        outputs=("y",),
    )
    with pytest.raises(UnsupportedOnnxError, match=r"sequence_lens .* out of range \[1, 4\]"):
        load_onnx(model)


def test_gru_linear_before_reset_and_clip() -> None:
    attrs = {"hidden_size": H, "linear_before_reset": 1, "clip": 0.7}
    check_ort(
        "GRU",
        {"x": rand(T, B, IN) * 3},
        attrs,
        inits=weights("GRU", 1),
        outputs=outputs("GRU"),
        rtol=1e-4,
        atol=1e-5,
    )


def test_rnn_custom_activations_with_alpha_beta() -> None:
    attrs = {
        "hidden_size": H,
        "direction": "bidirectional",
        "activations": ["LeakyRelu", "HardSigmoid"],
        "activation_alpha": [0.2, 0.3],
        "activation_beta": [0.4],
    }
    check_ort(
        "RNN",
        {"x": rand(T, B, IN)},
        attrs,
        inits=weights("RNN", 2),
        outputs=outputs("RNN"),
        rtol=1e-4,
        atol=1e-5,
    )


def test_lstm_custom_activations() -> None:
    attrs = {"hidden_size": H, "activations": ["HardSigmoid", "Relu", "Tanh"]}
    check_ort(
        "LSTM",
        {"x": rand(T, B, IN)},
        attrs,
        inits=weights("LSTM", 1),
        outputs=outputs("LSTM"),
        rtol=1e-4,
        atol=1e-5,
    )


def test_unknown_activation_is_refused() -> None:
    model = node_model(
        "RNN",
        {"x": rand(T, B, IN)},
        {"hidden_size": H, "activations": ["Gelu"]},
        inits=weights("RNN", 1),
        outputs=("y",),
    )
    with pytest.raises(UnsupportedOnnxError, match="activation"):
        load_onnx(model)
