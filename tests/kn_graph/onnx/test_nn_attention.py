"""The ONNX Attention op (against the ONNX reference implementation, the backend tests' oracle) and
RotaryEmbedding (against a NumPy rotation)."""

from __future__ import annotations

import numpy as np
import pytest

from kn_graph.errors import UnsupportedOnnxError
from kn_graph.onnx import load_onnx
from kn_graph.ops import Attention
from tests.kn_graph.onnx.nn_helpers import (
    check_numpy,
    check_reference,
    node_model,
    onnx_reference,
    ours,
    rand,
)

QKV = ["q", "k", "v"]


def qkv(
    hq: int = 4, hkv: int = 2, m: int = 3, n: int = 5, d: int = 8, dv: int = 6
) -> dict[str, np.ndarray]:
    return {"q": rand(2, hq, m, d), "k": rand(2, hkv, n, d), "v": rand(2, hkv, n, dv)}


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"scale": 0.3},
        {"is_causal": 1},
        {"softcap": 1.5},
        {"is_causal": 1, "softcap": 2.0, "softmax_precision": 11},
    ],
)
def test_attention_4d_gqa(attrs: dict[str, object]) -> None:
    check_reference("Attention", qkv(), attrs, opset=23, rtol=1e-4, atol=1e-5)


def test_attention_3d_heads() -> None:
    feed = {"q": rand(2, 3, 4 * 8), "k": rand(2, 5, 2 * 8), "v": rand(2, 5, 2 * 6)}
    check_reference(
        "Attention",
        feed,
        {"q_num_heads": 4, "kv_num_heads": 2, "is_causal": 1},
        opset=23,
        rtol=1e-4,
        atol=1e-5,
    )


@pytest.mark.parametrize("mask_shape", [(3, 5), (2, 1, 3, 5), (3, 4), (5,)])
@pytest.mark.parametrize("dtype", [np.float32, np.bool_])
def test_attention_masks_including_short_and_fully_masked_rows(
    mask_shape: tuple[int, ...], dtype: type
) -> None:
    rng = np.random.default_rng(7)
    mask = rng.random(mask_shape) > 0.4
    if len(mask_shape) > 1:
        mask[..., 0, :] = False  # a fully masked row: zeros, not NaN
    feed = {
        **qkv(),
        "mask": mask if dtype is np.bool_ else np.where(mask, 0.0, -np.inf).astype(np.float32),
    }
    check_reference("Attention", feed, {}, opset=23, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [0, 1])
def test_attention_past_and_present_with_qk_output(causal: int) -> None:
    feed = {**qkv(m=3, n=3), "mask": rand(3, 7), "pk": rand(2, 2, 4, 8), "pv": rand(2, 2, 4, 6)}
    attrs = {"is_causal": causal, "qk_matmul_output_mode": 2}
    check_reference(
        "Attention",
        feed,
        attrs,
        opset=23,
        outputs=("y", "pk_out", "pv_out", "qk"),
        rtol=1e-4,
        atol=1e-5,
    )


def test_attention_nonpad_kv_seqlen_external_cache() -> None:
    feed = {**qkv(m=2, n=6), "lens": np.array([3, 6], np.int64)}
    check_reference(
        "Attention",
        feed,
        {"is_causal": 1},
        opset=24,
        order=["q", "k", "v", "", "", "", "lens"],
        rtol=1e-4,
        atol=1e-5,
    )


def test_attention_sliding_window() -> None:
    check_reference(
        "Attention",
        qkv(m=5, n=5),
        {"left_window_size": 1, "right_window_size": 2},
        opset=25,
        rtol=1e-4,
        atol=1e-5,
    )


def test_attention_plain_causal_uses_the_fused_op_with_symbolic_lengths() -> None:
    feed = qkv(hq=2, hkv=2, m=4, n=4)
    dims = {n: [2, 2, "s", 8 if n != "v" else 6] for n in QKV}
    model = node_model("Attention", feed, {"is_causal": 1}, opset=23, dims=dims)
    g = load_onnx(model)
    assert any(isinstance(g[v].op, Attention) and g[v].op.causal for v in g.values())
    for m in (4, 2):
        sub = {k: a[:, :, :m] for k, a in feed.items()}
        np.testing.assert_allclose(
            ours(model, sub)[0], onnx_reference(model, sub)[0], rtol=1e-4, atol=1e-5
        )


def test_attention_qk_mode0_with_softcap_is_refused() -> None:
    model = node_model("Attention", qkv(), {"softcap": 1.0}, opset=23, outputs=("y", "", "", "qk"))
    with pytest.raises(UnsupportedOnnxError, match="softcap"):
        load_onnx(model)


# -- RotaryEmbedding -----------------------------------------------------------------------------------
def _rotary(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool, rd: int
) -> np.ndarray:
    """x [B, H, S, D], cos/sin [B, S, rd/2]."""
    c, s = cos[:, None], sin[:, None]
    rot, rest = x[..., :rd], x[..., rd:]
    x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if interleaved else np.split(rot, 2, axis=-1)
    real, imag = c * x1 - s * x2, s * x1 + c * x2
    out = (
        np.stack([real, imag], -1).reshape(rot.shape)
        if interleaved
        else np.concatenate([real, imag], -1)
    )
    return np.concatenate([out, rest], -1)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rd", [0, 4])
def test_rotary_embedding_with_position_ids(interleaved: int, rd: int) -> None:
    x, cos, sin = rand(2, 3, 4, 8), rand(20, (rd or 8) // 2), rand(20, (rd or 8) // 2)
    pos = np.array([[0, 5, 9, 19], [3, 2, 1, 0]], np.int64)
    want = _rotary(x, cos[pos], sin[pos], bool(interleaved), rd or 8)
    check_numpy(
        "RotaryEmbedding",
        {"x": x, "cos": cos, "sin": sin, "pos": pos},
        [want],
        {"interleaved": interleaved, "rotary_embedding_dim": rd},
        opset=23,
    )


def test_rotary_embedding_3d_without_position_ids() -> None:
    x, cos, sin = rand(2, 4, 3 * 6), rand(2, 4, 3), rand(2, 4, 3)
    x4 = x.reshape(2, 4, 3, 6).transpose(0, 2, 1, 3)
    want = _rotary(x4, cos, sin, False, 6).transpose(0, 2, 1, 3).reshape(x.shape)
    check_numpy(
        "RotaryEmbedding", {"x": x, "cos": cos, "sin": sin}, [want], {"num_heads": 3}, opset=23
    )


# -- LinearAttention ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rule", "hq", "decay_width", "beta_width"),
    [("linear", 4, 0, 0), ("gated", 4, 2, 0), ("delta", 2, 0, 2), ("gated_delta", 4, 16, 1)],
)
def test_linear_attention_rules(rule: str, hq: int, decay_width: int, beta_width: int) -> None:
    hkv, d, steps = 2, 8, 3
    feed = {
        "q": rand(2, steps, hq * d),
        "k": rand(2, steps, hkv * d) * 0.3,
        "v": rand(2, steps, hkv * d),
        "past": rand(2, hkv, d, d),
    }
    order = ["q", "k", "v", "past", "", ""]
    if decay_width:
        feed["decay"] = -np.abs(rand(2, steps, decay_width))
        order[4] = "decay"
    if beta_width:
        feed["beta"] = np.abs(rand(2, steps, beta_width))
        order[5] = "beta"
    attrs = {"update_rule": rule, "q_num_heads": hq, "kv_num_heads": hkv}
    check_reference(
        "LinearAttention",
        feed,
        attrs,
        order=order,
        outputs=("y", "state"),
        opset=27,
        rtol=1e-4,
        atol=1e-5,
    )
