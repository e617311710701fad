"""Models shipped inside PyPI packages."""

from __future__ import annotations

import numpy as np
from feeds import audio, const, feeds
from spec import Spec


def _state(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """A recurrent state as it is after a few chunks: small, not zero."""
    return (0.1 * rng.standard_normal(shape)).astype(dtype)


SPECS: list[Spec] = [
    Spec(
        name="silero-vad5",
        registry="pypi",
        package="silero-vad",
        version="5.1.2",
        member="silero_vad/data/silero_vad.onnx",
        domain="speech",
        feeds=feeds(
            shapes={"input": (1, 576)},
            by_name={"input": audio, "state": _state, "sr": const(16000)},
            dims={1: 1},
        ),
        note="utils_vad.OnnxWrapper: 512 samples at 16 kHz after 64 of context, state (2,B,128)",
    ),
]
