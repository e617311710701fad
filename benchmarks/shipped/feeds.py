"""Input builders shared by the specs: the model's declared inputs filled the way a package's
preprocessing fills them (a normalised image of the size the package resizes to, a chunk of
audio, token ids in the vocabulary), with symbolic dims given by name or position."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnx
from onnx import helper
from spec import Feeds

Fill = Callable[[tuple[int, ...], np.dtype, np.random.Generator], np.ndarray]


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The real inputs (initializers listed as inputs, as old exporters do, left out)."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def input_shape(vi: onnx.ValueInfoProto, dims: Mapping[str | int, int]) -> tuple[int, ...]:
    """`vi`'s shape with each symbolic or unknown dim taken from `dims` by its name or its
    position (ValueError naming the dim when neither is given)."""
    out = []
    for k, d in enumerate(vi.type.tensor_type.shape.dim):
        if d.HasField("dim_value") and d.dim_value > 0:
            out.append(d.dim_value)
        elif d.dim_param in dims:
            out.append(dims[d.dim_param])
        elif k in dims:
            out.append(dims[k])
        else:
            raise ValueError(f"input '{vi.name}': give dim {k} ('{d.dim_param}')")
    return tuple(out)


def input_dtype(vi: onnx.ValueInfoProto) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))


def normal(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def unit(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """Uniform in [0, 1): an image already divided by 255."""
    return rng.random(shape).astype(dtype)


def ints(high: int, low: int = 0) -> Fill:
    """Integers in [low, high): token ids of a vocabulary, class ids."""

    def fill(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(low, high, shape).astype(dtype)

    return fill


def uniform(low: float, high: float) -> Fill:
    """Uniform in [low, high): features a package scales into a range, e.g. a log-mel
    spectrogram as (dB + 40) / 40."""

    def fill(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
        return rng.uniform(low, high, shape).astype(dtype)

    return fill


def scaled(inner: Fill, factor: float) -> Fill:
    """`inner` times `factor`: audio as int16 sample values (32767), a small recurrent state."""

    def fill(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
        return (np.asarray(inner(shape, np.dtype(np.float64), rng)) * factor).astype(dtype)

    return fill


def const(value: float | int) -> Fill:
    """Every element `value`: an attention mask of ones, a sample rate, a state of zeros."""

    def fill(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
        return np.full(shape, value, dtype)

    return fill


def image(mean: tuple[float, ...] = (0.0,), std: tuple[float, ...] = (1.0,)) -> Fill:
    """A smooth random picture in [0, 1], normalised per channel as (x - mean) / std on the
    channel axis 1 (NCHW), the way most packages prepare an image."""

    def fill(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
        x = rng.random(shape)
        if len(shape) == 4:  # smooth it a little: real pictures are not white noise
            x = (x + np.roll(x, 1, 2) + np.roll(x, 1, 3) + np.roll(x, (1, 1), (2, 3))) / 4
        c = shape[1] if len(shape) > 1 else 1
        m = np.resize(np.asarray(mean, np.float64), c).reshape((1, c) + (1,) * (len(shape) - 2))
        s = np.resize(np.asarray(std, np.float64), c).reshape((1, c) + (1,) * (len(shape) - 2))
        return ((x - m) / s).astype(dtype)

    return fill


def document(mean: tuple[float, ...] = (0.0,), std: tuple[float, ...] = (1.0,)) -> Fill:
    """Lines of dark blocky "glyphs" on a light page (NCHW), normalised as `image` does: a text
    detector finds text in it (on smooth noise its probability map is ~0 everywhere and the
    comparison says nothing), and a crop of height <= 64 is one line, as a recogniser sees."""

    def fill(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
        n, c, h, w = shape
        page = np.full((n, h, w), 0.92)
        line = int(h * 0.6) if h <= 64 else max(12, h // 14)
        cell = max(2, line // 4)
        tops = [(h - line) // 2] if h <= 64 else range(line, h - line, 2 * line)
        for b in range(n):
            for top in tops:
                width = int(w * rng.uniform(0.5, 0.95))
                left = int(rng.integers(0, w - width + 1))
                coarse = rng.random((line // cell + 1, width // cell + 1)) < 0.45
                ink = np.kron(coarse, np.ones((cell, cell)))[:line, :width]
                page[b, top : top + line, left : left + width] -= 0.8 * ink
        x = np.repeat(page[:, None], c, 1) + 0.03 * rng.standard_normal(shape)
        m = np.resize(np.asarray(mean, np.float64), c).reshape(1, c, 1, 1)
        s = np.resize(np.asarray(std, np.float64), c).reshape(1, c, 1, 1)
        return ((np.clip(x, 0, 1) - m) / s).astype(dtype)

    return fill


def audio(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """Speech-like audio in [-1, 1]: a few harmonics with a slow envelope, plus noise."""
    n = shape[-1]
    t = np.arange(n) / 16000.0
    f0 = rng.uniform(100, 250)
    x = sum(np.sin(2 * np.pi * f0 * k * t + rng.uniform(0, 6)) / k for k in range(1, 6))
    x = x * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)) * 0.3 + 0.01 * rng.standard_normal(n)
    return np.broadcast_to(x, shape).astype(dtype)


def feeds(
    dims: Mapping[str | int, int] | None = None,
    by_name: Mapping[str, Fill] | None = None,
    default: Fill | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> Feeds:
    """A spec's `feeds`: every graph input shaped by `shapes[name]`, else by `dims` (symbolic
    dims by name or position), filled by `by_name[name]`, else by `default` (None: standard
    normal for floats, zeros for integers and bools)."""
    dims, by_name, shapes = dict(dims or {}), dict(by_name or {}), dict(shapes or {})

    def build(model: onnx.ModelProto, rng: np.random.Generator) -> dict[str, np.ndarray]:
        out = {}
        for vi in graph_inputs(model):
            shape = shapes[vi.name] if vi.name in shapes else input_shape(vi, dims)
            dtype = input_dtype(vi)
            fill = by_name.get(vi.name) or default
            if fill is None:
                fill = normal if dtype.kind == "f" else const(0)
            out[vi.name] = np.asarray(fill(shape, dtype, rng), dtype)
        return out

    return build
