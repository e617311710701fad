"""onnxruntime's GroupQueryAttention (com.microsoft) against onnxruntime's CPU kernel, on our
reference executor and on Device.cpu(): prompts with right padding, decode steps over a growing
and over a shared (fixed-capacity) KV buffer with a different length per batch row, packed QKV,
rotary, local windows, softcap, scale, head sinks, attention_bias, position_ids and
query_seqlens; present_key/present_value are compared everywhere onnxruntime defines them."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import pytest
from onnx import helper

from kn_graph.errors import UnsupportedOnnxError
from kn_graph.graph import Graph
from kn_graph.onnx import ValueSpecializedModel, load_onnx
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_graph.onnx.contrib_helpers import MS, rand
from tests.kn_graph.onnx.helpers import model, reference
from tests.kn_graph.onnx.nn_helpers import assert_close

RNG = np.random.default_rng(2024)
B, H = 2, 4
INPUTS = ("q", "k", "v", "past_k", "past_v", "seqlens", "total", "cos", "sin", "pos", "bias")
INPUTS += ("sink", "k_scale", "v_scale", "q_norm", "k_norm", "qlens")
"""The node's inputs by position; a feed names the ones it gives."""


def _feed(
    s: int,
    past: int | None,
    seqlens: list[int],
    total: int,
    *,
    kv: int = 2,
    d: int = 16,
    packed: bool = False,
) -> dict[str, np.ndarray]:
    feed: dict[str, np.ndarray] = {}
    if packed:
        feed["q"] = rand(RNG, B, s, (H + 2 * kv) * d)
    else:
        feed |= {"q": rand(RNG, B, s, H * d), "k": rand(RNG, B, s, kv * d)}
        feed["v"] = rand(RNG, B, s, kv * d)
    if past is not None:
        feed |= {"past_k": rand(RNG, B, kv, past, d), "past_v": rand(RNG, B, kv, past, d)}
    feed["seqlens"] = np.array(seqlens, np.int32)
    feed["total"] = np.array(total, np.int32)
    return feed


def _rotary(feed: dict[str, np.ndarray], half: int, positions: int = 16) -> None:
    angles = RNG.uniform(0, 6, (positions, half)).astype(np.float32)
    feed |= {"cos": np.cos(angles), "sin": np.sin(angles)}


def _model(feed: Mapping[str, np.ndarray], name: str = "gqa", **attrs: object) -> onnx.ModelProto:
    given = [n if n in feed else "" for n in INPUTS]
    while given[-1] == "":
        given.pop()
    outputs = ["y", "present_k", "present_v"]
    node = helper.make_node(
        "GroupQueryAttention", given, outputs, domain=MS, name=name, num_heads=H, **attrs
    )
    return model([node], feed, outputs, opset=17, domains={MS: 1})


def _ours(m: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> list[list[np.ndarray]]:
    """Our results on the reference executor and on Device.cpu(), for a graph or a model
    specialized on the value of total_sequence_length."""
    loaded = load_onnx(m)
    graph = loaded.specialize(feed) if isinstance(loaded, ValueSpecializedModel) else loaded
    assert isinstance(graph, Graph)
    ref = evaluate(graph, {n: feed[n] for n in graph.input_names})
    return [ref, Device.cpu().prepare(loaded).eval(dict(feed))]


def _check(
    m: onnx.ModelProto, feed: Mapping[str, np.ndarray], valid_rows: np.ndarray | None = None
) -> None:
    """Ours equals onnxruntime; `valid_rows` [B, S] bool: compare only those output rows
    (onnxruntime leaves right-padding rows unspecified)."""
    want = reference(m, feed)
    for got in _ours(m, feed):
        if valid_rows is None:
            assert_close(got, want, 1e-4, 1e-5)
        else:
            assert got[0].shape == want[0].shape
            assert_close(
                [got[0][valid_rows], *got[1:]], [want[0][valid_rows], *want[1:]], 1e-4, 1e-5
            )


# decode over a growing cache: present = P + S; over a shared buffer: T <= P, present = P.
# Row 1 is shorter than row 0 in each: leftover positions behind its tokens.
CASES = {
    "prompt": (3, None, [2, 1], 3),  # no past; row 1 is right-padded (its last row is padding)
    "decode_growing": (1, 4, [4, 2], 5),
    "decode_shared": (1, 6, [4, 2], 5),
    "first_prompt_shared": (3, 8, [2, 1], 3),
}


@pytest.mark.parametrize(
    "case, kv",
    [
        ("prompt", 2),
        ("prompt", 1),
        ("decode_growing", 2),
        ("decode_shared", 1),
        ("first_prompt_shared", 2),
    ],
)
def test_prompt_and_decode_per_row_lengths(case: str, kv: int) -> None:
    s, past, seqlens, total = CASES[case]
    feed = _feed(s, past, seqlens, total, kv=kv, d=8)
    _check(_model(feed, kv_num_heads=kv), feed)


@pytest.mark.parametrize(
    "case, interleaved", [("prompt", 1), ("decode_growing", 0), ("decode_growing", 1)]
)
def test_rotary_on_query_and_new_keys(case: str, interleaved: int) -> None:
    """Half the features rotate (cos_cache 8 wide for head size 32), at positions from
    seqlens_k; present_key holds the rotated keys."""
    s, past, seqlens, total = CASES[case]
    feed = _feed(s, past, seqlens, total, d=32)
    _rotary(feed, 8)
    m = _model(feed, kv_num_heads=2, do_rotary=1, rotary_interleaved=interleaved)
    _check(m, feed)


@pytest.mark.parametrize("case", ["prompt", "decode_shared"])
def test_packed_qkv_with_one_kv_head(case: str) -> None:
    s, past, seqlens, total = CASES[case]
    feed = _feed(s, past, seqlens, total, kv=1, packed=True)
    _rotary(feed, 8)
    _check(_model(feed, kv_num_heads=1, do_rotary=1), feed)


@pytest.mark.parametrize("s, past, seqlens, total", [(5, None, [4, 3], 5), (1, 6, [6, 3], 7)])
def test_local_window(s: int, past: int | None, seqlens: list[int], total: int) -> None:
    """A query sees its local_window_size latest keys (itself included)."""
    feed = _feed(s, past, seqlens, total, d=8)
    _check(_model(feed, kv_num_heads=2, local_window_size=2), feed)


def test_local_window_leaves_padding_rows_empty() -> None:
    """Row 1 holds one token; its padding rows 3 and 4 see no key in their window: zeros."""
    feed = _feed(5, None, [4, 0], 5, d=8)
    _check(_model(feed, kv_num_heads=2, local_window_size=3), feed)


@pytest.mark.parametrize(
    "attrs",
    [
        {"softcap": 0.5, "scale": 0.7},
        {"smooth_softmax": 1, "local_window_size": 3},
        {"causal": 0},
    ],
)
def test_softcap_scale_smooth_softmax_bidirectional(attrs: dict[str, object]) -> None:
    s, past, seqlens, total = CASES["decode_growing"]
    feed = _feed(s, past, seqlens, total, d=8)
    _check(_model(feed, kv_num_heads=2, **attrs), feed)


def test_head_sink_attention_bias_and_softcap() -> None:
    s, past, seqlens, total = CASES["decode_shared"]
    feed = _feed(s, past, seqlens, total, d=8)
    feed["bias"] = rand(RNG, B, H, s, total)
    feed["sink"] = rand(RNG, H)
    _check(_model(feed, kv_num_heads=2, softcap=0.8), feed)


def test_attention_bias_in_a_prompt() -> None:
    s, past, seqlens, total = CASES["prompt"]
    feed = _feed(s, past, seqlens, total, d=8)
    feed["bias"] = rand(RNG, 1, 1, s, total)
    _check(_model(feed, kv_num_heads=2), feed)


@pytest.mark.parametrize(
    "s, past, seqlens, total, pos",
    [
        (1, 4, [0, 3], 4, [[5], [7]]),  # a decode step: each row's own position
        (1, 4, [0, 0], 1, [[5], [7]]),  # a first prompt (T == S): only position_ids[0, 0]
        (3, None, [2, 2], 3, [[1, 2, 3], [4, 5, 6]]),
    ],
)
def test_position_ids(
    s: int, past: int | None, seqlens: list[int], total: int, pos: list[list[int]]
) -> None:
    feed = _feed(s, past, seqlens, total)
    _rotary(feed, 8)
    feed["pos"] = np.array(pos, np.int64)
    _check(_model(feed, kv_num_heads=2, do_rotary=1), feed)


def test_query_seqlens_right_padded_chunks() -> None:
    """Row 0 adds 2 tokens after 3, row 1 one token after 2 (its second query row is padding,
    not written to the cache and unspecified in the output)."""
    feed = _feed(2, 4, [4, 2], 6)
    _rotary(feed, 8)
    feed["qlens"] = np.array([2, 1], np.int32)
    valid = np.array([[True, True], [True, False]])
    _check(_model(feed, kv_num_heads=2, do_rotary=1), feed, valid)


def test_total_length_from_the_attention_mask_stays_symbolic() -> None:
    """onnxruntime-genai's wiring: seqlens_k = ReduceSum(mask) - 1 and total_sequence_length =
    Shape(mask)[1]; the graph loads once, with symbolic sequence, past and total lengths."""
    nodes = [
        helper.make_node("ReduceSum", ["mask", "axes"], ["n"], keepdims=0),
        helper.make_node("Sub", ["n", "one"], ["n1"]),
        helper.make_node("Cast", ["n1"], ["seqlens"], to=onnx.TensorProto.INT32),
        helper.make_node("Shape", ["mask"], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", "one"], ["t64"], axis=0),
        helper.make_node("Cast", ["t64"], ["total"], to=onnx.TensorProto.INT32),
        helper.make_node(
            "GroupQueryAttention",
            ["q", "k", "v", "past_k", "past_v", "seqlens", "total"],
            ["y", "present_k", "present_v"],
            domain=MS,
            num_heads=H,
            kv_num_heads=2,
        ),
    ]
    dims = {"q": ["b", "s", 32], "k": ["b", "s", 16], "v": ["b", "s", 16]}
    dims |= {"past_k": ["b", 2, "p", 8], "past_v": ["b", 2, "p", 8], "mask": ["b", "t"]}
    feeds = []
    for past, lengths in ((4, [5, 3]), (6, [7, 2])):
        feed = _feed(1, past, [0, 0], 0, d=8)
        feed["mask"] = (np.arange(past + 1) < np.array(lengths)[:, None]).astype(np.int64)
        feeds.append({n: a for n, a in feed.items() if n not in ("seqlens", "total")})
    one = {"one": np.array(1, np.int64), "axes": np.array([1], np.int64)}
    m = model(nodes, feeds[0], ["y", "present_k", "present_v"], inits=one, dims=dims, opset=17)
    m.opset_import.append(helper.make_opsetid(MS, 1))
    loaded = load_onnx(m)
    assert isinstance(loaded, Graph)
    prepared = Device.cpu().prepare(loaded)
    for feed in feeds:
        want = reference(m, feed)
        assert_close(evaluate(loaded, feed), want, 1e-4, 1e-5)
        assert_close(prepared.eval(feed), want, 1e-4, 1e-5)


def test_total_length_as_a_graph_input_specializes_on_its_value() -> None:
    """With a past, the present's length is max(total_sequence_length, P): a value."""
    feed = _feed(*CASES["decode_shared"][:3], CASES["decode_shared"][3])
    loaded = load_onnx(_model(feed, kv_num_heads=2))
    assert isinstance(loaded, ValueSpecializedModel) and loaded.value_inputs == ["total"]


@pytest.mark.parametrize(
    "attrs, extra, message",
    [
        ({"kv_num_heads": 3}, {}, "num_heads 4 must be a positive multiple of kv_num_heads 3"),
        ({"kv_num_heads": 2, "sliding_window_cache": 1}, {}, "sliding_window_cache=1"),
        ({"kv_num_heads": 2}, {"k_scale": np.ones(1, np.float32)}, "input 12, k_scale"),
        ({"kv_num_heads": 2, "k_quant_type": "PER_TENSOR"}, {}, "quantized KV cache"),
    ],
)
def test_refusals_name_the_node(
    attrs: dict[str, object], extra: dict[str, np.ndarray], message: str
) -> None:
    feed = _feed(*CASES["prompt"][:3], CASES["prompt"][3]) | extra
    with pytest.raises(UnsupportedOnnxError, match=f"node 'bad_gqa'.*{message}"):
        load_onnx(_model(feed, name="bad_gqa", **attrs))
