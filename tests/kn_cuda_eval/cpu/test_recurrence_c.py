"""The "recurrence" host point in C (`kn_cuda_eval.cpu.recurrence`) against the NumPy loop it
replaces (`kn_graph.recurrence.run_recurrence`, the oracle): every cell kind and flag, every
activation in every slot, NaN and infinities in the data, float16 computed in float32; float64
left to NumPy; and Device.cpu() running it for a loaded model, against onnxruntime."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kn_cuda_eval.cpu import recurrence as c_recurrence
from kn_graph.recurrence import ACTIVATIONS, Activation, Recurrence, run_recurrence
from kn_runtime import Device
from tests.kn_graph.onnx.nn_helpers import assert_close, onnxruntime
from tests.kn_graph.onnx.rnn_helpers import recurrent_model, sequence

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
DEFAULT_ACTS = {"RNN": ("Tanh",), "GRU": ("Sigmoid", "Tanh"), "LSTM": ("Sigmoid", "Tanh", "Tanh")}


def _args(spec: Recurrence, steps: int, batch: int, dtype: type, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    n, gh = spec.hidden, spec.gates * spec.hidden

    def f(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(dtype)

    xs = [f(steps, batch, gh), f(gh, n) * dtype(0.3)]  # states stay in range
    if spec.has_bias:
        xs.append(f(gh))
    xs.append(f(batch, n))
    if spec.kind == "LSTM":
        xs.append(f(batch, n))
    if spec.has_peepholes:
        xs.append(f(3 * n))
    if spec.masked:
        run = rng.random((steps, batch, 1)) < 0.7
        run[:, 0] = True  # one row runs to the end
        xs.append(run)
    return xs


def _same(spec: Recurrence, xs: list[np.ndarray], tol: float = 2e-5) -> None:
    with np.errstate(all="ignore"):  # NaN and inf inputs are the point of some cases
        want = run_recurrence(spec, xs)
        got = c_recurrence.run_recurrence_c(spec, xs)
    assert got is not None
    for w, g in zip(want, got, strict=True):
        assert w.shape == g.shape and w.dtype == g.dtype
        assert np.array_equal(np.isnan(w), np.isnan(g))
        finite = np.isfinite(w)
        assert np.array_equal(w[~finite & ~np.isnan(w)], g[~finite & ~np.isnan(g)])
        scale = max(1.0, float(np.max(np.abs(w[finite]), initial=0.0)))  # sums in another order
        err = float(np.max(np.abs(g[finite].astype(np.float64) - w[finite]), initial=0.0))
        assert err <= tol * scale, (err, scale)


FLAGS = [
    (kind, lbr, clip, reverse, masked, bias, peep, forget)
    for kind, lbr, clip, reverse, masked, bias, peep, forget in itertools.product(
        GATES,
        (False, True),
        (None, 0.6),
        (False, True),
        (False, True),
        (False, True),
        (False, True),
        (False, True),
    )
    if (not lbr or kind == "GRU") and (not (peep or forget) or kind == "LSTM")
]


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "-".join(str(x) for x in f))
def test_every_cell_and_flag_matches_the_numpy_loop(flags: tuple) -> None:
    kind, lbr, clip, reverse, masked, bias, peep, forget = flags
    acts = tuple(Activation(a) for a in DEFAULT_ACTS[kind])
    spec = Recurrence(kind, 5, acts, clip, lbr, forget, bias, peep, masked, reverse)
    _same(spec, _args(spec, 9, 3, np.float32, len(str(flags))))


@pytest.mark.parametrize("act", ACTIVATIONS)
@pytest.mark.parametrize("kind", list(GATES))
def test_every_activation_in_every_slot(kind: str, act: str) -> None:
    """The activation with alpha/beta not the defaults, in each slot in turn, over inputs that
    reach both sides of every threshold."""
    for slot in range(len(DEFAULT_ACTS[kind])):
        names = list(DEFAULT_ACTS[kind])
        names[slot] = act
        acts = tuple(Activation(a, 0.3, 0.6) for a in names)
        spec = Recurrence(kind, 4, acts, None, False, False, True, False, False, False)
        xs = _args(spec, 8, 2, np.float32, slot)
        xs[0] *= 3  # past the thresholds and into the flat parts
        _same(spec, xs)


@pytest.mark.parametrize("kind", list(GATES))
def test_nan_and_infinities_go_where_numpy_takes_them(kind: str) -> None:
    """NaN in one row's input, ±inf and huge values in another's: the same NaN positions and
    values as the NumPy loop (ThresholdedRelu turns NaN into 0 there; the others keep it)."""
    for acts in (
        DEFAULT_ACTS[kind],
        ("ThresholdedRelu", "Relu", "HardSigmoid")[: len(DEFAULT_ACTS[kind])],
    ):
        spec = Recurrence(
            kind,
            4,
            tuple(Activation(a, 0.2, 0.5) for a in acts),
            None,
            False,
            False,
            True,
            False,
            True,
            False,
        )
        xs = _args(spec, 7, 3, np.float32, 1)
        xs[0][2, 1, 0] = np.nan
        xs[0][1, 2, :3] = [np.inf, -np.inf, 3e38]
        _same(spec, xs)


def test_float16_is_computed_in_float32_and_float64_is_numpys() -> None:
    spec = Recurrence(
        "GRU",
        6,
        (Activation("Sigmoid"), Activation("Tanh")),
        None,
        True,
        False,
        True,
        False,
        False,
        True,
    )
    xs16 = _args(spec, 10, 2, np.float16, 3)
    _same(spec, xs16, tol=2e-3)
    assert c_recurrence.run_recurrence_c(spec, _args(spec, 4, 2, np.float64, 3)) is None


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_device_cpu_runs_a_loaded_model_in_c(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bidirectional layer over a symbolic length: Device.cpu() takes the C loop at both host
    points (counted) and agrees with onnxruntime, at two lengths and after a NaN."""
    calls = []
    real = c_recurrence.run_recurrence_c

    def counted(spec: Recurrence, xs: list[np.ndarray]) -> list[np.ndarray] | None:
        out = real(spec, xs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(c_recurrence, "run_recurrence_c", counted)
    model = recurrent_model(op, "bidirectional", "seq")
    prepared = Device.cpu().prepare(model.SerializeToString())
    for steps in (40, 7):
        feed = {"x": sequence(steps)}
        assert_close(prepared.eval(feed), onnxruntime(model, feed), 1e-4, 1e-5)
    assert calls == [True] * 4
    x = sequence(40)
    x[5, 0, 0] = np.nan
    y = prepared.eval({"x": x})[0]
    assert np.isnan(y[5:, 0, 0]).all() and not np.isnan(y[:, 0, 1:]).any()
