"""Loader behaviour that is not one op: symbolic dims, shape tensors, external data, long chains."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from kn_graph.onnx import load_onnx
from kn_graph.ops import View
from kn_graph.reference import evaluate
from kn_graph.shape import Shape, Size


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_batch_axes_unify_into_b_and_other_dims_stay_named() -> None:
    m = _model(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch_size", "seq"]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["N", "seq"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    g = load_onnx(m)
    B, S = Size.sym("B"), Size.sym("seq")
    assert [g[v].shape for v in g.inputs] == [Shape.of(B, S), Shape.of(B, S)]
    pinned = load_onnx(m, dims={"seq": 7})
    assert pinned[pinned.inputs[0]].shape == Shape.of(B, 7)
    given = load_onnx(m, input_shapes={"a": [2, 3], "b": [2, 3]})
    assert given[given.inputs[1]].shape == Shape.of(2, 3)


def test_shape_tensor_reshape_becomes_symbolic_view() -> None:
    """Reshape(x, Concat(Shape(x)[0:1], [-1])) is a View keeping the batch symbol."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "one"], ["s0"]),
        helper.make_node("Concat", ["s0", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(v, np.int64), n)
        for n, v in [("zero", [0]), ("one", [1]), ("minus1", [-1])]
    ]
    m = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    g = load_onnx(m)
    out = g.outputs[0]
    assert isinstance(g[out].op, View)
    assert g[out].shape == Shape.of(Size.sym("B"), 12)
    x = np.arange(2 * 12, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(evaluate(g, [x])[0], x.reshape(2, 12))


def test_external_data_loads(tmp_path) -> None:
    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    m = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    onnx.save_model(
        m, tmp_path / "m.onnx", save_as_external_data=True, location="w.bin", size_threshold=0
    )
    x = np.ones((2, 64), np.float32)
    for mapped in (True, False):  # a view of the mapped w.bin, or read into memory
        g = load_onnx(tmp_path / "m.onnx", mmap=mapped)
        (arr,) = _constants(g).values()
        assert isinstance(_root(arr), mmap.mmap) == mapped
        np.testing.assert_allclose(evaluate(g, [x])[0], x @ w, rtol=1e-5)


def test_bfloat16_initializer_becomes_f32() -> None:
    vals = np.array([1.5, -2.0, 0.15625], np.float32)
    t = helper.make_tensor("c", TensorProto.BFLOAT16, [3], vals.tolist())
    m = _model(
        [helper.make_node("Identity", ["c"], ["y"])],
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [t],
    )
    g = load_onnx(m)
    np.testing.assert_array_equal(evaluate(g, [])[0], vals)


def test_5000_node_chain_loads_and_evaluates() -> None:
    n = 5000
    nodes = [
        helper.make_node("Add" if i % 2 else "Relu", [f"t{i}", "one"][: 1 + i % 2], [f"t{i + 1}"])
        for i in range(n)
    ]
    m = _model(
        nodes,
        [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    g = load_onnx(m)
    assert len(g) > n
    x = np.array([-3.0, 0.0, 1.0, 2.0], np.float32)
    np.testing.assert_array_equal(evaluate(g, [x])[0], np.maximum(x, 0) + n // 2)


# -- initializers mapped from the file (kn_graph.onnx.mapped) -----------------------------------


def _root(arr: np.ndarray) -> object:
    base: object = arr
    while isinstance(base, np.ndarray):
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def _mlp_with_odd_names(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """x @ w_i + b_i, relu, for weights whose names have 1 to 4 letters (so some raw data
    sits at offsets that are not a multiple of 4 in the file), a small bias kept inline."""
    arrays: dict[str, np.ndarray] = {}
    nodes, inits, prev = [], [], "x"
    for i, name in enumerate(["a", "bb", "ccc", "dddd"]):
        arrays[name] = rng.standard_normal((48, 48)).astype(np.float32)  # 9 KB: mapped
        arrays[f"bias{i}"] = rng.standard_normal(48).astype(np.float32)  # 192 B: inline
        nodes += [
            helper.make_node("MatMul", [prev, name], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"bias{i}"], [f"s{i}"]),
            helper.make_node("Relu", [f"s{i}"], [f"h{i}"]),
        ]
        prev = f"h{i}"
    inits = [numpy_helper.from_array(a, n) for n, a in arrays.items()]
    m = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 48])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, None)],
        inits,
    )
    return m, arrays


def _constants(g) -> dict[str, np.ndarray]:
    """The graph's constant arrays by their bytes (names are not kept)."""
    from kn_graph.ops import Constant

    return {
        g[v].op.tensor.digest: g[v].op.tensor.array
        for v in g.values()
        if isinstance(g[v].op, Constant)
    }


def test_large_initializers_are_views_of_the_model_file(tmp_path) -> None:
    """A model given by path keeps its large initializers in the file (read-only views of a
    map, unaligned ones included); the small ones and `mmap=False` are copies. Both give
    onnxruntime's results."""
    import onnxruntime as ort

    rng = np.random.default_rng(5)
    m, arrays = _mlp_with_odd_names(rng)
    path = tmp_path / "mlp.onnx"
    onnx.save_model(m, path)
    x = rng.standard_normal((3, 48)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    g = load_onnx(path)
    consts = list(_constants(g).values())
    mapped = [a for a in consts if isinstance(_root(a), mmap.mmap)]
    assert sorted(a.size for a in mapped) == [48 * 48] * 4  # the weights, not the biases
    assert all(not a.flags.writeable for a in mapped)
    assert any(not a.flags.aligned for a in mapped), "expected an unaligned weight"
    for a in mapped:
        assert any(np.array_equal(a, w) for w in arrays.values())
    np.testing.assert_allclose(evaluate(g, [x])[0], want[0], rtol=1e-5, atol=1e-5)
    copied = load_onnx(path, mmap=False)
    assert not any(isinstance(_root(a), mmap.mmap) for a in _constants(copied).values())
    np.testing.assert_allclose(evaluate(copied, [x])[0], want[0], rtol=1e-5, atol=1e-5)


def test_stripped_model_parses_to_the_same_tensors(tmp_path) -> None:
    """`strip_initializers` leaves everything but the large raw data as it was: the parsed
    proto equals the original once the references are read back, and initializers inside a
    subgraph stay inline."""
    from kn_graph.onnx.mapped import MAPPED_LOCATION, MappedFile, strip_initializers

    rng = np.random.default_rng(2)
    m, _ = _mlp_with_odd_names(rng)
    inner = numpy_helper.from_array(rng.standard_normal((40, 40)).astype(np.float32), "inner")
    branch = helper.make_graph(
        [helper.make_node("Identity", ["inner"], ["o"])],
        "branch",
        [],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)],
        initializer=[inner],
    )
    m.graph.node.append(
        helper.make_node("If", ["cond"], ["z"], then_branch=branch, else_branch=branch)
    )
    path = tmp_path / "m.onnx"
    onnx.save_model(m, path)
    f = MappedFile(path)
    stripped = strip_initializers(f.map)
    assert stripped is not None  # the four weights left it, each for a reference of < 64 B
    assert len(stripped) < f.size - 4 * (48 * 48 * 4 - 64)
    back = onnx.load_from_string(stripped)
    for t in back.graph.initializer:
        info = {e.key: e.value for e in t.external_data}
        if info:
            assert info["location"] == MAPPED_LOCATION
            lo, n = int(info["offset"]), int(info["length"])
            t.raw_data = bytes(f.view(lo, n))
            del t.external_data[:]
            t.ClearField("data_location")
    assert back.SerializeToString() == m.SerializeToString()
    assert strip_initializers(memoryview(b"\xff\xfe not protobuf")) is None  # type: ignore[arg-type]


def test_damaged_model_files_are_our_errors(tmp_path) -> None:
    """Cut inside a weight's bytes or in the graph, the mapped path reports as the bytes path
    does."""
    import pytest

    from kn_graph.errors import OnnxImportError

    m, _ = _mlp_with_odd_names(np.random.default_rng(3))
    data = m.SerializeToString()
    for cut in (len(data) // 2, len(data) - 100, 7):
        path = tmp_path / f"cut{cut}.onnx"
        path.write_bytes(data[:cut])
        with pytest.raises(OnnxImportError, match=r"not a valid ONNX model|no graph"):
            load_onnx(path)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(OnnxImportError, match="no graph"):
        load_onnx(empty)


def test_a_model_file_rewritten_in_place_is_a_clear_error(tmp_path) -> None:
    """Mapped weights and a file rewritten in place (what torch.onnx.export and onnx.save do to
    an existing path): the reference executor and the planner raise our error instead of
    reading new bytes or faulting past a truncated end. A file replaced by rename keeps the
    mapped one alive: the graph still gives its own results."""
    import pytest

    from kn_cuda_eval import plan
    from kn_graph.errors import EvaluationError
    from kn_graph.optimizer import optimize

    rng = np.random.default_rng(6)
    m, _ = _mlp_with_odd_names(rng)
    x = rng.standard_normal((2, 48)).astype(np.float32)
    path = tmp_path / "m.onnx"
    onnx.save_model(m, path)
    g = load_onnx(path)
    want = evaluate(g, [x])[0]
    other = tmp_path / "other.onnx"
    m2, _ = _mlp_with_odd_names(np.random.default_rng(7))
    onnx.save_model(m2, other)
    os.replace(other, path)  # a new inode at the path: the map keeps the old file
    np.testing.assert_array_equal(evaluate(g, [x])[0], want)
    g = load_onnx(path)
    want = evaluate(g, [x])[0]
    with open(path, "r+b") as f:  # rewritten in place, shorter
        f.truncate(1000)
    with pytest.raises(EvaluationError, match="rewritten since it was loaded"):
        evaluate(g, [x])
    with pytest.raises(EvaluationError, match="rewritten since it was loaded"):
        plan(g, batch_size=2)
    with pytest.raises(EvaluationError, match="rewritten since it was loaded"):
        optimize(g)


def _mapped_rss_kb(path) -> int:
    """Resident kB of this process's maps of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's header line
            inside = len(head) >= 6 and head[-1] == str(path)
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


def test_loading_leaves_the_mapped_weights_on_disk(tmp_path) -> None:
    """Hashing an initializer (constants are compared by content) reads every page of it; the
    loader hands them back, so a loaded model holds none of its mapped weights resident until
    an executor reads them (which faults them in again: the result is onnxruntime's)."""
    import onnxruntime as ort

    rng = np.random.default_rng(9)
    w = rng.standard_normal((1024, 2048)).astype(np.float32)  # 8 MiB
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    path = (tmp_path / "big.onnx").resolve()
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    g = load_onnx(path)
    assert any(isinstance(_root(a), mmap.mmap) for a in _constants(g).values())
    assert _mapped_rss_kb(path) < 256, _mapped_rss_kb(path)  # of 8192 kB: boundary pages at most
    x = rng.standard_normal((2, 1024)).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(evaluate(g, [x])[0], want[0], rtol=1e-4, atol=1e-4)
