"""Window functions (against scipy), DFT (against numpy.fft) and STFT (against onnxruntime)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.signal

from kn_graph.errors import UnsupportedOnnxError
from kn_graph.onnx import load_onnx
from tests.kn_graph.onnx.nn_helpers import check_numpy, check_ort, node_model, rand

WINDOWS = {"HannWindow": "hann", "HammingWindow": "hamming", "BlackmanWindow": "blackman"}


@pytest.mark.parametrize("op", list(WINDOWS))
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows(op: str, periodic: int) -> None:
    want = scipy.signal.get_window(WINDOWS[op], 10, fftbins=bool(periodic))
    if op == "HammingWindow":  # ONNX uses alpha = 25/46, not 0.54
        n = np.arange(10)
        want = 25 / 46 - 21 / 46 * np.cos(2 * np.pi * n / (10 if periodic else 9))
    check_numpy(
        op,
        {},
        [want.astype(np.float32)],
        {"periodic": periodic},
        inits={"n": np.array(10, np.int64)},
        opset=17,
    )


def test_window_output_datatype() -> None:
    want = scipy.signal.get_window("hann", 6, fftbins=True)
    check_numpy(
        "HannWindow",
        {},
        [want],
        {"output_datatype": 11},
        inits={"n": np.array(6, np.int64)},
        opset=17,
    )


def _complex(x: np.ndarray) -> np.ndarray:
    return x[..., 0] if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1]


def _pack(c: np.ndarray) -> np.ndarray:
    return np.stack([c.real, c.imag], axis=-1).astype(np.float32)


@pytest.mark.parametrize("channels", [1, 2])
@pytest.mark.parametrize("inverse", [0, 1])
@pytest.mark.parametrize("length", [None, 6, 12])
def test_dft_full(channels: int, inverse: int, length: int | None) -> None:
    x = rand(2, 8, 3, channels)
    f = np.fft.ifft if inverse else np.fft.fft
    want = _pack(f(_complex(x), n=length, axis=1))
    inits = {"axis": np.array(1, np.int64)}
    order = ["x", "", "axis"]
    if length is not None:
        inits["n"] = np.array(length, np.int64)
        order = ["x", "n", "axis"]
    check_numpy(
        "DFT", {"x": x}, [want], {"inverse": inverse}, inits=inits, order=order, opset=20, atol=1e-4
    )


def test_dft_onesided_real_and_irfft() -> None:
    x = rand(3, 10, 1)
    check_numpy(
        "DFT",
        {"x": x},
        [_pack(np.fft.rfft(x[..., 0], axis=1))],
        {"onesided": 1, "axis": 1},
        opset=17,
        atol=1e-4,
    )
    spec = _pack(np.fft.rfft(rand(3, 10), axis=1))
    want = np.fft.irfft(_complex(spec), n=10, axis=1)[..., None].astype(np.float32)
    check_numpy(
        "DFT",
        {"x": spec},
        [want],
        {"onesided": 1, "inverse": 1, "axis": 1},
        inits={"n": np.array(10, np.int64)},
        order=["x", "n"],
        opset=17,
        atol=1e-5,
    )


def test_dft_on_the_last_axis_is_refused() -> None:
    model = node_model("DFT", {"x": rand(2, 4, 2)}, {"axis": 2}, opset=17)
    with pytest.raises(UnsupportedOnnxError):
        load_onnx(model)


@pytest.mark.parametrize("onesided", [0, 1])
def test_stft_with_window(onesided: int) -> None:
    x = rand(2, 32, 1)
    inits = {"step": np.array(4, np.int64), "w": np.hanning(8).astype(np.float32)}
    check_ort("STFT", {"x": x}, {"onesided": onesided}, inits=inits, opset=17, rtol=1e-4, atol=1e-4)


def test_stft_with_frame_length() -> None:
    inits = {"step": np.array(3, np.int64), "frame": np.array(5, np.int64)}
    check_ort(
        "STFT",
        {"x": rand(1, 20, 1)},
        {},
        inits=inits,
        order=["x", "step", "", "frame"],
        opset=17,
        rtol=1e-4,
        atol=1e-4,
    )
