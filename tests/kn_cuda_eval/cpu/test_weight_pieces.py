"""Large constant weights packed and run in column pieces (`onednn.gemm.PIECE_BYTES`): the
same products as one primitive, with each piece packed from its own columns (a mapped file's
pages given back between pieces), and the packed pieces found again by a second binding."""

from __future__ import annotations

import numpy as np
import pytest

from kn_cuda_eval.cpu import onednn
from kn_cuda_eval.cpu.onednn import gemm
from kn_graph import DType, Graph, Shape, Size
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_cuda_eval.cpu.onednn_probe import implements


@pytest.mark.parametrize("transposed", [False, True])
def test_pieces_equal_the_reference(monkeypatch: pytest.MonkeyPatch, transposed: bool) -> None:
    monkeypatch.setattr(gemm, "PIECE_BYTES", 4096)  # a [48, 200] f32 weight: 10 pieces
    rng = np.random.default_rng(3)
    w = rng.standard_normal((48, 200)).astype(np.float32)
    g = Graph()
    x = g.input(Shape.of(1, Size.sym("S"), 48), DType.F32, "x")
    wc = g.constant(np.ascontiguousarray(w.T)) if transposed else g.constant(w)
    b = (
        g.view(g.permute(wc, [1, 0]), Shape.of(1, 48, 200))
        if transposed
        else g.view(wc, Shape.of(1, 48, 200))
    )
    g.add_output(g.matmul(x, b), "y")
    prepared = Device.cpu().prepare(g)
    for s in (1, 5, 37):  # bindings after the first find their pieces packed
        feed = {"x": rng.standard_normal((1, s, 48)).astype(np.float32)}
        (want,) = evaluate(g, feed)
        (got,) = prepared.eval(feed)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if implements("gemm", DType.F32):  # oneDNN here, and its f32 matmul
        ex = prepared.executor({"S": 5})
        runners = [r for r in ex._host if isinstance(r, onednn.Runner)]
        assert runners and max(r.primitives for r in runners) > 1
