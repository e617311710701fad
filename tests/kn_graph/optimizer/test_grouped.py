"""`group_shared_matmul` (kn_graph/optimizer/grouped.py): grouped-query attention's repeated keys
and values are never materialized — the products take a group's query heads as rows against
one KV head — with the results of the unrewritten graph, on hand-built graphs (each chain the
exporters write) and on the Qwen2 fixture, whose decode plan then copies no repeated cache."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kn_cuda_eval import plan
from kn_cuda_eval.planning import steps as st
from kn_graph import DType, Graph, Shape
from kn_graph.onnx import load_onnx
from kn_graph.ops import Broadcast, MatMul
from kn_graph.optimizer import OptimizerSettings, optimize
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.paths import MODELS

B, G, R, S, L, D = 2, 2, 3, 4, 7, 5
H = G * R


def _attention(scale_keys: bool) -> Graph:
    """softmax(q·kᵀ)·v with k and v [B, G, L, D] repeated to H heads the way Optimum exports
    it; the keys permuted and scaled before the product when `scale_keys` (SDPA's export)."""
    g = Graph()
    q = g.input(Shape.of(B, H, S, D), DType.F64, "q")
    kv = [g.input(Shape.of(B, G, L, D), DType.F64, n) for n in ("k", "v")]

    def repeat(x):  # [B, G, L, D] -> [B, H, L, D]
        x = g.broadcast(g.view(x, Shape.of(B, G, 1, L, D)), Shape.of(B, G, R, L, D))
        return g.view(x, Shape.of(B, H, L, D))

    k, v = (repeat(x) for x in kv)
    kt = g.permute(k, [0, 1, 3, 2])
    if scale_keys:
        kt = g.mul(kt, 0.25)
    scores = g.matmul(g.view(q, Shape.of(B * H, S, D)), g.view(kt, Shape.of(B * H, D, L)))
    p = g.softmax(scores, 2)
    out = g.matmul(p, g.view(v, Shape.of(B * H, L, D)))
    g.add_output(g.view(out, Shape.of(B, H, S, D)), "out")
    return g


def _repeated_operands(g: Graph) -> int:
    """Products whose right operand is (a view of) a broadcast."""
    count = 0
    for v in g.values():
        op = g[v].op
        if isinstance(op, MatMul):
            b = op.b
            while not isinstance(g[b].op, Broadcast) and g[b].op.inputs:
                b = g[b].op.inputs[0]
            count += isinstance(g[b].op, Broadcast)
    return count


@pytest.mark.parametrize("scale_keys", [False, True])
def test_products_take_a_groups_heads_as_rows(scale_keys: bool) -> None:
    g = _attention(scale_keys)
    rng = np.random.default_rng(1)
    feed = [rng.standard_normal((B, H, S, D)), *(rng.standard_normal((B, G, L, D)) for _ in "kv")]
    # (no attention detection: a mask the exporters add keeps theirs apart, as the fixture's)
    plain = optimize(g, OptimizerSettings(group_shared_matmul=False, detect_attention=False))
    grouped = optimize(g, OptimizerSettings(detect_attention=False))
    assert _repeated_operands(plain) == 2 and _repeated_operands(grouped) == 0
    shapes = [
        grouped[grouped[v].op.a].shape
        for v in grouped.values()
        if isinstance(grouped[v].op, MatMul)
    ]
    assert shapes == [Shape.of(B * G, R * S, D), Shape.of(B * G, R * S, L)], shapes
    np.testing.assert_allclose(evaluate(grouped, feed)[0], evaluate(plain, feed)[0], rtol=1e-12)


def test_the_cpu_backend_runs_the_grouped_products_nan_and_all() -> None:
    """Device.cpu() on the graph optimized with its settings (attention detection off, which
    would fuse this mask-free pattern into one op) against the reference of the graph as built:
    equal to rounding, and a NaN key of group 0 poisons exactly the rows of that group's R query
    heads, not the other group's."""
    g = _attention(scale_keys=True)
    settings = dataclasses.replace(Device.cpu().optimizer_settings(), detect_attention=False)
    grouped = optimize(g, settings)
    assert _repeated_operands(grouped) == 0
    rng = np.random.default_rng(2)
    feed = [rng.standard_normal((B, H, S, D)), *(rng.standard_normal((B, G, L, D)) for _ in "kv")]
    feed[1][0, 0, 3, 1] = np.nan  # batch 0, KV head 0
    want = evaluate(g, feed)[0]
    got = Device.cpu(threads=2).prepare(grouped).eval(feed)[0]
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert (
        np.isnan(got[0, :R]).all() and not np.isnan(got[0, R:]).any() and not np.isnan(got[1]).any()
    )
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)


def test_the_qwen2_fixtures_decode_plan_copies_no_repeated_cache() -> None:
    """Qwen2 fixture (4 query heads over 2 KV heads): optimized, its products read the cache as
    it is; planned at past 32, no step copies a zero-stride (repeated) view, which the plan
    without the rewrite does twice a layer."""
    g = load_onnx(MODELS / "llm" / "qwen2_optimum" / "model.onnx")
    bindings = {"B": 1, "sequence_length": 1, "past_sequence_length": 32}

    def repeated_copies(settings: OptimizerSettings) -> int:
        p = plan(optimize(g, settings), bindings=bindings)
        return sum(
            isinstance(s, st.Copy) and 0 in s.src.strides and s.src.numel > 1000 for s in p.steps
        )

    assert repeated_copies(OptimizerSettings(group_shared_matmul=False)) >= 2
    assert repeated_copies(OptimizerSettings()) == 0
