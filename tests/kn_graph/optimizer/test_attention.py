"""The Attention op (builder, CPU reference, decomposition) and the detect_attention rewrite: golden
printouts, numerical equality with the unoptimized graph, the exporter variants, and the real
transformer fixtures (every attention block becomes one op)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import numpy as np
import onnx
import pytest

from kn_graph import DType, Graph, GraphError, Shape, Size, Value
from kn_graph.attention import decompose_attention
from kn_graph.ops import Attention, BinaryOp, Input
from kn_graph.optimizer import optimize
from kn_graph.optimizer.attention import decompose_attention_ops
from kn_graph.reference import evaluate
from tests.kn_graph.optimizer.util import assert_same, only, op_counts
from tests.paths import MODELS

B = Size.sym("B")
S = Size.sym("seq")


# -- the op: an independent NumPy formula ---------------------------------------------------------
def reference(q, k, v, mask=None, scale=None, causal=False) -> np.ndarray:
    """softmax(q·kᵀ·scale + mask + causal)·v in float64, written out plainly."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("bmd,bnd->bmn", q, k) * scale
    if mask is not None:
        s = s + mask.astype(np.float64)
    if causal:
        m, n = s.shape[1:]
        for i in range(m):
            s[:, i, i + (n - m) + 1 :] = -np.inf
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bmn,bne->bme", p, v)


def qkv_graph(m, n, dtype=DType.F32, masked=False, d=4, dv=6, b=2):
    g = Graph()
    q = g.input(Shape.of(b, m, d), dtype, "q")
    k = g.input(Shape.of(b, n, d), dtype, "k")
    v = g.input(Shape.of(b, n, dv), dtype, "v")
    mask = g.input(Shape.of(b, m, n), dtype, "mask") if masked else None
    return g, q, k, v, mask


def feed(rng, shapes, dtype=np.float32):
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


@pytest.mark.parametrize("dtype", [DType.F32, DType.F64, DType.F16])
@pytest.mark.parametrize(
    ("masked", "causal"), [(False, False), (True, False), (False, True), (True, True)]
)
@pytest.mark.parametrize(("m", "n"), [(3, 3), (2, 5)])
def test_cpu_attention_matches_numpy_formula(dtype, masked, causal, m, n):
    rng = np.random.default_rng(1)
    g, q, k, v, mask = qkv_graph(m, n, dtype, masked)
    g.add_output(g.attention(q, k, v, mask, scale=0.7, causal=causal))
    arrays = feed(
        rng, [(2, m, 4), (2, n, 4), (2, n, 6)] + ([(2, m, n)] if masked else []), dtype.np
    )
    (out,) = evaluate(g, arrays)
    assert out.dtype == dtype.np
    want = reference(*arrays[:3], arrays[3] if masked else None, 0.7, causal)
    tol = 2e-3 if dtype is DType.F16 else 1e-5
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol)


def test_cpu_attention_is_stable_for_large_scores():
    g, q, k, v, _ = qkv_graph(2, 3)
    g.add_output(g.attention(q, k, v, scale=1.0))
    arrays = [
        np.full((2, 2, 4), 300, np.float32),
        np.full((2, 3, 4), 300, np.float32),
        np.ones((2, 3, 6), np.float32),
    ]
    (out,) = evaluate(g, arrays)
    np.testing.assert_allclose(out, 1.0)


def test_attention_default_scale_and_printing():
    g, q, k, v, _ = qkv_graph(3, 3, d=16)
    a = g.attention(q, k, v, causal=True)
    assert g[a].op == Attention(q, k, v, None, 0.25, True)
    assert g.format_value(a) == "%3: f32[2,3,6] = attention(%0, %1, %2) scale=0.25 causal"


def test_attention_optional_mask_in_inputs_and_map_inputs():
    _g, q, k, v, mask = qkv_graph(3, 3, masked=True)
    op = Attention(q, k, v, None, 1.0, False)
    assert op.inputs == (q, k, v)
    assert op.map_inputs(lambda x: x).mask is None
    assert Attention(q, k, v, mask, 1.0, False).inputs == (q, k, v, mask)


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        (((2, 3, 4), (2, 5, 4), (2, 5)), r"v \[2,5\]"),
        (((2, 3, 4), (2, 5, 3), (2, 5, 6)), r"k \[2,5,3\]"),
        (((2, 3, 4), (1, 5, 4), (1, 5, 6)), r"q \[2,3,4\]"),
        (((2, 3, 4), (2, 5, 4), (2, 4, 6)), r"v \[2,4,6\]"),
    ],
)
def test_attention_builder_rejects_bad_shapes(shapes, match):
    g = Graph()
    q, k, v = (g.input(Shape.from_seq(s), DType.F32, n) for s, n in zip(shapes, "qkv", strict=True))
    with pytest.raises(GraphError, match=match):
        g.attention(q, k, v)


def test_attention_builder_rejects_bad_mask_dtype_and_causal():
    g, q, k, v, _ = qkv_graph(3, 5)
    with pytest.raises(GraphError, match=r"mask must be f32\[2,3,5\]"):
        g.attention(q, k, v, g.input(Shape.of(2, 1, 5), DType.F32, "m"))
    with pytest.raises(GraphError, match="float"):
        gi = Graph()
        x = gi.input(Shape.of(1, 2, 2), DType.I32, "x")
        gi.attention(x, x, x, scale=1.0)
    g2, q2, k2, v2, _ = qkv_graph(5, 3)
    with pytest.raises(GraphError, match="fewer keys than queries"):
        g2.attention(q2, k2, v2, causal=True)
    g3 = Graph()
    x = g3.input(Shape.of(2, 3, S), DType.F32, "x")
    with pytest.raises(GraphError, match="fixed head size"):
        g3.attention(x, x, x)


# -- decomposition -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("masked", "causal"), [(False, False), (True, False), (False, True), (True, True)]
)
@pytest.mark.parametrize(
    ("m", "n", "bind"), [(3, 5, {}), (S, S, {"seq": 4}), (S, Size.sym("t"), {"seq": 2, "t": 6})]
)
def test_decomposition_equals_the_op(masked, causal, m, n, bind):
    g, q, k, v, mask = qkv_graph(m, n, masked=masked)
    g.add_output(g.attention(q, k, v, mask, 0.3, causal), "op")
    g.add_output(decompose_attention(g, q, k, v, mask, 0.3, causal), "decomposed")
    arrays = [
        np.random.default_rng(2).standard_normal(g[x].shape.eval(bind)).astype(np.float32)
        for x in g.inputs
    ]
    op, dec = evaluate(g, arrays)
    assert not any(
        isinstance(g[x].op, Attention) for x in g.values() if x.index > g.outputs[0].index
    )
    np.testing.assert_allclose(op, dec, rtol=1e-6, atol=1e-6)


def test_decompose_attention_ops_pass_removes_every_attention():
    g, q, k, v, mask = qkv_graph(S, S, masked=True)
    a = g.attention(q, k, v, mask, 0.5, True)
    g.add_output(g.exp(a), "y")
    lowered = decompose_attention_ops(g)
    assert op_counts(lowered)["attention"] == 0
    assert op_counts(lowered)["softmax"] == 1
    assert lowered.input_names == g.input_names and lowered.output_names == ["y"]
    assert_same(g, lowered, {"seq": 5})
    # and the optimizer fuses it back
    again = optimize(lowered, only("detect_attention"))
    assert op_counts(again)["attention"] == 1
    assert_same(g, again, {"seq": 5})


# -- detection on hand-built blocks ---------------------------------------------------------------------
def heads_block(
    g: Graph,
    x: Value,
    heads: int = 2,
    scale_on: str = "scores",
    mask: Value | None = None,
    scale: float = 0.5,
) -> Value:
    """A multi-head self-attention block as exporters write it: projections, Reshape +
    Transpose to [B, h, s, d], Kᵀ by Transpose, rank-4 MatMuls (matmul_nd views them to rank 3)."""
    hidden = g[x].shape[-1].as_int()
    d = hidden // heads
    rng = np.random.default_rng(3)

    def proj() -> Value:
        w = g.constant(rng.standard_normal((hidden, hidden)).astype(np.float32) / 4)
        y = g.view(g.matmul_nd(x, w), Shape.of(B, S, heads, d))
        return g.permute(y, (0, 2, 1, 3))

    q, k, v = proj(), proj(), proj()
    kt = g.transpose(k)
    match scale_on:
        case "q":
            q = g.mul(q, scale)
        case "k":
            kt = g.mul(kt, scale)
        case "k_early":  # K scaled before its transpose
            kt = g.transpose(g.mul(k, scale))
        case "both":
            q, kt = g.mul(q, math.sqrt(scale)), g.mul(g.permute(k, (0, 1, 3, 2)), math.sqrt(scale))
        case "div":
            pass
    s = g.matmul_nd(q, kt)
    if scale_on == "scores":
        s = g.mul(s, scale)
    elif scale_on == "div":
        s = g.div(s, 1 / scale)
    if mask is not None:
        s = g.add(s, mask)
    p = g.softmax(s, -1)
    o = g.permute(g.matmul_nd(p, v), (0, 2, 1, 3))
    return g.view(o, Shape.of(B, S, hidden))


def block_graph(**kw) -> Graph:
    g = Graph()
    x = g.input(Shape.of(B, S, 4), DType.F32, "x")
    g.add_output(heads_block(g, x, **kw), "y")
    return g


GOLDEN = """\
%0: f32[B,seq,4] = input #0 "x"
%1: f32[4,4] = const <16 values>
%2: f32[1,B*seq,4] = view(%0)
%3: f32[1,4,4] = view(%1)
%4: f32[1,B*seq,4] = matmul(%2, %3)
%5: f32[B,seq,2,2] = view(%4)
%6: f32[B,2,seq,2] = permute(%5) perm=[0, 2, 1, 3]
%7: f32[4,4] = const <16 values>
%8: f32[1,4,4] = view(%7)
%9: f32[1,B*seq,4] = matmul(%2, %8)
%10: f32[B,seq,2,2] = view(%9)
%11: f32[4,4] = const <16 values>
%12: f32[1,4,4] = view(%11)
%13: f32[1,B*seq,4] = matmul(%2, %12)
%14: f32[B,seq,2,2] = view(%13)
%15: f32[B,2,seq,2] = permute(%14) perm=[0, 2, 1, 3]
%16: f32[2*B,seq,2] = view(%6)
%17: f32[2*B,seq,2] = view(%15)
%18: f32[B,2,seq,2] = permute(%10) perm=[0, 2, 1, 3]
%19: f32[2*B,seq,2] = view(%18)
%20: f32[2*B,seq,2] = attention(%16, %19, %17) scale=0.5
%21: f32[B,2,seq,2] = view(%20)
%22: f32[B,seq,2,2] = permute(%21) perm=[0, 2, 1, 3]
%23: f32[B,seq,4] = view(%22)
outputs: %23 "y"
"""


def test_golden_multi_head_block():
    g = block_graph()
    opt = optimize(g, only("detect_attention"))
    assert str(opt) + "\n" == GOLDEN
    assert_same(g, opt, {"B": 2, "seq": 5})


@pytest.mark.parametrize("scale_on", ["scores", "q", "k", "k_early", "both", "div"])
def test_scale_anywhere_is_absorbed(scale_on):
    g = block_graph(scale_on=scale_on, scale=0.3)
    opt = optimize(g, only("detect_attention"))
    (att,) = [opt[v].op for v in opt.values() if isinstance(opt[v].op, Attention)]
    assert att.scale == pytest.approx(0.3, rel=1e-6)
    counts = op_counts(opt)
    assert counts["mul"] == counts["div"] == counts["softmax"] == 0, counts
    assert_same(g, opt, {"B": 2, "seq": 5})


def fsel(g: Graph, cond: Value, a: float, b: float) -> Value:
    """Select between two f32 scalars."""
    return g.select(cond, g.scalar(a, DType.F32), g.scalar(b, DType.F32))


def padding_mask(g: Graph, heads: int = 2) -> Value:
    """HF style: Where(mask_ids != 0, 0, finfo.min) on [B, 1, 1, seq], broadcast over heads."""
    ids = g.input(Shape.of(B, S), DType.I64, "attention_mask")
    keep = g.binary(BinaryOp.EQ, g.view(ids, Shape.of(B, 1, 1, S)), 1)
    add = fsel(g, keep, 0.0, float(np.finfo(np.float32).min))
    return g.broadcast(add, Shape.of(B, heads, S, S))


def causal_mask(g: Graph, style: str) -> Value:
    """0 where key <= query, a huge negative value above the diagonal, built from Iota."""
    shape = Shape.of(S, S)
    row, col = g.iota(shape, 0), g.iota(shape, 1)
    match style:
        case "le":
            allowed = g.binary(BinaryOp.LE, col, row)
            m = fsel(g, allowed, 0.0, -math.inf)
        case "gt_flipped":  # masked where col > row, operands swapped
            masked = g.binary(BinaryOp.LT, row, col)
            m = fsel(g, masked, float(np.finfo(np.float32).min), 0.0)
        case "ge_plus_one":  # row + 1 > col  ⇔  col <= row
            allowed = g.binary(BinaryOp.GT, g.add(row, 1), col)
            m = fsel(g, allowed, 0.0, float(np.finfo(np.float32).min))
        case _:
            raise AssertionError(style)
    return g.broadcast(g.view(m, Shape.of(1, 1, S, S)), Shape.of(B, 2, S, S))


@pytest.mark.parametrize("style", ["le", "gt_flipped", "ge_plus_one"])
def test_iota_causal_mask_becomes_the_causal_flag(style):
    g = Graph()
    x = g.input(Shape.of(B, S, 4), DType.F32, "x")
    g.add_output(heads_block(g, x, mask=causal_mask(g, style)), "y")
    opt = optimize(g, only("detect_attention"))
    (att,) = [opt[v].op for v in opt.values() if isinstance(opt[v].op, Attention)]
    assert att.causal and att.mask is None
    assert op_counts(opt)["iota"] == 0  # the mask is gone with it
    assert_same(g, opt, {"B": 2, "seq": 5})


def test_constant_causal_mask_with_offset_becomes_the_causal_flag():
    # 2 queries against 5 keys: key j visible to query i when j <= i + 3
    g = Graph()
    q = g.input(Shape.of(B, 2, 4), DType.F32, "q")
    k = g.input(Shape.of(B, 5, 4), DType.F32, "k")
    v = g.input(Shape.of(B, 5, 3), DType.F32, "v")
    tri = np.triu(np.full((2, 5), np.finfo(np.float32).min, np.float32), k=4)
    s = g.add(g.mul(g.matmul(q, g.transpose(k)), 0.5), g.constant(tri[None]))
    g.add_output(g.matmul(g.softmax(s, 2), v), "y")
    opt = optimize(g, only("detect_attention"))
    assert [str(opt[v].op.attrs()) for v in opt.values() if isinstance(opt[v].op, Attention)] == [
        "scale=0.5 causal"
    ]
    assert_same(g, opt, {"B": 3})


def test_non_causal_iota_mask_stays_a_mask():
    # anti-causal (keys at or after the query): must not be mistaken for the causal flag
    g = Graph()
    x = g.input(Shape.of(B, S, 4), DType.F32, "x")
    shape = Shape.of(S, S)
    allowed = g.binary(BinaryOp.GE, g.iota(shape, 1), g.iota(shape, 0))
    m = g.broadcast(
        g.view(fsel(g, allowed, 0.0, -1e30), Shape.of(1, 1, S, S)), Shape.of(B, 2, S, S)
    )
    g.add_output(heads_block(g, x, mask=m), "y")
    opt = optimize(g, only("detect_attention"))
    (att,) = [opt[v].op for v in opt.values() if isinstance(opt[v].op, Attention)]
    assert not att.causal and att.mask is not None
    assert_same(g, opt, {"B": 2, "seq": 5})


def test_padding_mask_is_kept_as_the_mask_operand():
    g = Graph()
    x = g.input(Shape.of(B, S, 4), DType.F32, "x")
    g.add_output(heads_block(g, x, mask=padding_mask(g)), "y")
    opt = optimize(g, only("detect_attention"))
    (att,) = [opt[v].op for v in opt.values() if isinstance(opt[v].op, Attention)]
    assert not att.causal and att.mask is not None
    assert opt[att.mask].shape == Shape.of(2 * B, S, S)
    rng = np.random.default_rng(4)
    ids = np.ones((2, 5), np.int64)
    ids[0, 3:] = 0
    assert_same(g, opt, inputs=[rng.standard_normal((2, 5, 4)).astype(np.float32), ids])


def test_padding_and_causal_masks_together_stay_one_summed_mask():
    g = Graph()
    x = g.input(Shape.of(B, S, 4), DType.F32, "x")
    pad, causal = padding_mask(g), causal_mask(g, "gt_flipped")
    g.add_output(heads_block(g, x, mask=g.add(pad, causal)), "y")
    opt = optimize(g, only("detect_attention"))
    (att,) = [opt[v].op for v in opt.values() if isinstance(opt[v].op, Attention)]
    assert not att.causal and att.mask is not None
    ids = np.ones((2, 5), np.int64)
    ids[1, :2] = 0  # left padding: query 0 of sample 1 sees no key at all
    assert_same(
        g, opt, inputs=[np.random.default_rng(5).standard_normal((2, 5, 4)).astype(np.float32), ids]
    )


def test_scale_after_the_mask_scales_the_mask_too():
    g, q, k, v, mask = qkv_graph(3, 4, masked=True)
    s = g.mul(g.add(g.matmul(q, g.transpose(k)), mask), 0.25)
    g.add_output(g.matmul(g.softmax(s, -1), v), "y")
    opt = optimize(g, only("detect_attention"))
    assert op_counts(opt)["attention"] == 1 and op_counts(opt)["mul"] == 1
    assert_same(g, opt)


def test_two_masks_added_one_after_the_other():
    g, q, k, v, mask = qkv_graph(3, 4, masked=True)
    bias = g.input(Shape.of(2, 3, 4), DType.F32, "bias")
    s = g.add(g.add(g.mul(g.matmul(q, g.transpose(k)), 0.5), mask), bias)
    g.add_output(g.matmul(g.softmax(s, -1), v), "y")
    opt = optimize(g, only("detect_attention"))
    assert op_counts(opt)["attention"] == 1 and op_counts(opt)["softmax"] == 0
    assert_same(g, opt)


ANOTHER_USER: dict[str, Callable[[Graph, dict[str, Value]], Value]] = {
    "scores": lambda g, n: n["scores"],
    "scaled": lambda g, n: n["scaled"],
    "probs": lambda g, n: n["probs"],
    "kt": lambda g, n: n["kt"],
}


@pytest.mark.parametrize("leak", sorted(ANOTHER_USER))
def test_does_not_fire_when_an_intermediate_has_another_user(leak):
    g, q, k, v, _ = qkv_graph(3, 4)
    kt = g.transpose(k)
    scores = g.matmul(q, kt)
    scaled = g.mul(scores, 0.5)
    probs = g.softmax(scaled, 2)
    g.add_output(g.matmul(probs, v), "y")
    g.add_output(
        g.exp(
            ANOTHER_USER[leak](g, {"scores": scores, "scaled": scaled, "probs": probs, "kt": kt})
        ),
        "leak",
    )
    opt = optimize(g, only("detect_attention"))
    if leak == "kt":  # Kᵀ is an operand, not a hidden intermediate: fusing is still fine
        assert op_counts(opt)["attention"] == 1
    else:
        assert op_counts(opt)["attention"] == 0
    assert_same(g, opt)


def test_does_not_fire_on_softmax_over_another_axis():
    g, q, k, v, _ = qkv_graph(3, 3)
    p = g.softmax(g.matmul(q, g.transpose(k)), 1)
    g.add_output(g.matmul(p, v), "y")
    assert op_counts(optimize(g, only("detect_attention")))["attention"] == 0


def test_disabled_by_its_flag():
    g = block_graph()
    assert op_counts(optimize(g, only()))["attention"] == 0


def test_full_optimizer_on_a_block_keeps_numerics():
    g = Graph()
    x = g.input(Shape.of(B, S, 4), DType.F32, "x")
    g.add_output(heads_block(g, x, mask=g.add(padding_mask(g), causal_mask(g, "le"))), "y")
    opt = optimize(g)
    assert op_counts(opt)["attention"] == 1
    ids = np.ones((3, 6), np.int64)
    ids[2, 4:] = 0
    assert_same(
        g, opt, inputs=[np.random.default_rng(6).standard_normal((3, 6, 4)).astype(np.float32), ids]
    )


# -- the real exports ---------------------------------------------------------------------------------
TRANSFORMERS = [
    f["name"]
    for f in json.loads((MODELS / "manifest.json").read_text())["fixtures"]
    if f["name"].split("_ts")[0].split("_dynamo")[0] in ("bert", "gpt2", "llama", "clip_text")
]
CAUSAL_ONLY = {"clip_text_ts", "clip_text_dynamo"}  # no padding input: the mask is purely causal


def _bindings(fixture: str) -> list[dict[str, np.ndarray]]:
    data = np.load(MODELS / f"{fixture}.npz")
    sets = sorted({k.split(":")[0][2:] for k in data.files if k.startswith("in")})
    return [
        {k.split(":", 1)[1]: data[k] for k in data.files if k.startswith(f"in{s}:")} for s in sets
    ]


@pytest.mark.parametrize("fixture", TRANSFORMERS)
def test_every_attention_block_of_the_fixture_becomes_one_op(fixture):
    from kn_graph.onnx import load_onnx

    layers = sum(n.op_type == "Softmax" for n in onnx.load(MODELS / f"{fixture}.onnx").graph.node)
    g = load_onnx(MODELS / f"{fixture}.onnx")
    opt = optimize(g)
    atts = [opt[v].op for v in opt.values() if isinstance(opt[v].op, Attention)]
    assert len(atts) == layers == 2
    assert op_counts(opt)["softmax"] == 0
    assert all(a.causal == (fixture in CAUSAL_ONLY) for a in atts)
    assert all(a.scale == 0.25 for a in atts)  # head size 16
    data = np.load(MODELS / f"{fixture}.npz")
    for i, inputs in enumerate(_bindings(fixture)):
        assert_same(g, opt, inputs=[inputs[n] for n in g.input_names], rel=1e-5)
        got = evaluate(opt, inputs)
        for name, out in zip(opt.output_names, got, strict=True):
            np.testing.assert_allclose(out, data[f"out{i}:{name}"], rtol=1e-4, atol=1e-4)


def test_fixture_inputs_are_graph_inputs():
    # guards the helper above: the npz names match the loaded graph's inputs
    from kn_graph.onnx import load_onnx

    g = load_onnx(MODELS / "bert_ts.onnx")
    assert all(isinstance(g[v].op, Input) for v in g.inputs)
    assert set(_bindings("bert_ts")[0]) == set(g.input_names)


@pytest.mark.parametrize("fill", [-math.inf, float(np.finfo(np.float32).min)])
def test_masked_fill_causal_becomes_the_causal_flag(fill):
    # torch.where(causal, scores, fill) as older GPT-2 exports write it
    g = Graph()
    q = g.input(Shape.of(B, S, 4), DType.F32, "q")
    k = g.input(Shape.of(B, S, 4), DType.F32, "k")
    v = g.input(Shape.of(B, S, 4), DType.F32, "v")
    shape = Shape.of(S, S)
    causal = g.binary(BinaryOp.LE, g.iota(shape, 1), g.iota(shape, 0))
    s = g.div(g.matmul(q, g.transpose(k)), 2.0)
    s = g.select(
        g.broadcast(g.view(causal, Shape.of(1, S, S)), Shape.of(B, S, S)),
        s,
        g.scalar(fill, DType.F32),
    )
    g.add_output(g.matmul(g.softmax(s, 2), v), "y")
    opt = optimize(g, only("detect_attention"))
    (att,) = [opt[v].op for v in opt.values() if isinstance(opt[v].op, Attention)]
    assert att.causal and att.mask is None and att.scale == 0.5
    assert_same(g, opt, {"B": 2, "seq": 6})


def test_masked_fill_from_an_input_becomes_an_additive_mask():
    g, q, k, v, _ = qkv_graph(3, 4)
    keep = g.input(Shape.of(2, 3, 4), DType.BOOL, "keep")
    s = g.select(keep, g.scalar(-math.inf, DType.F32), g.mul(g.matmul(q, g.transpose(k)), 0.5))
    g.add_output(g.matmul(g.softmax(s, 2), v), "y")
    opt = optimize(g, only("detect_attention"))
    (att,) = [opt[v].op for v in opt.values() if isinstance(opt[v].op, Attention)]
    assert not att.causal and att.mask is not None
    rng = np.random.default_rng(7)
    keep_arr = rng.random((2, 3, 4)) < 0.4
    keep_arr[..., 0] = False  # every row keeps key 0 (fill on true: True masks)
    assert_same(g, opt, inputs=[*feed(rng, [(2, 3, 4), (2, 4, 4), (2, 4, 6)]), keep_arr])


def test_f16_block_is_detected_and_matches():
    g, q, k, v, mask = qkv_graph(3, 5, DType.F16, masked=True)
    s = g.add(g.mul(g.matmul(q, g.transpose(k)), 0.5), mask)
    g.add_output(g.matmul(g.softmax(s, 2), v), "y")
    opt = optimize(g, only("detect_attention"))
    assert op_counts(opt)["attention"] == 1
    assert_same(g, opt, rel=3e-3)


@pytest.mark.parametrize("fixture", ["sd_unet_tiny", "sd_vae_decoder_tiny"])
def test_diffusion_attention_blocks_are_detected(fixture):
    # self- and cross-attention of the UNet's transformer blocks, the VAE's single-head mid block
    from kn_graph.onnx import load_onnx

    softmaxes = sum(
        n.op_type == "Softmax" for n in onnx.load(MODELS / f"{fixture}.onnx").graph.node
    )
    g = load_onnx(MODELS / f"{fixture}.onnx")
    opt = optimize(g)
    assert op_counts(opt)["attention"] == softmaxes and op_counts(opt)["softmax"] == 0
    inputs = _bindings(fixture)[1]
    assert_same(g, opt, inputs=[inputs[n] for n in g.input_names], rel=1e-5)
