"""Load-time interpolation tables for Resize: for one axis, which input positions (taps) each
output position reads and with which weights, for every ONNX mode and coordinate transformation.

The arithmetic mirrors the ONNX reference implementation (float64, separable per axis), so the
graph that applies these tables computes what the backend tests expect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["LENGTH_SENSITIVE", "Interp", "Taps", "axis_taps", "source_coords"]

LENGTH_SENSITIVE = ("align_corners", "pytorch_half_pixel", "tf_crop_and_resize")
"""Coordinate modes whose reference implementation divides by the real-valued output width where
the spec and onnxruntime use the integer output length: where the two differ, Resize refuses."""

COORD_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
)
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


@dataclass(frozen=True, slots=True)
class Interp:
    """The interpolation settings of one Resize node."""

    mode: str  # nearest | linear | cubic
    coord: str
    nearest_mode: str = "round_prefer_floor"
    cubic_a: float = -0.75
    exclude_outside: bool = False
    antialias: bool = False


@dataclass(frozen=True, slots=True)
class Taps:
    """Output position i reads input `index[i, t]` with weight `weight[i, t]`; positions flagged
    in `outside` (tf_crop_and_resize only) take the extrapolation value instead."""

    index: np.ndarray  # int64 [out, n]
    weight: np.ndarray  # float64 [out, n]
    outside: np.ndarray | None  # bool [out]

    @property
    def one_hot(self) -> bool:
        return bool(
            np.all(np.count_nonzero(self.weight, axis=1) <= 1) and np.all(self.weight.sum(1) == 1)
        )

    def same_as(self, other: Taps) -> bool:
        """Whether both tables compute the same values (up to f32 rounding of the scale)."""
        if self.index.shape != other.index.shape:
            return False
        mine, theirs = self.outside, other.outside
        if (mine is None) != (theirs is None):
            return False
        if mine is not None and theirs is not None and not np.array_equal(mine, theirs):
            return False
        size = int(max(self.index.max(initial=0), other.index.max(initial=0))) + 1
        return bool(
            np.allclose(_dense_rows(self, size), _dense_rows(other, size), rtol=1e-5, atol=1e-6)
        )

    def selected(self) -> np.ndarray:
        """For one-hot weights, the single input index each output reads."""
        return self.index[np.arange(len(self.index)), np.argmax(self.weight, axis=1)]


def _dense_rows(taps: Taps, size: int) -> np.ndarray:
    """The taps as a dense [out, size] interpolation matrix (repeated indices summed)."""
    m = np.zeros((len(taps.index), size))
    rows = np.broadcast_to(np.arange(len(taps.index))[:, None], taps.index.shape)
    np.add.at(m, (rows, taps.index), taps.weight)
    return m


def source_coords(
    coord: str,
    out: int,
    scale: float,
    size: int,
    roi: tuple[float, float] | None,
    by_length: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """The input coordinate of every output position, and the extrapolated ones.

    The reference divides by the real-valued output width scale·size; with `by_length` the
    integer output length is used instead, as the spec text (length_resized) and onnxruntime do.
    """
    y = np.arange(out, dtype=np.float64)
    width = float(out) if by_length else scale * size
    outside = None
    match coord:
        case "align_corners":
            x = np.zeros(out) if width == 1 else y * (size - 1) / (width - 1)
        case "asymmetric":
            x = y / scale
        case "tf_crop_and_resize":
            lo, hi = roi if roi is not None else (0.0, 1.0)
            x = (
                np.full(out, (hi - lo) * (size - 1) / 2)
                if width == 1
                else y * (hi - lo) * (size - 1) / (width - 1)
            )
            x = x + lo * (size - 1)
            outside = (x < 0) | (x > size - 1)
        case "pytorch_half_pixel":
            x = np.full(out, 0.0 if by_length else -0.5) if width == 1 else (y + 0.5) / scale - 0.5
        case "half_pixel":
            x = (y + 0.5) / scale - 0.5
        case "half_pixel_symmetric":
            offset = size / 2 * (1 - out / width)
            x = offset + (y + 0.5) / scale - 0.5
        case _:
            raise ValueError(coord)
    return x, outside


def _nearest(r: np.ndarray, mode: str) -> np.ndarray:
    exact = r == 1.0
    match mode:
        case "round_prefer_floor":
            second = r > 0.5
        case "round_prefer_ceil":
            second = r >= 0.5
        case "floor":
            second = np.zeros_like(exact)
        case "ceil":
            second = np.ones_like(exact)
        case _:
            raise ValueError(mode)
    second = second | exact
    return np.stack([~second, second], axis=1).astype(np.float64)


def _cubic(r: np.ndarray, a: float) -> np.ndarray:
    s = 1 - r
    return np.stack(
        [
            ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
            ((a + 2) * r - (a + 3)) * r * r + 1,
            ((a + 2) * s - (a + 3)) * s * s + 1,
            ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a,
        ],
        axis=1,
    )


def _cubic_kernel(x: np.ndarray, a: float) -> np.ndarray:
    x = np.abs(x)
    near = (a + 2) * x**3 - (a + 3) * x**2 + 1
    far = a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def _antialias(r: np.ndarray, scale: float, mode: str, a: float) -> np.ndarray:
    """Widened, normalised kernels when downsampling (scale < 1)."""
    s = min(scale, 1.0)
    if mode == "linear":
        start = math.floor(-1 / s) + 1
        taps = np.arange(start, start + 2 - 2 * start)
        w = np.clip(1 - np.abs((taps[None, :] - r[:, None]) * s), 0, 1)
    else:
        start = math.floor(-2 / s) + 1
        taps = np.arange(start, 2 - start)
        w = _cubic_kernel(s * (taps[None, :] - r[:, None]), a)
    return w / w.sum(axis=1, keepdims=True)


def _weights(r: np.ndarray, interp: Interp, scale: float) -> np.ndarray:
    match interp.mode:
        case "nearest":
            return _nearest(r, interp.nearest_mode)
        case "linear" | "cubic" if interp.antialias:
            return _antialias(r, scale, interp.mode, interp.cubic_a)
        case "linear":
            return np.stack([1 - r, r], axis=1)
        case "cubic":
            return _cubic(r, interp.cubic_a)
        case _:
            raise ValueError(interp.mode)


def axis_taps(
    interp: Interp,
    size: int,
    out: int,
    scale: float,
    roi: tuple[float, float] | None = None,
    by_length: bool = False,
) -> Taps:
    """The taps of one axis resized from `size` to `out` positions with scale factor `scale`."""
    x, outside = source_coords(interp.coord, out, scale, size, roi, by_length)
    floor = np.floor(x)
    ratio = np.where(x == floor, 1.0, x - floor)
    weight = _weights(ratio, interp, scale)
    n = weight.shape[1]
    pad = math.ceil(n / 2)
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        base = -((n - 1) // 2)
        offset = np.where(frac <= 0.5, base, base + 1)
    index = (p + offset)[:, None] + np.arange(n)[None, :] - pad
    if interp.exclude_outside:
        weight = np.where((index < 0) | (index >= size), 0.0, weight)
        total = weight.sum(axis=1, keepdims=True)
        weight = weight / np.where(total == 0, 1.0, total)
    index = np.clip(index, 0, size - 1).astype(np.int64)
    return Taps(index, weight, outside if outside is not None and outside.any() else None)
