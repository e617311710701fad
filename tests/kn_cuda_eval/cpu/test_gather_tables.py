"""Large gather tables (an LLM's embedding) are read where the constant lies, not copied into
the CPU backend's arena: from a model file's external data, only the rows gathered become
resident, as with onnxruntime's memory-mapped initializers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kn_cuda_eval.cpu.executor import HostExecutor
from kn_cuda_eval.cpu.passes.gather import TABLE_BYTES
from kn_cuda_eval.planning import steps as st
from kn_graph.errors import EvaluationError
from kn_graph.onnx import load_onnx
from kn_graph.reference import evaluate
from kn_runtime import Device


def _model(path: Path, vocab: int, dim: int, tied: bool = False) -> None:
    """Gather(table, ids) @ small, saved with the table as external data; `tied`: table · ids[0]
    too (a reader that is not a gather, and that the optimizer cannot fold: the table stays in
    the arena)."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((vocab, dim)).astype(np.float32)
    small = rng.standard_normal((dim, 4)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"]),
        helper.make_node("MatMul", ["rows", "small"], ["y"]),
    ]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])]
    if tied:
        nodes += [
            helper.make_node("Cast", ["ids"], ["idsf"], to=TensorProto.FLOAT),
            helper.make_node("Gather", ["idsf", "zero"], ["first"]),
            helper.make_node("Mul", ["table", "first"], ["all"]),
        ]
        outs.append(helper.make_tensor_value_info("all", TensorProto.FLOAT, [vocab, dim]))
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["n"])],
        outs,
        [
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(small, "small"),
            numpy_helper.from_array(np.array(0, np.int64), "zero"),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(m, path, save_as_external_data=True, location="w.bin", size_threshold=1024)


def test_a_large_table_is_gathered_where_it_lies(tmp_path: Path) -> None:
    vocab, dim = 4096, 128  # 2 MB
    assert vocab * dim * 4 >= TABLE_BYTES
    _model(tmp_path / "m.onnx", vocab, dim)
    g = load_onnx(tmp_path / "m.onnx")
    ids = np.array([0, 7, 4095, 7, -1 + vocab], np.int64)
    want = evaluate(g, {"ids": ids})
    prepared = Device.cpu().prepare(g)
    got = prepared.eval({"ids": ids})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    ex = prepared.executor({"n": len(ids)})
    assert isinstance(ex, HostExecutor)
    (gather,) = [s for s in ex.steps if isinstance(s, st.Gather)]
    assert not 0 <= gather.x.offset < ex.arena.nbytes  # read outside the arena
    (table_off,) = [o for o, d in ex.plan.constants if d.nbytes == vocab * dim * 4]
    assert not ex.arena[table_off : table_off + vocab * dim * 4].any()  # never copied in
    with pytest.raises(EvaluationError, match="out of range"):
        prepared.eval({"ids": np.array([vocab], np.int64)})


@pytest.mark.parametrize(("vocab", "tied"), [(64, False), (4096, True)])
def test_small_or_shared_tables_stay_in_the_arena(tmp_path: Path, vocab: int, tied: bool) -> None:
    _model(tmp_path / "m.onnx", vocab, 128, tied)
    g = load_onnx(tmp_path / "m.onnx")
    ids = np.array([1, 2, 63], np.int64)
    prepared = Device.cpu().prepare(g)
    for got, want in zip(prepared.eval({"ids": ids}), evaluate(g, {"ids": ids}), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    ex = prepared.executor({"n": 3})
    (gather,) = [s for s in ex.steps if isinstance(s, st.Gather) and s.x.shape == (vocab, 128)]
    assert 0 <= gather.x.offset < ex.arena.nbytes
