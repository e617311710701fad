"""onnxruntime's fused normalisations and activations (com.microsoft, and SimplifiedLayerNormalization
in the default domain) against onnxruntime; the ops that onnxruntime runs only on GPUs (GroupNorm,
SkipGroupNorm, BiasAdd, BiasSplitGelu, BiasDropout) against NumPy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kn_graph.errors import UnsupportedOnnxError
from kn_graph.onnx import load_onnx
from tests.kn_graph.onnx.contrib_helpers import check, ms_model, rand

RNG = np.random.default_rng(2024)


def _ln(x: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    return (x64 - mean) / np.sqrt(x64.var(-1, keepdims=True) + eps)


def _gelu(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


@pytest.mark.parametrize("beta", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_skip_layer_norm_with_every_output(beta: bool, bias: bool) -> None:
    feed = {"x": rand(RNG, 2, 3, 16), "skip": rand(RNG, 2, 3, 16), "gamma": rand(RNG, 16)}
    order = ["x", "skip", "gamma", "beta" if beta else "", "bias" if bias else ""]
    if beta:
        feed["beta"] = rand(RNG, 16)
    if bias:
        feed["bias"] = rand(RNG, 16)
    m = ms_model("SkipLayerNormalization", feed, ["y", "mean", "inv", "sum"], order=order)
    check(m, feed)


@pytest.mark.parametrize("skip_shape", [(1, 3, 16), (3, 16)])
def test_skip_layer_norm_broadcast_skip_and_default_epsilon(skip_shape: tuple[int, ...]) -> None:
    feed = {"x": rand(RNG, 2, 3, 16) * 1e-5, "skip": rand(RNG, *skip_shape) * 1e-5}
    feed["gamma"], feed["beta"] = rand(RNG, 16), rand(RNG, 16)
    check(ms_model("SkipLayerNormalization", feed), feed, rtol=1e-3)  # eps 1e-12 matters here


@pytest.mark.parametrize("bias", [True, False])
def test_skip_simplified_layer_norm(bias: bool) -> None:
    feed = {"x": rand(RNG, 2, 3, 16), "skip": rand(RNG, 2, 3, 16), "gamma": rand(RNG, 16)}
    if bias:
        feed["bias"] = rand(RNG, 16)
    m = ms_model("SkipSimplifiedLayerNormalization", feed, ["y", "", "inv", "sum"], epsilon=1e-6)
    check(m, feed)


def test_skip_simplified_layer_norm_2d_tokens() -> None:
    feed = {"x": rand(RNG, 5, 16), "skip": rand(RNG, 5, 16), "gamma": rand(RNG, 16)}
    check(ms_model("SkipSimplifiedLayerNormalization", feed), feed)


@pytest.mark.parametrize("axis", [-1, 1])
def test_simplified_layer_norm_default_domain_with_inv_std(axis: int) -> None:
    feed = {"x": rand(RNG, 2, 3, 8), "scale": rand(RNG, *([3, 8] if axis == 1 else [8]))}
    m = ms_model("SimplifiedLayerNormalization", feed, ["y", "inv"], domain="", axis=axis)
    check(m, feed)


def test_layer_normalization_at_opset_14_is_onnxruntimes_default_domain_op() -> None:
    """onnxruntime has LayerNormalization before ONNX did (opset 17); exporters at opset < 17
    and the transformer optimizer emit it."""
    from tests.kn_graph.onnx.helpers import model, node, reference

    feed = {"x": rand(RNG, 2, 3, 8), "s": rand(RNG, 8), "b": rand(RNG, 8)}
    m = model([node("LayerNormalization", ["x", "s", "b"], epsilon=1e-6)], feed, opset=14)
    check(m, feed, reference(m, feed))


@pytest.mark.parametrize(
    ("op", "inputs", "attrs", "fn"),
    [
        (
            "FastGelu",
            1,
            {},
            lambda x: 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x**3))),
        ),
        ("FastGelu", 2, {}, None),
        ("BiasGelu", 2, {}, None),
        ("Gelu", 1, {}, None),
        ("QuickGelu", 1, {}, None),
        ("QuickGelu", 1, {"alpha": 1.3}, None),
    ],
)
def test_gelu_family(op: str, inputs: int, attrs: dict[str, object], fn: object) -> None:
    feed = {"x": rand(RNG, 2, 3, 8) * 3, "bias": rand(RNG, 8)}
    feed = dict(list(feed.items())[:inputs])
    m = ms_model(op, feed, **attrs)
    check(m, feed)
    if callable(fn):  # and onnxruntime is the tanh formula, not ours by construction
        check(m, feed, [fn(feed["x"].astype(np.float64)).astype(np.float32)])


def test_bias_add_and_bias_split_gelu_against_numpy() -> None:
    x, bias, skip = rand(RNG, 2, 4, 8), rand(RNG, 8), rand(RNG, 2, 4, 8)
    check(
        ms_model("BiasAdd", {"x": x, "bias": bias, "skip": skip}),
        {"x": x, "bias": bias, "skip": skip},
        [x + bias + skip],
    )
    s = (x + bias).astype(np.float64)
    want = (s[..., :4] * _gelu(s[..., 4:])).astype(np.float32)
    check(ms_model("BiasSplitGelu", {"x": x, "bias": bias}), {"x": x, "bias": bias}, [want])


def test_bias_dropout_at_inference_and_training_refused() -> None:
    x, bias, res = rand(RNG, 2, 4, 8), rand(RNG, 8), rand(RNG, 2, 4, 8)
    feed = {"x": x, "bias": bias, "res": res}
    m = ms_model(
        "BiasDropout",
        feed,
        ["y", "mask"],
        order=["x", "bias", "res", "ratio", "mode"],
        inits={"ratio": np.array(0.3, np.float32), "mode": np.array(False)},
    )
    check(m, feed, [x + bias + res, np.ones(x.shape, bool)])
    m = ms_model(
        "BiasDropout", feed, order=["x", "bias", "res", "", "mode"], inits={"mode": np.array(True)}
    )
    with pytest.raises(UnsupportedOnnxError, match="training_mode"):
        load_onnx(m)


def _group_norm_nhwc(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, groups: int) -> np.ndarray:
    n, h, w, c = x.shape
    grouped = x.astype(np.float64).reshape(n, h * w, groups, c // groups)
    mean = grouped.mean(axis=(1, 3), keepdims=True)
    var = grouped.var(axis=(1, 3), keepdims=True)
    y = ((grouped - mean) / np.sqrt(var + 1e-5)).reshape(x.shape)
    return y * gamma + beta


@pytest.mark.parametrize("activation", [0, 1])
@pytest.mark.parametrize("channels_last", [1, 0])
def test_group_norm_nhwc_with_silu(activation: int, channels_last: int) -> None:
    x, gamma, beta = rand(RNG, 2, 3, 5, 8), rand(RNG, 8), rand(RNG, 8)
    want = _group_norm_nhwc(x, gamma, beta, 4)
    if activation:
        want = want / (1 + np.exp(-want))
    xin = x if channels_last else x.transpose(0, 3, 1, 2).copy()
    want = want if channels_last else want.transpose(0, 3, 1, 2)
    feed = {"x": xin, "gamma": gamma, "beta": beta}
    m = ms_model("GroupNorm", feed, groups=4, activation=activation, channels_last=channels_last)
    check(m, feed, [want.astype(np.float32)])


@pytest.mark.parametrize("skip_shape", [(2, 3, 5, 8), (2, 1, 1, 8), (2, 8)])
def test_skip_group_norm_with_sum_output(skip_shape: tuple[int, ...]) -> None:
    x, gamma, beta, bias = rand(RNG, 2, 3, 5, 8), rand(RNG, 8), rand(RNG, 8), rand(RNG, 8)
    skip = rand(RNG, *skip_shape)
    s = x + (skip if len(skip_shape) == 4 else skip.reshape(2, 1, 1, 8)) + bias
    feed = {"x": x, "gamma": gamma, "beta": beta, "skip": skip, "bias": bias}
    m = ms_model("SkipGroupNorm", feed, ["y", "s"], groups=2, activation=0)
    check(m, feed, [_group_norm_nhwc(s, gamma, beta, 2).astype(np.float32), s])


def test_unsupported_values_name_the_node_and_attribute() -> None:
    x, gamma, beta = rand(RNG, 2, 3, 5, 8), rand(RNG, 8), rand(RNG, 8)
    m = ms_model("GroupNorm", {"x": x, "gamma": gamma, "beta": beta}, groups=4, activation=2)
    m.graph.node[0].name = "gn0"
    with pytest.raises(UnsupportedOnnxError, match=r"gn0.*activation 2"):
        load_onnx(m)
    feed = {"x": rand(RNG, 2, 3, 16), "skip": rand(RNG, 2, 3, 16), "gamma": rand(RNG, 16)}
    m = ms_model("SkipSimplifiedLayerNormalization", feed, ["y", "mean"])
    with pytest.raises(UnsupportedOnnxError, match="mean"):
        load_onnx(m)
