"""Pooling and normalisation ONNX ops against onnxruntime (NumPy where ORT lacks the op)."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph.errors import UnsupportedOnnxError
from kn_graph.onnx import load_onnx
from tests.kn_graph.onnx.nn_helpers import check_numpy, check_ort, node_model, rand


# -- pooling ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [3, 3]},
        {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 0, 1, 1]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
        {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER", "strides": [2, 2]},
        {"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER"},
        {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 1, 1, 1]},
    ],
)
def test_pool_2d(op: str, attrs: dict[str, object]) -> None:
    check_ort(op, {"x": rand(2, 3, 7, 8)}, attrs, opset=19)


def test_average_pool_count_include_pad() -> None:
    attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}
    check_ort("AveragePool", {"x": rand(1, 2, 5, 5)}, attrs)


def test_max_pool_uint8_and_1d() -> None:
    x = np.random.default_rng(0).integers(0, 255, (1, 2, 9), dtype=np.uint8)
    check_ort("MaxPool", {"x": x}, {"kernel_shape": [3], "strides": [2], "pads": [1, 1]})


@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [2, 2]},
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
        {"kernel_shape": [2, 3], "dilations": [2, 1], "ceil_mode": 1},
        {"kernel_shape": [2, 2], "storage_order": 1},
    ],
)
def test_max_pool_indices_output(attrs: dict[str, object]) -> None:
    """The Indices output (first largest element of each window, flat in the input) as
    onnxruntime computes it, ties included (an input of repeated values)."""
    x = np.round(rand(2, 3, 7, 6) * 2).astype(np.float32)  # many ties
    check_ort("MaxPool", {"x": x}, attrs, outputs=("y", "i"))


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"])
def test_global_pool(op: str) -> None:
    check_ort(op, {"x": rand(2, 3, 4, 5)})


@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [2, 2]},
        {"kernel_shape": [3, 3], "p": 3, "pads": [1, 1, 1, 1], "strides": [2, 2]},
        {"kernel_shape": [2, 2], "p": 1, "auto_pad": "SAME_UPPER"},
    ],
)
def test_lp_pool(attrs: dict[str, object]) -> None:
    check_ort("LpPool", {"x": rand(1, 2, 6, 7)}, attrs, rtol=1e-4)


# -- normalisation ------------------------------------------------------------------------------------
def test_batch_norm_inference() -> None:
    c = 3
    var = np.abs(rand(c)) + 0.5
    check_ort(
        "BatchNormalization",
        {"x": rand(2, c, 4, 5)},
        {"epsilon": 1e-3},
        inits={"s": rand(c), "b": rand(c), "m": rand(c), "v": var},
    )


def test_batch_norm_training_mode_is_refused() -> None:
    c = 2
    model = node_model(
        "BatchNormalization",
        {"x": rand(2, c, 3)},
        {"training_mode": 1},
        inits={"s": rand(c), "b": rand(c), "m": rand(c), "v": np.ones(c, np.float32)},
    )
    with pytest.raises(UnsupportedOnnxError, match="training_mode"):
        load_onnx(model)


def test_instance_norm() -> None:
    check_ort(
        "InstanceNormalization",
        {"x": rand(2, 3, 4, 5)},
        {"epsilon": 1e-4},
        inits={"s": rand(3), "b": rand(3)},
    )


@pytest.mark.parametrize("opset", [18, 21])
def test_group_norm_scale_per_group_or_channel(opset: int) -> None:
    x, groups, c = rand(2, 6, 3, 2), 3, 6
    per = groups if opset == 18 else c
    s, b = rand(per), rand(per)
    xg = x.reshape(2, groups, -1)
    y = ((xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + 1e-5)).reshape(
        x.shape
    )
    sc, bc = (np.repeat(s, c // groups), np.repeat(b, c // groups)) if opset == 18 else (s, b)
    want = y * sc.reshape(c, 1, 1) + bc.reshape(c, 1, 1)
    check_numpy(
        "GroupNormalization",
        {"x": x},
        [want.astype(np.float32)],
        {"num_groups": groups},
        inits={"s": s, "b": b},
        opset=opset,
        rtol=1e-4,
    )


@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_layer_norm_with_stash_outputs(axis: int) -> None:
    x = rand(2, 3, 4)
    shape = x.shape[axis:]
    check_ort(
        "LayerNormalization",
        {"x": x},
        {"axis": axis},
        inits={"s": rand(*shape), "b": rand(*shape)},
        outputs=("y", "mean", "inv_std"),
        opset=17,
        rtol=1e-4,
    )


def test_rms_norm() -> None:
    x, s = rand(2, 3, 4), rand(4)
    want = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * s
    check_numpy(
        "RMSNormalization", {"x": x}, [want.astype(np.float32)], inits={"s": s}, opset=23, rtol=1e-4
    )


def test_lrn_odd_size() -> None:
    check_ort(
        "LRN",
        {"x": rand(2, 6, 3, 3)},
        {"size": 3, "alpha": 0.01, "beta": 0.5, "bias": 2.0},
        rtol=1e-4,
    )


def test_lrn_even_size_window_is_one_more_after() -> None:
    x, size = rand(1, 5, 2, 2), 4
    sq = np.zeros_like(x)
    for c in range(5):
        lo, hi = max(0, c - (size - 1) // 2), min(4, c + size // 2)
        sq[:, c] = np.sum(x[:, lo : hi + 1] ** 2, axis=1)
    want = x / (1.0 + 1e-4 / size * sq) ** 0.75
    check_numpy("LRN", {"x": x}, [want.astype(np.float32)], {"size": size}, rtol=1e-5)


@pytest.mark.parametrize(("p", "axis"), [(1, 0), (2, 1), (2, -1)])
def test_lp_normalization(p: int, axis: int) -> None:
    check_ort("LpNormalization", {"x": rand(3, 4, 2)}, {"p": p, "axis": axis})


def test_lp_normalization_zero_vector_stays_zero() -> None:
    x = np.zeros((2, 3), np.float32)
    check_numpy("LpNormalization", {"x": x}, [x], {"axis": 1})


def test_mean_variance_normalization() -> None:
    check_ort("MeanVarianceNormalization", {"x": rand(2, 3, 4, 5)}, rtol=1e-4, atol=1e-5)


def test_batch_norm_f16_input_with_f32_statistics() -> None:
    """Opset 15 lets the statistics be f32 under an f16 input; the result is computed in the
    input's type (the loader casts the statistics to it), so each of its four f16
    operations may round by half an ulp of what it produced: the tolerance is that, from the
    data's own magnitudes (an earlier fixed 2e-3 failed on draws with larger intermediates)."""
    c = 3
    rng = np.random.default_rng(15)
    x = rng.standard_normal((2, c, 4)).astype(np.float16)
    s, b, m = (rng.standard_normal(c).astype(np.float32) for _ in range(3))
    v = np.abs(rng.standard_normal(c)).astype(np.float32) + 0.5
    centred = x.astype(np.float32) - m[:, None]
    normed = centred / np.sqrt(v[:, None] + 1e-5)
    exact = normed * s[:, None] + b[:, None]
    want = exact.astype(np.float16)
    magnitude = max(
        float(np.abs(a).max()) for a in (x, centred, normed, normed * s[:, None], exact)
    )
    f16_half_ulp = 2.0**-11  # relative
    atol = 4 * f16_half_ulp * magnitude * max(1.0, float(np.abs(s).max()))
    check_numpy(
        "BatchNormalization",
        {"x": x},
        [want],
        inits={"s": s, "b": b, "m": m, "v": v},
        opset=15,
        rtol=2e-3,
        atol=atol,
    )


@pytest.mark.parametrize("op", ["Conv", "MaxPool", "AveragePool", "LpPool"])
def test_same_padding_with_dilation_is_refused(op: str) -> None:
    attrs: dict[str, object] = {"auto_pad": "SAME_UPPER", "dilations": [2, 2]}
    inits = {"w": rand(1, 1, 3, 3)} if op == "Conv" else {}
    if op != "Conv":
        attrs["kernel_shape"] = [3, 3]
    model = node_model(op, {"x": rand(1, 1, 6, 6)}, attrs, inits=inits, opset=19)
    with pytest.raises(UnsupportedOnnxError, match="dilations"):
        load_onnx(model)
