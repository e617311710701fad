"""onnxruntime's Attention, MultiHeadAttention and EmbedLayerNormalization (com.microsoft) against
onnxruntime, on our reference executor and on Device.cpu(). The packed Q/K/V forms, which
onnxruntime's CPU kernel refuses, are checked against onnxruntime on the unpacked model."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph.errors import UnsupportedOnnxError
from kn_graph.onnx import load_onnx
from tests.kn_graph.onnx.contrib_helpers import check, ms_model, rand
from tests.kn_graph.onnx.helpers import reference

RNG = np.random.default_rng(77)
B, S, DIN, H = 2, 4, 12, 2


def _attention_feed(width: int = 3 * 8, past: int = 0) -> dict[str, np.ndarray]:
    feed = {"x": rand(RNG, B, S, DIN), "w": rand(RNG, DIN, width) * 0.5, "bias": rand(RNG, width)}
    if past:
        feed["past"] = rand(RNG, 2, B, H, past, width // 3 // H)
    return feed


def _raw_mask(total: int) -> np.ndarray:
    mask = (RNG.random((B, total)) > 0.3).astype(np.int32)
    mask[1, :] = 0  # a row whose every key is masked: a softmax of filtered scores
    return mask


@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize(
    "mask",
    [
        None,
        "raw2d",
        "lengths",
        "end_start",
        "raw3d",
    ],
)
def test_attention_mask_forms(unidirectional: int, mask: str | None) -> None:
    feed = _attention_feed()
    match mask:
        case "raw2d":
            feed["mask"] = _raw_mask(S)
        case "lengths":
            feed["mask"] = np.array([3, 1], np.int32)
        case "end_start":
            feed["mask"] = np.array([3, 4, 1, 0], np.int32)
        case "raw3d":
            feed["mask"] = (RNG.random((B, S, S)) > 0.3).astype(np.int32)
    order = ["x", "w", "bias", "mask" if mask else ""]
    m = ms_model("Attention", feed, order=order, num_heads=H, unidirectional=unidirectional)
    check(m, feed)


@pytest.mark.parametrize("past", [0, 3])
def test_attention_past_present_or_attention_bias_with_mask_and_scale(past: int) -> None:
    """onnxruntime refuses past together with attention_bias: one of them per case."""
    feed = _attention_feed(past=past)
    feed["mask"] = _raw_mask(past + S)
    if not past:
        feed["ab"] = rand(RNG, 1, H, S, S)
    order = ["x", "w", "bias", "mask", "past" if past else "", "" if past else "ab"]
    m = ms_model(
        "Attention",
        feed,
        ["y", "present"],
        order=order,
        num_heads=H,
        unidirectional=1,
        scale=0.2,
        mask_filter_value=-300.0,
    )
    check(m, feed, rtol=1e-3)  # a fully masked row adds up scores near -300: float32 rounding


def test_attention_qkv_hidden_sizes_and_no_bias() -> None:
    feed = _attention_feed(width=8 + 8 + 12)
    del feed["bias"]
    m = ms_model("Attention", feed, num_heads=H, qkv_hidden_sizes=[8, 8, 12])
    check(m, feed)


def test_attention_rotary_is_refused_naming_the_node() -> None:
    feed = _attention_feed()
    m = ms_model("Attention", feed, num_heads=H, do_rotary=1)
    m.graph.node[0].name = "attn7"
    with pytest.raises(UnsupportedOnnxError, match=r"attn7.*do_rotary"):
        load_onnx(m)


def _mha_feed(length: int = 5, d: int = 8, dv: int = 6) -> dict[str, np.ndarray]:
    return {
        "q": rand(RNG, B, S, H * d),
        "k": rand(RNG, B, length, H * d),
        "v": rand(RNG, B, length, H * dv),
        "bias": rand(RNG, H * (2 * d + dv)),
    }


@pytest.mark.parametrize("mask", [None, "raw", "lengths"])
def test_multi_head_cross_attention_with_bias_and_key_padding(mask: str | None) -> None:
    feed = _mha_feed()
    if mask == "raw":
        feed["kpm"] = _raw_mask(5)
    elif mask == "lengths":
        feed["kpm"] = np.array([5, 2], np.int32)
    order = ["q", "k", "v", "bias", "kpm" if mask else ""]
    check(ms_model("MultiHeadAttention", feed, order=order, num_heads=H), feed)


def test_multi_head_self_attention_with_past_present_and_attention_bias() -> None:
    feed = _mha_feed(length=S, dv=8)
    feed["ab"] = rand(RNG, B, 1, S, 3 + S)
    feed["pk"], feed["pv"] = rand(RNG, B, H, 3, 8), rand(RNG, B, H, 3, 8)
    order = ["q", "k", "v", "bias", "", "ab", "pk", "pv"]
    m = ms_model(
        "MultiHeadAttention",
        feed,
        ["y", "pk_out", "pv_out"],
        order=order,
        num_heads=H,
        unidirectional=1,
    )
    check(m, feed)


def test_multi_head_attention_keys_already_in_heads() -> None:
    feed = {"q": rand(RNG, B, S, H * 8), "k": rand(RNG, B, H, 5, 8), "v": rand(RNG, B, H, 5, 8)}
    check(ms_model("MultiHeadAttention", feed, num_heads=H, scale=0.5), feed)


@pytest.mark.parametrize("packing", ["qkv", "kv"])
def test_multi_head_attention_packed_inputs_match_unpacked(packing: str) -> None:
    q, k, v = rand(RNG, B, S, H, 8), rand(RNG, B, S, H, 8), rand(RNG, B, S, H, 8)
    flat = {n: t.reshape(B, S, H * 8) for n, t in (("q", q), ("k", k), ("v", v))}
    want = reference(ms_model("MultiHeadAttention", flat, num_heads=H, unidirectional=1), flat)
    if packing == "qkv":
        feed = {"qkv": np.stack([q, k, v], axis=3)}
    else:
        feed = {"q": flat["q"], "kv": np.stack([k, v], axis=3)}
    check(ms_model("MultiHeadAttention", feed, num_heads=H, unidirectional=1), feed, want)


def _embed_feed(segments: bool) -> dict[str, np.ndarray]:
    feed = {"ids": RNG.integers(0, 30, (B, S)).astype(np.int32)}
    if segments:
        feed["seg"] = RNG.integers(0, 2, (B, S)).astype(np.int32)
    feed |= {"word": rand(RNG, 30, 16), "pos": rand(RNG, 9, 16)}
    if segments:
        feed["segemb"] = rand(RNG, 2, 16)
    return feed | {"gamma": rand(RNG, 16), "beta": rand(RNG, 16)}


def test_embed_layer_norm_with_segments_mask_and_every_output() -> None:
    feed = _embed_feed(True)
    feed["mask"] = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], np.int32)
    m = ms_model("EmbedLayerNormalization", feed, ["y", "mask_index", "sum"], epsilon=1e-5)
    check(m, feed)


def test_embed_layer_norm_with_position_ids_and_no_segments() -> None:
    feed = _embed_feed(False)
    feed["posids"] = np.array([[3, 2, 1, 0]], np.int32)
    order = ["ids", "", "word", "pos", "", "gamma", "beta", "", "posids"]
    check(ms_model("EmbedLayerNormalization", feed, ["y", "mask_index"], order=order), feed)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize(
    ("layout", "positions", "rotary_dim"),
    [("bsd", "offset", 0), ("bsd", "ids", 0), ("bhsd", "ids", 0), ("bsd", "offset", 4)],
)
def test_contrib_rotary_embedding(
    interleaved: int, layout: str, positions: str, rotary_dim: int
) -> None:
    x = rand(RNG, B, S, H * 8) if layout == "bsd" else rand(RNG, B, H, S, 8)
    pos = np.array([3], np.int64) if positions == "offset" else RNG.integers(0, 10, (B, S))
    half = (rotary_dim or 8) // 2
    angles = np.arange(10)[:, None] * (0.5 ** np.arange(half))[None]
    feed = {"x": x, "pos": pos.astype(np.int64), "cos": np.cos(angles).astype(np.float32)}
    feed["sin"] = np.sin(angles).astype(np.float32)
    attrs = {"interleaved": interleaved}
    if rotary_dim or layout == "bsd":
        attrs |= {"num_heads": H, "rotary_embedding_dim": rotary_dim}
    check(ms_model("RotaryEmbedding", feed, **attrs), feed)


def test_contrib_rotary_packed_batching_is_refused() -> None:
    feed = {"x": rand(RNG, B, S, 8), "pos": np.array([0], np.int64)}
    feed |= {"cos": rand(RNG, 10, 4), "sin": rand(RNG, 10, 4)}
    with pytest.raises(UnsupportedOnnxError, match="is_packed_batching"):
        load_onnx(ms_model("RotaryEmbedding", feed, is_packed_batching=1))
