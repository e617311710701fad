"""GridSample and AffineGrid against onnxruntime (the ONNX reference for volumetric sampling)."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph.errors import UnsupportedOnnxError
from kn_graph.onnx import load_onnx
from tests.kn_graph.onnx.nn_helpers import RNG, check_ort, check_reference, node_model, rand


def grid(*shape: int) -> np.ndarray:
    """Normalised sampling positions, some of them outside [-1, 1] to exercise the padding."""
    return RNG.uniform(-1.4, 1.4, shape).astype(np.float32)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_2d(mode: str, padding: str, align: int) -> None:
    """Bicubic with border padding is refused: onnxruntime clamps each tap's coordinate
    (PyTorch's rule), the ONNX reference the sampling position only."""
    attrs = {"mode": mode, "padding_mode": padding, "align_corners": align}
    feed = {"x": rand(2, 3, 5, 4), "grid": grid(2, 6, 7, 2)}
    if (mode, padding) == ("cubic", "border"):
        with pytest.raises(UnsupportedOnnxError, match="disagree"):
            load_onnx(node_model("GridSample", feed, attrs, opset=20))
        return
    check_ort("GridSample", feed, attrs, opset=20, rtol=1e-4, atol=1e-5)
    check_reference("GridSample", feed, attrs, opset=20, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_grid_sample_volumetric(mode: str) -> None:
    attrs = {"mode": mode, "padding_mode": "border"}
    check_reference(
        "GridSample",
        {"x": rand(1, 2, 3, 4, 2), "grid": grid(1, 2, 3, 2, 3)},
        attrs,
        opset=20,
        rtol=1e-4,
        atol=1e-5,
    )


def test_grid_sample_opset16_mode_names() -> None:
    check_ort(
        "GridSample",
        {"x": rand(1, 1, 4, 4), "grid": grid(1, 3, 3, 2)},
        {"mode": "bicubic"},
        opset=16,
        rtol=1e-4,
        atol=1e-5,
    )


def test_grid_sample_nearest_of_integers_is_exact() -> None:
    x = np.arange(24, dtype=np.int32).reshape(1, 2, 3, 4)
    check_reference("GridSample", {"x": x, "grid": grid(1, 2, 5, 2)}, {"mode": "nearest"}, opset=20)


def test_grid_sample_linear_of_integers_is_refused() -> None:
    model = node_model(
        "GridSample", {"x": np.zeros((1, 1, 2, 2), np.int32), "grid": grid(1, 2, 2, 2)}, opset=20
    )
    with pytest.raises(UnsupportedOnnxError, match="interpolation"):
        load_onnx(model)


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("size", [[2, 3, 4, 5], [2, 3, 2, 4, 3]])
def test_affine_grid(align: int, size: list[int]) -> None:
    nd = len(size) - 2
    check_ort(
        "AffineGrid",
        {"theta": rand(2, nd, nd + 1)},
        {"align_corners": align},
        inits={"size": np.array(size, np.int64)},
        opset=20,
    )
