"""The "recurrence" kind (`kn_graph.recurrence`) that runs sequences longer than RNN_MAX_UNROLL:
every activation function, clipping, GRU's linear_before_reset both ways, LSTM peepholes with
data sequence lengths in both directions, and float16; against onnxruntime, on the reference
executor and on Device.cpu(), asserting that the loaded graph runs the kind."""

from __future__ import annotations

import numpy as np
import pytest

from kn_cuda_eval.planning.segments import emulate_graph
from kn_graph.onnx import load_onnx
from kn_graph.onnx.handlers.rnn_steps import RNN_MAX_UNROLL
from kn_graph.optimizer import optimize
from kn_graph.recurrence import ACTIVATIONS
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_cuda_eval.helpers import check_plan
from tests.kn_graph.onnx.nn_helpers import assert_close, onnxruntime
from tests.kn_graph.onnx.rnn_helpers import (
    check_feeds,
    recurrences,
    recurrent_model,
    sequence,
)

T = RNN_MAX_UNROLL + 4
"""Longer than what is unrolled: the recurrence kind runs it."""

_ALPHA_BETA = {
    "Affine": (0.7, 0.2),
    "LeakyRelu": (0.2, None),
    "ThresholdedRelu": (0.3, None),
    "ScaledTanh": (1.3, 0.6),
    "HardSigmoid": (0.3, 0.4),
    "Elu": (0.8, None),
}
"""Non-default alpha (and beta) for the activations that take them."""


def _acts(names: list[str]) -> dict[str, object]:
    """The `activations` attributes, alpha and beta listed in order for the ones taking them."""
    alphas = [_ALPHA_BETA[n][0] for n in names if n in _ALPHA_BETA]
    betas = [b for n in names if n in _ALPHA_BETA and (b := _ALPHA_BETA[n][1]) is not None]
    out: dict[str, object] = {"activations": names}
    if alphas:
        out["activation_alpha"] = alphas
    if betas:
        out["activation_beta"] = betas
    return out


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_rnn_every_activation(act: str) -> None:
    """Forward and reverse each with the activation (alpha/beta not the defaults)."""
    model = recurrent_model("RNN", "bidirectional", T, attrs=_acts([act, act]))
    g = check_feeds(model, [{"x": sequence(T)}])
    assert recurrences(g) == 2


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_gru_and_lstm_with_the_activation_as_candidate_function(act: str) -> None:
    """The activation as the candidate's g (and LSTM's h); the gates' f is HardSigmoid (a gate
    outside [0, 1] makes the state grow without bound or amplify rounding exponentially)."""
    gru = recurrent_model("GRU", "forward", T, attrs=_acts(["HardSigmoid", act]))
    assert recurrences(check_feeds(gru, [{"x": sequence(T)}])) == 1
    lstm = recurrent_model("LSTM", "reverse", T, attrs=_acts(["HardSigmoid", act, act]))
    assert recurrences(check_feeds(lstm, [{"x": sequence(T)}])) == 1


@pytest.mark.parametrize(
    ("op", "extra"),
    [
        ("RNN", {}),
        ("GRU", {"linear_before_reset": 0}),
        ("GRU", {"linear_before_reset": 1}),
        ("LSTM", {}),
    ],
    ids=["RNN", "GRU", "GRU-linear_before_reset", "LSTM"],
)
def test_clip_and_linear_before_reset(op: str, extra: dict[str, object]) -> None:
    """Large inputs, so that the clip bites; linear_before_reset only exists on GRU."""
    attrs: dict[str, object] = {"clip": 0.7, **extra}
    model = recurrent_model(op, "bidirectional", T, attrs=attrs)
    g = check_feeds(model, [{"x": sequence(T, scale=3)}])
    assert recurrences(g) == 2


def test_gru_linear_before_reset_without_clip() -> None:
    model = recurrent_model("GRU", "reverse", "seq", attrs={"linear_before_reset": 1})
    g = check_feeds(model, [{"x": sequence(n)} for n in (2, T)])
    assert recurrences(g) == 1


def test_bidirectional_lstm_peepholes_and_sequence_lengths_from_data() -> None:
    model = recurrent_model("LSTM", "bidirectional", 40, data_lens=True, peepholes=True)
    feeds = [
        {"x": sequence(40), "lens": np.array([40, 17, 1], np.int32)},
        {"x": sequence(40), "lens": np.array([3, 40, 39], np.int32)},
    ]
    g = check_feeds(model, feeds)
    assert recurrences(g) == 2


def test_every_executor_runs_the_kind() -> None:
    """Optimized (the op carried through unchanged), through segmented plans in the plan
    emulator and on the fake CUDA device (the kind at a host point)."""
    model = recurrent_model("GRU", "bidirectional", "seq", data_lens=True)
    g = check_feeds(model, [{"x": sequence(T), "lens": np.array([T, 5, 1], np.int32)}])
    opt = optimize(g)
    assert recurrences(opt) == 2
    for n, lens in ((T, [T, 5, 1]), (3, [2, 3, 1])):
        feed = {"x": sequence(n), "lens": np.array(lens, np.int32)}
        want = onnxruntime(model, feed)
        assert_close(evaluate(opt, feed), want, 1e-4, 1e-5)
        assert_close(emulate_graph(opt, feed), want, 1e-4, 1e-5)
        check_plan(g, feed, expected=want)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_float16(op: str) -> None:
    """f16 computed in f32 and rounded once per result (onnxruntime rounds per step: the
    tolerance is f16's)."""
    model = recurrent_model(op, "bidirectional", T, dtype=np.float16)
    g = check_feeds(model, [{"x": sequence(T).astype(np.float16)}], rtol=1e-2, atol=1e-2)
    assert recurrences(g) == 2


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_a_nan_in_one_row_stays_in_that_row(op: str) -> None:
    """NaN at step 3 of batch row 1: that row is NaN in both directions' outputs and states, the
    other rows equal onnxruntime's, on the reference and Device.cpu() alike. onnxruntime agrees
    for RNN; its GRU and LSTM kernels clamp the gates' inputs before their sigmoid and tanh, so
    NaN becomes a finite number there: we keep NaN, as the reference does everywhere."""
    x = sequence(T)
    x[3, 1, 0] = np.nan
    model = recurrent_model(op, "bidirectional", T)
    g = load_onnx(model)
    assert recurrences(g) == 2
    want = onnxruntime(model, {"x": x})
    ref = evaluate(g, {"x": x})
    cpu = Device.cpu().prepare(g).eval({"x": x})
    for a, b, w in zip(ref, cpu, want, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)  # NaN where the other has NaN
        axis = a.ndim - 2  # the batch axis: Y [T, D, B, H], Y_h and Y_c [D, B, H]
        assert np.isnan(np.take(a, 1, axis)).any() and not np.isnan(np.delete(a, 1, axis)).any()
        np.testing.assert_allclose(np.delete(a, 1, axis), np.delete(w, 1, axis), 1e-4, 1e-5)
        if op == "RNN":
            np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-5)
