"""Resize and Upsample against onnxruntime, including the symbolic 2x nearest upsampling of dynamic
exports (a repeat, no gather tables)."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph.errors import SymbolicSizeError, UnsupportedOnnxError
from kn_graph.onnx import load_onnx
from kn_graph.ops import Gather
from kn_runtime import Device
from tests.kn_graph.onnx.nn_helpers import (
    assert_close,
    check_ort,
    check_reference,
    node_model,
    onnx_reference,
    onnxruntime,
    ours,
    rand,
)

EMPTY = np.zeros(0, np.float32)


def scales(*s: float) -> np.ndarray:
    return np.array(s, np.float32)


@pytest.mark.parametrize(
    "coord", ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"]
)
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("factor", [2.0, 0.6, 1.7])
def test_resize_scales(coord: str, mode: str, factor: float) -> None:
    """Against the ONNX reference and onnxruntime where they agree; where they do not (a
    fractional output width with a length-dependent coordinate mode) the node is refused."""
    attrs = {"mode": mode, "coordinate_transformation_mode": coord}
    feed = {"x": rand(1, 2, 5, 6)}
    model = node_model(
        "Resize", feed, attrs, inits={"roi": EMPTY, "scales": scales(1, 1, factor, 2.0)}
    )
    ref, ort_out = onnx_reference(model, feed), onnxruntime(model, feed)
    agree = np.allclose(ref[0], ort_out[0], rtol=1e-4, atol=1e-5)
    if not agree:
        with pytest.raises(UnsupportedOnnxError, match="disagree"):
            load_onnx(model)
        return
    assert_close(ours(model, feed), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
)
def test_resize_nearest_modes_with_sizes(nearest_mode: str) -> None:
    attrs = {"mode": "nearest", "nearest_mode": nearest_mode}
    sizes = np.array([1, 1, 7, 3], np.int64)
    check_ort(
        "Resize",
        {"x": rand(1, 1, 4, 5)},
        attrs,
        inits={"roi": EMPTY, "sizes": sizes},
        order=["x", "roi", "", "sizes"],
    )


def test_resize_cubic_exclude_outside_and_coefficient() -> None:
    attrs = {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1}
    check_ort(
        "Resize",
        {"x": rand(1, 1, 4, 4)},
        attrs,
        inits={"roi": EMPTY, "scales": scales(1, 1, 1.5, 0.75)},
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias_downsampling(mode: str) -> None:
    attrs = {"mode": mode, "antialias": 1}
    check_ort(
        "Resize",
        {"x": rand(1, 1, 8, 8)},
        attrs,
        inits={"roi": EMPTY, "scales": scales(1, 1, 0.4, 0.5)},
        rtol=1e-4,
        atol=1e-5,
    )


def test_resize_tf_crop_and_resize_extrapolates() -> None:
    attrs = {
        "mode": "linear",
        "coordinate_transformation_mode": "tf_crop_and_resize",
        "extrapolation_value": 9.0,
    }
    roi = np.array([0, 0, 0.2, 0.5, 1, 1, 1.3, 1.2], np.float32)
    check_ort(
        "Resize",
        {"x": rand(1, 1, 4, 4)},
        attrs,
        inits={"roi": roi, "sizes": np.array([1, 1, 3, 5], np.int64)},
        order=["x", "roi", "", "sizes"],
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_resize_axes_and_aspect_ratio_policy(policy: str) -> None:
    attrs = {"mode": "nearest", "axes": [3, 2], "keep_aspect_ratio_policy": policy}
    check_ort(
        "Resize",
        {"x": rand(1, 2, 3, 4)},
        attrs,
        inits={"sizes": np.array([9, 5], np.int64)},
        order=["x", "", "", "sizes"],
    )


def test_resize_integer_data_nearest_is_exact() -> None:
    x = np.arange(24, dtype=np.int32).reshape(1, 2, 3, 4)
    check_ort(
        "Resize",
        {"x": x},
        {"mode": "nearest"},
        inits={"roi": EMPTY, "scales": scales(1, 1, 2, 1.5)},
    )


def test_resize_linear_of_integers_is_refused() -> None:
    model = node_model(
        "Resize",
        {"x": np.zeros((1, 1, 2, 2), np.int32)},
        {"mode": "linear"},
        inits={"roi": EMPTY, "scales": scales(1, 1, 1.5, 1.5)},
    )
    with pytest.raises(UnsupportedOnnxError, match="linear"):
        load_onnx(model)


def test_resize_opset10_nearest_matches_onnxruntime() -> None:
    check_ort(
        "Resize",
        {"x": rand(1, 1, 3, 4)},
        {"mode": "nearest"},
        inits={"scales": scales(1, 1, 2, 0.5)},
        opset=10,
    )


def test_upsample_nearest() -> None:
    check_ort(
        "Upsample",
        {"x": rand(1, 2, 2, 3)},
        {"mode": "nearest"},
        inits={"scales": scales(1, 1, 2, 3)},
        opset=9,
    )


@pytest.mark.parametrize("coord", ["half_pixel", "asymmetric"])
def test_symbolic_2x_nearest_upsampling_is_a_repeat(coord: str) -> None:
    x = rand(2, 3, 4, 5)
    attrs = {"mode": "nearest", "coordinate_transformation_mode": coord}
    model = node_model(
        "Resize",
        {"x": x},
        attrs,
        inits={"roi": EMPTY, "scales": scales(1, 1, 2, 2)},
        dims={"x": ["N", 3, "h", "w"]},
    )
    g = load_onnx(model)
    assert str(g.shape(g.outputs[0])) == "[B,3,2*h,2*w]"
    assert not any(isinstance(g[v].op, Gather) for v in g.values())
    for feed in ({"x": x}, {"x": rand(1, 3, 3, 2)}):
        np.testing.assert_array_equal(ours(model, feed)[0], onnxruntime(model, feed)[0])


def test_symbolic_linear_resize_runs_per_input_shape() -> None:
    model = node_model(
        "Resize",
        {"x": rand(1, 1, 4, 4)},
        {"mode": "linear"},
        inits={"roi": EMPTY, "scales": scales(1, 1, 2, 2)},
        dims={"x": [1, 1, "h", "w"]},
    )
    with pytest.raises(SymbolicSizeError, match="symbolic"):
        load_onnx(model, static=True)
    prepared = Device.cpu().prepare(load_onnx(model))  # bilinear taps depend on the size
    for feed in ({"x": rand(1, 1, 4, 4)}, {"x": rand(1, 1, 3, 5)}):
        np.testing.assert_allclose(
            prepared.eval(feed)[0], onnxruntime(model, feed)[0], rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias_strong_downsampling_uses_a_dense_matrix(mode: str) -> None:
    attrs = {"mode": mode, "antialias": 1}
    model = node_model(
        "Resize",
        {"x": rand(1, 2, 24, 20)},
        attrs,
        inits={"roi": EMPTY, "scales": scales(1, 1, 0.2, 0.15)},
    )
    g = load_onnx(model)
    assert sum(isinstance(g[v].op, Gather) for v in g.values()) == 0
    check_reference(
        "Resize",
        {"x": rand(1, 2, 24, 20)},
        attrs,
        inits={"roi": EMPTY, "scales": scales(1, 1, 0.2, 0.15)},
        rtol=1e-4,
        atol=1e-5,
    )


def test_resize_scales_with_aspect_policy_attribute_as_dynamo_exports_it() -> None:
    attrs = {
        "mode": "nearest",
        "keep_aspect_ratio_policy": "stretch",
        "coordinate_transformation_mode": "asymmetric",
    }
    check_ort(
        "Resize",
        {"x": rand(1, 2, 3, 4)},
        attrs,
        inits={"roi": EMPTY, "scales": scales(1, 1, 2, 2)},
        opset=19,
    )
