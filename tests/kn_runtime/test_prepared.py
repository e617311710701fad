"""The one `PreparedGraph` on each backend: executors per binding in its cache (bounded, eager
when nothing is left to bind), `memory()` where the backend reports it, `close()`, and a
value-specialized model's graphs kept per distinct value."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from kn_graph import DType, Graph, Shape, Size
from kn_graph.errors import KnError
from kn_graph.onnx import ValueSpecializedModel, load_onnx
from kn_runtime import Device


def _graph(batch: Size | int) -> Graph:
    g = Graph()
    x = g.input(Shape.of(batch, 3), DType.F32, "x")
    g.add_output(g.relu(g.mul(x, 2.0)), "y")
    return g


def _x(b: int) -> np.ndarray:
    return np.linspace(-1, 1, 3 * b, dtype=np.float32).reshape(b, 3)


def test_nothing_left_to_bind_is_planned_at_prepare_time() -> None:
    assert len(Device.cpu().prepare(_graph(2)).cache) == 1  # no symbol
    assert len(Device.cpu().prepare(_graph(Size.sym("B")), 4).cache) == 1  # B fixed
    assert len(Device.cpu().prepare(_graph(Size.sym("B"))).cache) == 0  # bound per call


def test_the_cache_keeps_max_bindings_executors_and_close_frees_them() -> None:
    g = _graph(Size.sym("B"))
    p = Device.cpu(threads=1).prepare(g, max_bindings=2)
    for b in (1, 2, 3, 2):
        np.testing.assert_array_equal(p.eval([_x(b)])[0], np.maximum(2 * _x(b), 0))
    assert p.cache.keys(p.graph.id) == [(("B", 3),), (("B", 2),)] and p.cache.built == 3
    assert set(p.memory()) == {"arena", "packed", "workspace", "executors"}
    assert p.memory()["executors"] == 2 and p.memory()["arena"] > 0
    p.close()
    assert p.memory() == {"arena": 0, "packed": 0, "workspace": 0, "executors": 0}
    np.testing.assert_array_equal(p.eval([_x(1)])[0], np.maximum(2 * _x(1), 0))


def test_host_arrays_are_where_a_cpu_evaluation_returns_them() -> None:
    out = Device.cpu().prepare(_graph(2)).eval([_x(2)], return_device=True)[0]
    assert isinstance(out, np.ndarray)


def test_the_reference_reports_no_memory() -> None:
    with pytest.raises(KnError, match="does not report"):
        Device.cpu(reference=True).prepare(_graph(2)).memory()


def test_a_value_specialized_model_keeps_max_bindings_graphs() -> None:
    """Reshape to a shape input's value: one graph (and prepared graph) per distinct value."""
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    model = helper.make_model(
        helper.make_graph(
            [node],
            "g",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [6]),
                helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    loaded = load_onnx(model.SerializeToString())
    assert isinstance(loaded, ValueSpecializedModel), type(loaded)
    p = Device.cpu().prepare(loaded, max_bindings=2)
    x = np.arange(6, dtype=np.float32)
    for shape in ([2, 3], [3, 2], [1, 6], [2, 3]):
        (y,) = p.eval({"x": x, "shape": np.array(shape, np.int64)})
        np.testing.assert_array_equal(y, x.reshape(shape))
    assert len(p._specializing.prepared()) == 2  # type: ignore[union-attr]
    with pytest.raises(KnError, match="one graph per value"):
        _ = p.graph
    assert all(q.graph.optimized for q in p._specializing.prepared())  # type: ignore[union-attr]


def _conv_bn() -> bytes:
    """Conv then BatchNormalization, as every CNN export has them: the optimizer folds the
    normalization into the convolution's weights."""
    rng = np.random.default_rng(0)
    inits = [
        helper.make_tensor(n, TensorProto.FLOAT, a.shape, a.ravel())
        for n, a in (
            ("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)),
            ("scale", rng.uniform(0.5, 2, 4).astype(np.float32)),
            ("bias", rng.standard_normal(4).astype(np.float32)),
            ("mean", rng.standard_normal(4).astype(np.float32)),
            ("var", rng.uniform(0.5, 2, 4).astype(np.float32)),
        )
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_prepare_optimizes_by_default_as_an_onnxruntime_session_does() -> None:
    import onnxruntime as ort

    from kn_graph.optimizer import optimize

    model = _conv_bn()
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    (want,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    g = load_onnx(model)
    assert isinstance(g, Graph)
    fast = Device.cpu(threads=1).prepare(g)
    assert fast.graph.optimized and fast.graph is not g and len(fast.graph) < len(g)
    as_loaded = Device.cpu(threads=1).prepare(g, optimize=False)
    assert as_loaded.graph is g and not g.optimized
    assert Device.cpu(reference=True).prepare(g).graph is g  # the oracle runs what it is given
    assert Device.cpu(reference=True).prepare(g, optimize=True).graph.optimized
    done = optimize(g)
    assert Device.cpu(threads=1).prepare(done).graph is done  # never optimized twice
    for p in (fast, as_loaded):
        np.testing.assert_allclose(p.eval([x])[0], want, rtol=1e-4, atol=1e-4)
    with pytest.raises(KnError, match="optimize must be True, False or None"):
        Device.cpu().prepare(g, optimize="yes")  # type: ignore[arg-type]


def test_bindings_are_remembered_per_shape_and_guards_still_refuse_every_time() -> None:
    """The binding memo (kn_graph.binding.BINDING_MEMO) keeps what a shape bound, never what it
    was refused for, and stays bounded over a stream of distinct shapes."""
    from kn_graph.binding import BINDING_MEMO
    from kn_graph.errors import InputMismatchError

    g = _graph(Size.sym("B"))
    g.add_guard(Size(4), ">=", Size.sym("B"), "at most 4 rows")
    p = Device.cpu(threads=1).prepare(g, optimize=False)
    for _ in range(2):
        np.testing.assert_array_equal(p.eval([_x(2)])[0], np.maximum(2 * _x(2), 0))
        with pytest.raises(InputMismatchError, match="at most 4 rows"):
            p.eval([_x(5)])
    free = _graph(Size.sym("B"))
    ref = Device.cpu(reference=True).prepare(free)
    for b in range(1, BINDING_MEMO + 8):
        assert ref.check_inputs([np.zeros((b, 3), np.float32)]) == {"B": b}
    assert 0 < len(free.binding_memo) <= BINDING_MEMO


def test_a_repeated_call_reuses_its_executor_until_the_cache_lets_go_of_it() -> None:
    """The last call's executor is reused for inputs of the same shapes and dtypes (no binding,
    no lookup), never once the cache closed it (evicted, stale, close()), and every input is
    still checked: a wrong dtype, a missing name, names in another order, a strided view."""
    from kn_graph.errors import InputMismatchError

    g = Graph()
    x = g.input(Shape.of(Size.sym("B"), 3), DType.F32, "x")
    w = g.input(Shape.of(3), DType.F32, "w")
    g.add_output(g.relu(g.mul(x, w)), "y")
    p = Device.cpu(threads=1).prepare(g, max_bindings=1)
    wv = np.array([1.0, -2.0, 3.0], np.float32)

    def want(a: np.ndarray) -> np.ndarray:
        return np.maximum(a * wv, 0)

    for b in (2, 2, 3, 2, 2):  # max_bindings=1: each change of B evicts the other executor
        np.testing.assert_array_equal(p.eval([_x(b), wv])[0], want(_x(b)))
        np.testing.assert_array_equal(p.eval({"w": wv, "x": _x(b)})[0], want(_x(b)))
    assert p.cache.built == 3 and len(p.cache) == 1
    strided = np.asfortranarray(_x(2))
    np.testing.assert_array_equal(p.eval([strided, wv])[0], want(_x(2)))
    with pytest.raises(InputMismatchError, match="dtype"):
        p.eval([_x(2).astype(np.float64), wv])
    with pytest.raises(InputMismatchError, match="missing"):
        p.eval({"x": _x(2)})
    p.cache.clear()  # the executor remembered is closed by its cache: built again
    np.testing.assert_array_equal(p.eval([_x(2), wv])[0], want(_x(2)))
    p.close()
    np.testing.assert_array_equal(p.eval([_x(2), wv])[0], want(_x(2)))
    assert p.cache.built == 5


def test_a_segment_met_again_at_its_last_binding_reuses_its_executor() -> None:
    """A graph in segments (a data-dependent If): each segment's last executor is reused while
    the cache keeps it; branches switch and shapes change without a wrong answer."""
    vi = helper.make_tensor_value_info
    branch = [
        helper.make_graph([helper.make_node(op, ["x"], ["y"])], op, [], [vi("y", 1, None)])
        for op in ("Neg", "Abs")
    ]
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch[0], else_branch=branch[1])
    model = helper.make_model(
        helper.make_graph(
            [node],
            "g",
            [vi("c", TensorProto.BOOL, []), vi("x", 1, ["n"])],
            [vi("y", 1, ["n"])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    p = Device.cpu(threads=1).prepare(load_onnx(model.SerializeToString()), max_bindings=1)
    assert p._runner is not None
    for c, n in ((True, 4), (True, 4), (False, 4), (False, 5), (True, 5), (True, 4)):
        x = np.linspace(-1, 1, n, dtype=np.float32)
        for _ in range(2):
            got = p.eval([np.array(c), x])[0]
            np.testing.assert_array_equal(got, -x if c else np.abs(x))
            p.cache.clear()  # every executor closed: none may be reused


def _loop_model() -> bytes:
    """s <- relu(s * 0.5 + x), M times (M an input: a data-dependent trip count)."""
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["s_in", "half"], ["h"]),
            helper.make_node("Add", ["h", "x"], ["a"]),
            helper.make_node("Relu", ["a"], ["s_out"]),
            helper.make_node("Identity", ["c_in"], ["c_out"]),
        ],
        "body",
        [vi("i", TensorProto.INT64, []), vi("c_in", TensorProto.BOOL, []), vi("s_in", 1, [4])],
        [vi("c_out", TensorProto.BOOL, []), vi("s_out", 1, [4])],
        [helper.make_tensor("half", 1, [], [0.5])],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", "", "s0"], ["s"], body=body)],
        "g",
        [vi("M", TensorProto.INT64, []), vi("s0", 1, [4]), vi("x", 1, [4])],
        [vi("s", 1, [4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_graph_run_in_segments_profiles_each_segment_and_host_point() -> None:
    """Data-dependent graphs used to refuse `profile`; now a row per stage, wall time, the
    stages of a Loop's body once per iteration and the host point's own time apart."""
    import onnxruntime as ort

    model = _loop_model()
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    feed = {"M": np.array(3), "s0": np.zeros(4, np.float32), "x": x}
    p = Device.cpu(threads=1).prepare(load_onnx(model))
    (want,) = ort.InferenceSession(model).run(None, feed)
    np.testing.assert_allclose(p.eval(feed)[0], want, rtol=1e-6)
    prof = p.profile(feed)
    kinds = [r.kind for r in prof.rows]
    assert kinds.count("host loop") == 1 and kinds.count("segment") >= 3, prof
    assert all(r.ms >= 0 for r in prof.rows) and "by kind" in prof.table()
