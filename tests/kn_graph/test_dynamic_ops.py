"""Data-dependent sizes and control flow (NonZero, TopK, NonMaxSuppression, Unique, Compress,
If, Loop, Scan) against onnxruntime: each model loads once with symbolic sizes and runs on two
inputs whose run-time sizes differ, on the CPU executor, optimized, and through segmented plans
in the plan emulator (every segment also on the fake CUDA device)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from kn_cuda_eval.planning.segments import HostPoint, Segment, emulate_graph, split
from kn_graph.errors import EvaluationError, KnError, ShapeMismatchError
from kn_graph.onnx import load_onnx
from kn_graph.optimizer import optimize
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_cuda_eval.helpers import check_plan
from tests.kn_graph.onnx.helpers import model, node, reference

RNG = np.random.default_rng(13)


def run_everywhere(
    m: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]], exact: bool = False
) -> list[list[np.ndarray]]:
    """One load; per feed: ours (CPU, optimized, emulated + fake device) == onnxruntime."""
    g = load_onnx(m, static=True)
    assert g.has_dynamic, "expected a data-dependent graph"
    opt = optimize(g)
    outs = []
    for feed in feeds:
        want = reference(m, feed)
        feed = {n: feed[n] for n in g.input_names}
        for label, got in (
            ("cpu", evaluate(g, feed)),
            ("optimized", evaluate(opt, feed)),
            ("emulated", emulate_graph(opt, feed)),
        ):
            assert len(got) == len(want), label
            for k, (a, b) in enumerate(zip(got, want, strict=True)):
                assert a.dtype == b.dtype and a.shape == b.shape, (label, k, a.shape, b.shape)
                if exact or b.dtype.kind != "f":
                    np.testing.assert_array_equal(a, b, err_msg=f"{label} output {k}")
                else:
                    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=label)
        check_plan(g, feed, expected=want)  # unoptimized and optimized: segments on the fake GPU
        outs.append(want)
    return outs


def test_nonzero_then_gather_and_matmul() -> None:
    """The indices of the positive elements select rows that go through a MatMul: the row
    count is a run-time size planned per binding."""
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    nodes = [
        node("Greater", ["s", "zero"], ["mask"]),
        node("NonZero", ["mask"], ["nz"]),
        node("Squeeze", ["nz", "ax0"], ["idx"]),
        node("Gather", ["x", "idx"], ["rows"], axis=0),
        node("MatMul", ["rows", "w"], ["y"]),
    ]
    x = RNG.standard_normal((10, 4)).astype(np.float32)
    m = model(
        nodes,
        {"x": x, "s": x[:, 0]},
        ["y", "nz"],
        inits={"zero": np.float32(0), "ax0": np.array([0]), "w": w},
        dims={"x": ["n", 4], "s": ["n"]},
    )
    s1 = np.linspace(-1, 1, 10).astype(np.float32)  # 5 positive
    s2 = np.linspace(-0.1, 1, 13).astype(np.float32)  # 11 positive
    x2 = RNG.standard_normal((13, 4)).astype(np.float32)
    out = run_everywhere(m, [{"x": x, "s": s1}, {"x": x2, "s": s2}])
    assert [o[1].shape[1] for o in out] == [5, 11]


@pytest.mark.parametrize("largest", [0, 1])
def test_topk_with_a_data_k_and_ties(largest: int) -> None:
    """k comes from data (a run-time size); ties resolve to the lower index as onnxruntime does."""
    nodes = [node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=largest)]
    x = np.array([[3, 1, 3, 2, 1, 3], [0, 0, 5, 5, 1, 0]], np.float32)
    m = model(nodes, {"x": x, "k": np.array([2])}, ["v", "i"], dims={"x": [2, "n"]})
    x2 = RNG.integers(0, 4, (2, 9)).astype(np.float32)
    run_everywhere(m, [{"x": x, "k": np.array([4])}, {"x": x2, "k": np.array([7])}], exact=True)


def test_nms_selects_different_counts() -> None:
    """Boxes and scores from data: NonMaxSuppression keeps a data-dependent number of boxes,
    which a Gather then takes (7 vs 31-ish detections on the two inputs)."""
    nodes = [
        node("NonMaxSuppression", ["boxes", "scores", "maxk", "iou", "thr"], ["sel"]),
        node("Gather", ["sel", "two"], ["bi"], axis=1),
        node("Squeeze", ["boxes", "ax0"], ["b2"]),
        node("Gather", ["b2", "bi"], ["kept"], axis=0),
    ]

    def data(n: int, seed: int) -> dict[str, np.ndarray]:
        r = np.random.default_rng(seed)
        c = r.uniform(0, 10, (n, 2))
        wh = r.uniform(0.5, 2, (n, 2))
        boxes = np.concatenate([c, c + wh], 1)[None].astype(np.float32)
        return {"boxes": boxes, "scores": r.uniform(0, 1, (1, 2, n)).astype(np.float32)}

    d1, d2 = data(12, 1), data(60, 2)
    inits = {
        "maxk": np.array([20]),
        "iou": np.array([0.3], np.float32),
        "thr": np.array([0.2], np.float32),
        "two": np.array(2),
        "ax0": np.array([0]),
    }
    m = model(
        nodes, d1, ["sel", "kept"], inits=inits, dims={"boxes": [1, "n", 4], "scores": [1, 2, "n"]}
    )
    out = run_everywhere(m, [d1, d2], exact=True)
    counts = [o[0].shape[0] for o in out]
    assert counts[0] != counts[1] and min(counts) > 0, counts


@pytest.mark.parametrize("sorted_", [0, 1])
def test_unique_all_four_outputs(sorted_: int) -> None:
    nodes = [node("Unique", ["x"], ["y", "idx", "inv", "cnt"], sorted=sorted_)]
    x = np.array([2, 1, 1, 3, 4, 3], np.float32)
    m = model(nodes, {"x": x}, ["y", "idx", "inv", "cnt"], dims={"x": ["n"]})
    x2 = RNG.integers(0, 9, 20).astype(np.float32)
    run_everywhere(m, [{"x": x}, {"x": x2}], exact=True)


def test_compress_with_a_data_condition() -> None:
    nodes = [node("Compress", ["x", "c"], ["y"], axis=0)]
    x = RNG.standard_normal((6, 3)).astype(np.float32)
    c = np.array([1, 0, 1, 1, 0, 0], bool)
    m = model(nodes, {"x": x, "c": c}, dims={"x": ["n", 3], "c": ["n"]})
    x2 = RNG.standard_normal((9, 3)).astype(np.float32)
    run_everywhere(m, [{"x": x, "c": c}, {"x": x2, "c": x2[:, 0] > -1}])


def _branch(name: str, nodes: list[onnx.NodeProto], out: str) -> onnx.GraphProto:
    return helper.make_graph(nodes, name, [], [onnx.ValueInfoProto(name=out)])


def test_if_on_data_with_branches_of_different_sizes() -> None:
    """sum(x) > 0 picks a branch; the branches give different lengths (a run-time size), and
    only the taken branch runs."""
    then_b = _branch("then", [node("Concat", ["x", "x"], ["t"], axis=0)], "t")
    else_b = _branch("else", [node("Neg", ["x"], ["e"])], "e")
    nodes = [
        node("ReduceSum", ["x"], ["s"], keepdims=0),
        node("Greater", ["s", "zero"], ["c"]),
        node("If", ["c"], ["r"], then_branch=then_b, else_branch=else_b),
        node("Mul", ["r", "two"], ["y"]),
    ]
    x = np.abs(RNG.standard_normal(5)).astype(np.float32)
    m = model(
        nodes, {"x": x}, inits={"zero": np.float32(0), "two": np.float32(2)}, dims={"x": ["n"]}
    )
    out = run_everywhere(m, [{"x": x}, {"x": -np.abs(RNG.standard_normal(7)).astype(np.float32)}])
    assert [o[0].shape for o in out] == [(10,), (7,)]


def _loop_body() -> onnx.GraphProto:
    """state <- state * 0.5 + x; scan out state; continue while max(state) > 1."""
    nodes = [
        node("Mul", ["s_in", "half"], ["h"]),
        node("Add", ["h", "x"], ["s_out"]),
        node("ReduceMax", ["s_out"], ["mx"], keepdims=0),
        node("Greater", ["mx", "one"], ["c_out"]),
        node("Identity", ["s_out"], ["scan"]),
    ]
    vi = helper.make_tensor_value_info
    return helper.make_graph(
        nodes,
        "body",
        [
            vi("i", TensorProto.INT64, []),
            vi("c_in", TensorProto.BOOL, []),
            vi("s_in", TensorProto.FLOAT, None),
        ],
        [
            vi("c_out", TensorProto.BOOL, []),
            vi("s_out", TensorProto.FLOAT, None),
            vi("scan", TensorProto.FLOAT, None),
        ],
        initializer=[
            onnx.numpy_helper.from_array(np.float32(0.5), "half"),
            onnx.numpy_helper.from_array(np.float32(1), "one"),
        ],
    )


def test_loop_with_a_data_condition_and_scan_outputs() -> None:
    """A while loop (trip count 100, condition from data) with a loop-carried value, a captured
    outer value and a scan output: the iteration count is a run-time size."""
    nodes = [node("Loop", ["M", "c0", "s0"], ["s_final", "scans"], body=_loop_body())]
    x = np.full(3, 0.2, np.float32)
    feed1 = {"x": x, "s0": np.full(3, 8, np.float32), "M": np.array(100), "c0": np.array(True)}
    feed2 = {**feed1, "s0": np.full(3, 300, np.float32)}
    m = model(nodes, feed1, ["s_final", "scans"], dims={"x": ["n"], "s0": ["n"]})
    out = run_everywhere(m, [feed1, feed2])
    assert out[0][1].shape[0] != out[1][1].shape[0]


def test_loop_that_never_stops_is_an_error_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KN_MAX_LOOP_ITERATIONS", "50")
    nodes = [node("Loop", ["", "c0", "s0"], ["s_final", "scans"], body=_loop_body())]
    feed = {"x": np.full(3, 2, np.float32), "s0": np.ones(3, np.float32), "c0": np.array(True)}
    g = load_onnx(model(nodes, feed, ["s_final", "scans"]))
    with pytest.raises(EvaluationError, match=r"loop: still running after 50 iterations"):
        evaluate(g, feed)
    with pytest.raises(EvaluationError, match=r"still running after 50"):
        emulate_graph(g, feed)


def test_scan_over_a_symbolic_length() -> None:
    """A cumulative sum with Scan over a sequence whose length is a symbol (not unrolled)."""
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [node("Add", ["acc", "xt"], ["acc_out"]), node("Identity", ["acc_out"], ["yt"])],
        "body",
        [vi("acc", TensorProto.FLOAT, [2]), vi("xt", TensorProto.FLOAT, [2])],
        [vi("acc_out", TensorProto.FLOAT, [2]), vi("yt", TensorProto.FLOAT, [2])],
    )
    nodes = [node("Scan", ["a0", "x"], ["a", "ys"], body=body, num_scan_inputs=1)]
    feed1 = {"a0": np.zeros(2, np.float32), "x": RNG.standard_normal((5, 2)).astype(np.float32)}
    feed2 = {**feed1, "x": RNG.standard_normal((120, 2)).astype(np.float32)}
    m = model(nodes, feed1, ["a", "ys"], dims={"x": ["t", 2]}, opset=16)
    g = load_onnx(m)
    assert any(getattr(g[v].op, "kind", "") == "scan" for v in g.values())
    run_everywhere(m, [feed1, feed2])


def test_a_bad_index_in_data_names_the_node() -> None:
    """A Gather index out of range computed from data raises naming the value, never reads
    past the table."""
    nodes = [
        node("NonZero", ["x"], ["nz"]),
        node("Squeeze", ["nz", "ax0"], ["i"]),
        node("Add", ["i", "ten"], ["j"]),
        node("Gather", ["x", "j"], ["y"], axis=0),
    ]
    x = np.array([0, 1, 0, 2], np.float32)
    g = load_onnx(
        model(nodes, {"x": x}, inits={"ax0": np.array([0]), "ten": np.array(10)}, dims={"x": ["n"]})
    )
    with pytest.raises(KnError, match="out of range"):
        evaluate(g, {"x": x})
    with pytest.raises(KnError):
        emulate_graph(g, {"x": x})


def test_split_puts_host_points_between_segments() -> None:
    nodes = [
        node("NonZero", ["x"], ["nz"]),
        node("Cast", ["nz"], ["f"], to=TensorProto.FLOAT),
        node("ReduceSum", ["f"], ["y"], keepdims=0),
    ]
    g = load_onnx(model(nodes, {"x": np.ones(3, np.float32)}, dims={"x": ["n"]}))
    kinds = [type(s) for s in split(g).stages]
    assert HostPoint in kinds and kinds[-1] is Segment
    for feed in ({"x": np.array([0, 1, 2], np.float32)}, {"x": np.arange(9, dtype=np.float32)}):
        np.testing.assert_array_equal(emulate_graph(g, feed)[0], evaluate(g, feed)[0])


def test_guards_on_a_run_time_size_are_checked_when_it_is_bound() -> None:
    """Reshape(NonZero indices, [-1, 2]) assumes an even count: the guard is checked once the
    count is known, naming the node, on every path."""
    nodes = [node("NonZero", ["x"], ["nz"]), node("Reshape", ["nz", "shape"], ["y"])]
    x = np.array([1, 0, 2, 3, 0, 4], np.float32)
    m = model(nodes, {"x": x}, inits={"shape": np.array([-1, 2])}, dims={"x": ["n"]})
    g = load_onnx(m)
    assert any("nonzero" in str(gd) for gd in g.guards), g.guards
    np.testing.assert_array_equal(evaluate(g, {"x": x})[0], reference(m, {"x": x})[0])
    odd = np.array([1, 0, 2, 0, 0, 4], np.float32)
    for run in (evaluate, emulate_graph):
        with pytest.raises(ShapeMismatchError, match="Reshape"):
            run(g, {"x": odd})


def test_loop_over_a_symbolic_trip_count_has_expression_sizes() -> None:
    """for i in range(len(x)): acc += x[i]; scan acc — the trip count is Shape(x)[0], so the
    scan output is [n, 3] (an expression, not a run-time size) and 200 steps are not unrolled."""
    vi = helper.make_tensor_value_info
    body = helper.make_graph(
        [
            node("Gather", ["x", "i"], ["row"], axis=0),
            node("Add", ["acc", "row"], ["acc_out"]),
            node("Identity", ["c_in"], ["c_out"]),
            node("Identity", ["acc_out"], ["scan"]),
        ],
        "body",
        [
            vi("i", TensorProto.INT64, []),
            vi("c_in", TensorProto.BOOL, []),
            vi("acc", TensorProto.FLOAT, [3]),
        ],
        [
            vi("c_out", TensorProto.BOOL, []),
            vi("acc_out", TensorProto.FLOAT, [3]),
            vi("scan", TensorProto.FLOAT, [3]),
        ],
    )
    nodes = [
        node("Shape", ["x"], ["sh"]),
        node("Gather", ["sh", "zero"], ["n"], axis=0),
        node("Loop", ["n", "true", "a0"], ["acc", "rows"], body=body),
    ]
    inits = {"zero": np.array(0), "true": np.array(True), "a0": np.zeros(3, np.float32)}
    feed1 = {"x": RNG.standard_normal((7, 3)).astype(np.float32)}
    feed2 = {"x": RNG.standard_normal((200, 3)).astype(np.float32)}
    m = model(nodes, feed1, ["acc", "rows"], inits=inits, dims={"x": ["n", 3]})
    g = load_onnx(m)
    assert str(g[g.outputs[1]].shape) == "[n,3]"
    run_everywhere(m, [feed1, feed2])


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatter_with_indices_from_data(reduction: str) -> None:
    """ScatterND / ScatterElements whose indices are computed (argmax of scores): one load, no
    specialization per value; a bad index raises naming the node."""
    nodes = [
        node("ArgMax", ["s"], ["am"], axis=1, keepdims=1),
        node("ScatterElements", ["x", "am", "u"], ["y"], axis=1, reduction=reduction),
        node("Unsqueeze", ["am", "ax"], ["am3"]),
        node("Squeeze", ["am3", "ax"], ["am2"]),
        node("ScatterND", ["x", "pairs", "row"], ["z"], reduction=reduction),
    ]
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    feed = {
        "x": x,
        "s": RNG.standard_normal((4, 5)).astype(np.float32),
        "u": RNG.standard_normal((4, 1)).astype(np.float32),
        "pairs": np.array([[1], [3], [1]]),
        "row": RNG.standard_normal((3, 5)).astype(np.float32),
    }
    m = model(nodes, feed, ["y", "z"], inits={"ax": np.array([2])}, opset=18)
    run_everywhere(m, [feed, {**feed, "s": RNG.standard_normal((4, 5)).astype(np.float32)}])
    g = load_onnx(m)
    with pytest.raises(EvaluationError, match="scatter_nd: index 7 out of range"):
        evaluate(g, {**feed, "pairs": np.array([[1], [7], [1]])})


@pytest.mark.parametrize("storage_order", [0, 1])
def test_maxpool_indices_feed_maxunpool(storage_order: int) -> None:
    """SegNet-style: MaxPool's Indices output, then MaxUnpool scatters the values back (indices
    from data), at two batch sizes; with storage_order=1 the indices are column-major."""
    nodes = [
        node(
            "MaxPool",
            ["x"],
            ["y", "i"],
            kernel_shape=[2, 2],
            strides=[2, 2],
            storage_order=storage_order,
        ),
        node("Relu", ["y"], ["r"]),
    ]
    outs = ["r", "i"]
    if storage_order == 0:  # MaxUnpool reads row-major indices
        nodes.append(node("MaxUnpool", ["r", "i"], ["u"], kernel_shape=[2, 2], strides=[2, 2]))
        outs.append("u")
    x = RNG.standard_normal((1, 3, 6, 8)).astype(np.float32)
    m = model(nodes, {"x": x}, outs, dims={"x": ["B", 3, 6, 8]})
    feeds = [{"x": x}, {"x": RNG.standard_normal((3, 3, 6, 8)).astype(np.float32)}]
    if storage_order == 0:
        run_everywhere(m, feeds)
    else:
        g = load_onnx(m, static=True)
        for feed in feeds:
            for a, b in zip(evaluate(g, feed), reference(m, feed), strict=True):
                np.testing.assert_array_equal(a, b)


def test_sequence_inputs_and_outputs_through_the_public_api() -> None:
    """A sequence input is a list of arrays (the model loads per structure: lengths and element
    shapes), a sequence output comes back as a list, as onnxruntime gives them."""
    vi = helper.make_tensor_value_info
    seq_f = helper.make_tensor_sequence_value_info
    g = helper.make_graph(
        [
            node("SequenceInsert", ["s", "t"], ["s2"]),
            node("ConcatFromSequence", ["s2"], ["cat"], axis=0),
            node("SplitToSequence", ["cat", "two"], ["parts"], axis=0),
        ],
        "g",
        [seq_f("s", TensorProto.FLOAT, None), vi("t", TensorProto.FLOAT, [2, 3])],
        [
            seq_f("s2", TensorProto.FLOAT, None),
            vi("cat", TensorProto.FLOAT, None),
            seq_f("parts", TensorProto.FLOAT, None),
        ],
        initializer=[onnx.numpy_helper.from_array(np.array(2), "two")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    prepared = Device.cpu().prepare(load_onnx(m))
    for n in (1, 3, 3):
        feed = {
            "s": [RNG.standard_normal((2, 3)).astype(np.float32) for _ in range(n)],
            "t": RNG.standard_normal((2, 3)).astype(np.float32),
        }
        got, want = prepared.eval(feed), reference(m, feed)
        assert [type(x) for x in got] == [list, np.ndarray, list]
        assert len(got[0]) == n + 1 and len(got[2]) == len(want[2])
        for a, b in zip([*got[0], got[1], *got[2]], [*want[0], want[1], *want[2]], strict=True):
            np.testing.assert_array_equal(a, b)
