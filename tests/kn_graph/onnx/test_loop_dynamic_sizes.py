"""Range, ConstantOfShape, Expand, Reshape and Tile sized by data inside Loop bodies (an attention
decoder's Range(0, step) and Expand to [1, step, d]): they load as Dynamic ops whose sizes are
bound per iteration. Checked against onnxruntime on the reference executor and on Device.cpu();
the same ops in the model's own graph load per value (value specialization), as before."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument

from kn_graph.errors import EvaluationError
from kn_graph.graph import Graph
from kn_graph.onnx import ValueSpecializedModel, load_onnx
from kn_graph.ops import Dynamic
from kn_graph.optimizer import optimize
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.kn_graph.onnx.helpers import node, reference

vi = helper.make_tensor_value_info
I64, F32, BOOL = TensorProto.INT64, TensorProto.FLOAT, TensorProto.BOOL
RNG = np.random.default_rng(21)
ORT_ERRORS = (Fail, InvalidArgument)


def _const(name: str, value: object, dtype: type = np.int64) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.array(value, dtype), name)


def _model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[str],
    inits: Sequence[onnx.TensorProto] = (),
) -> onnx.ModelProto:
    outs = [onnx.ValueInfoProto(name=n) for n in outputs]
    g = helper.make_graph(list(nodes), "g", list(inputs), outs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _body_ops(graph: Graph) -> dict[str, str]:
    """The Dynamic ops inside the graph's subgraphs (Loop and Scan bodies, If branches): for
    each, its kind and node (`where`, its last parameter) -> its declared shape."""
    found: dict[str, str] = {}
    for v in graph.values():
        op = graph[v].op
        if isinstance(op, Dynamic):
            for body in (p for p in op.params if isinstance(p, Graph)):
                for b in body.value_infos():
                    if isinstance(b.op, Dynamic):
                        found[f"{b.op.kind} {b.op.params[-1]}"] = str(b.shape)
    return found


def _body_kinds(graph: Graph) -> set[str]:
    return {k.split()[0] for k in _body_ops(graph)}


def _ours(loaded: Graph | ValueSpecializedModel, feed: Mapping[str, np.ndarray]) -> list:
    graph = loaded.specialize(feed) if isinstance(loaded, ValueSpecializedModel) else loaded
    return evaluate(graph, {n: feed[n] for n in graph.input_names})


def check_everywhere(
    m: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]]
) -> list[list[np.ndarray]]:
    """One load and one Device.cpu() preparation; per feed, the reference executor (also on
    the optimized graph) and the CPU device equal onnxruntime in dtype, shape and value.
    Returns onnxruntime's outputs."""
    loaded = load_onnx(m)
    optimized = optimize(loaded)
    prepared = Device.cpu().prepare(loaded)
    wants = []
    for feed in feeds:
        want = reference(m, feed)
        runs = [("reference", _ours(loaded, feed)), ("cpu", prepared.eval(feed))]
        if isinstance(loaded, Graph):
            runs.append(("optimized", _ours(optimized, feed)))
        for label, got in runs:
            assert len(got) == len(want), label
            for k, (a, b) in enumerate(zip(got, want, strict=True)):
                assert (a.dtype, a.shape) == (b.dtype, b.shape), (label, k, a.shape, b.shape)
                np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6, err_msg=f"{label} {k}")
        wants.append(want)
    return wants


# -- Range(0, i) in a loop ------------------------------------------------------------------------
def _range_body(limit: str) -> onnx.GraphProto:
    """acc += sum(Range(0, limit)); seq = Concat(seq, Range(0, limit)); the counter steps by 1."""
    nodes = [
        node("Range", ["zero", limit, "one"], ["r"], name="rng"),
        node("ReduceSum", ["r"], ["s"], keepdims=1),
        node("Add", ["acc", "s"], ["acc_out"]),
        node("Concat", ["seq", "r"], ["seq_out"], axis=0),
        node("Add", ["k", "one"], ["k_out"]),
        node("Identity", ["c_in"], ["c_out"]),
    ]
    return helper.make_graph(
        nodes,
        "body",
        [
            vi("i", I64, []),
            vi("c_in", BOOL, []),
            vi("k", I64, []),
            vi("acc", I64, [1]),
            vi("seq", I64, [None]),
        ],
        [
            vi("c_out", BOOL, []),
            vi("k_out", I64, []),
            vi("acc_out", I64, [1]),
            vi("seq_out", I64, [None]),
        ],
        initializer=[_const("zero", 0), _const("one", 1)],
    )


@pytest.mark.parametrize("limit", ["i", "k"])
def test_range_to_the_iteration_number_grows_a_carried_sequence(limit: str) -> None:
    """Range(0, i) (the iteration number, or a loop-carried counter started at 2): its length
    is a run-time size per iteration; the carried sequence grows by it."""
    loop = node("Loop", ["M", "", "k0", "a0", "s0"], ["k", "acc", "seq"], body=_range_body(limit))
    m = _model(
        [loop],
        [vi("M", I64, []), vi("k0", I64, []), vi("a0", I64, [1]), vi("s0", I64, [0])],
        ["k", "acc", "seq"],
    )
    assert "range" in _body_kinds(load_onnx(m))  # type: ignore[arg-type]
    start = {"k0": np.array(2), "a0": np.array([0]), "s0": np.zeros(0, np.int64)}
    outs = check_everywhere(m, [{**start, "M": np.array(6)}, {**start, "M": np.array(1)}])
    assert outs[0][2].shape == ((15,) if limit == "i" else (27,))


# -- a decoder that grows by one step per iteration --------------------------------------------------
def _decoder_body() -> onnx.GraphProto:
    """One step of an attention-decoder-like loop: every size comes from the carried step."""
    nodes = [
        node("Add", ["step", "one"], ["step_out"]),
        node("Unsqueeze", ["step_out", "ax0"], ["s1"]),
        node("Range", ["zero", "step_out", "one"], ["pos"], name="positions"),
        node("Cast", ["pos"], ["posf"], to=F32),
        node("Concat", ["one1", "s1", "four1"], ["shp"], axis=0),
        node("Expand", ["x", "shp"], ["e"], name="expand"),  # [1, s, 4]
        node("Concat", ["one1", "s1", "one1"], ["wshape"], axis=0),
        node("Reshape", ["posf", "wshape"], ["w"], name="weights"),  # [1, s, 1]
        node("Mul", ["e", "w"], ["ew"]),
        node("ReduceSum", ["ew", "ax1"], ["ctx"], keepdims=1),  # [1, 1, 4]
        node("Concat", ["one1", "s1"], ["mshape"], axis=0),
        node(
            "ConstantOfShape",
            ["mshape"],
            ["mask"],
            value=helper.make_tensor("v", F32, [1], [2.0]),
            name="mask",
        ),  # [1, s]
        node("ReduceSum", ["mask", "ax1"], ["msum"], keepdims=1),  # [1, 1]
        node("Unsqueeze", ["msum", "ax0"], ["msum3"]),
        node("Div", ["ctx", "msum3"], ["ctx2"]),
        node("Concat", ["hist", "ctx2"], ["hist_out"], axis=1),  # [1, t + 1, 4]
        node("Tile", ["x", "wshape"], ["tiled"], name="tile"),  # [1, s, 4]
        node("Concat", ["zero1", "s1", "minus1"], ["rshape"], axis=0),
        node("Reshape", ["tiled", "rshape"], ["tiled2"], name="copy_and_infer"),  # 0 and -1
        node("ReduceMean", ["tiled2", "ax1"], ["tmean"], keepdims=1),
        node("Add", ["ctx2", "tmean"], ["logits"]),
        node("ArgMax", ["logits"], ["tok"], axis=2, keepdims=0),  # [1, 1]
        node("Concat", ["tokens", "tok"], ["tokens_out"], axis=1),  # [1, t + 1]
        node("Less", ["step_out", "limit"], ["c_out"]),
        node("Identity", ["ctx2"], ["scan"]),
    ]
    return helper.make_graph(
        nodes,
        "body",
        [
            vi("i", I64, []),
            vi("c_in", BOOL, []),
            vi("step", I64, []),
            vi("tokens", I64, [1, None]),
            vi("hist", F32, [1, None, 4]),
        ],
        [
            vi("c_out", BOOL, []),
            vi("step_out", I64, []),
            vi("tokens_out", I64, [1, None]),
            vi("hist_out", F32, [1, None, 4]),
            vi("scan", F32, [1, 1, 4]),
        ],
        initializer=[
            _const("zero", 0),
            _const("one", 1),
            _const("ax0", [0]),
            _const("ax1", [1]),
            _const("one1", [1]),
            _const("zero1", [0]),
            _const("four1", [4]),
            _const("minus1", [-1]),
        ],
    )


def test_a_decoder_loop_grows_its_carried_tensors_by_one_step() -> None:
    """A while loop (condition from a captured limit) whose body sizes Range, Expand, Reshape
    (also with 0 and -1), ConstantOfShape and Tile from the carried step: tokens and history
    grow by one per iteration, and the body's sizes are bound anew each time."""
    loop = node(
        "Loop",
        ["M", "c0", "s0", "t0", "h0"],
        ["step", "tokens", "hist", "ctxs"],
        body=_decoder_body(),
    )
    m = _model(
        [loop],
        [
            vi("M", I64, []),
            vi("c0", BOOL, []),
            vi("s0", I64, []),
            vi("t0", I64, [1, "t"]),
            vi("h0", F32, [1, "t", 4]),
            vi("x", F32, [1, 1, 4]),
            vi("limit", I64, []),
        ],
        ["step", "tokens", "hist", "ctxs"],
    )
    shapes = _body_ops(load_onnx(m))  # type: ignore[arg-type]
    assert {k.split()[0] for k in shapes} == {
        "range",
        "expand",
        "reshape",
        "constant_of_shape",
        "tile",
    }
    # the sizes the graph tells stay fixed: only the step's axis is a run-time size
    assert re.fullmatch(r"\[1,expand\d+,4\]", shapes["expand Expand 'expand'"])
    assert re.fullmatch(r"\[1,reshape\d+,1\]", shapes["reshape Reshape 'weights'"])
    assert re.fullmatch(
        r"\[1,constant_of_shape\d+\]", shapes["constant_of_shape ConstantOfShape 'mask'"]
    )
    feed = {
        "M": np.array(100),
        "c0": np.array(True),
        "s0": np.array(0),
        "t0": np.array([[7]]),
        "h0": RNG.standard_normal((1, 1, 4)).astype(np.float32),
        "x": RNG.standard_normal((1, 1, 4)).astype(np.float32),
        "limit": np.array(9),
    }
    outs = check_everywhere(m, [feed, {**feed, "limit": np.array(3), "s0": np.array(1)}])
    assert [o[1].shape for o in outs] == [(1, 10), (1, 3)]


# -- each op sized by a captured value, and the same op in the model's own graph --------------------
_CASES: list[tuple[str, dict[str, object], np.ndarray, np.ndarray]] = [
    ("Range", {}, np.array([0, 5, 1]), np.zeros(0, np.float32)),
    ("Range", {}, np.array([5, 0, -2]), np.zeros(0, np.float32)),
    ("Range", {}, np.array([1, -4, 1]), np.zeros(0, np.float32)),  # empty
    ("Range", {}, np.array([2**63 - 4, 2**63 - 1, 1]), np.zeros(0, np.float32)),  # int64 top
    ("Range", {}, np.array([-(2**63) + 3, -(2**63), -1]), np.zeros(0, np.float32)),  # bottom
    ("Range", {}, np.array([0.5, 3.0, 0.75], np.float32), np.zeros(0, np.float32)),
    ("ConstantOfShape", {"value": helper.make_tensor("v", I64, [1], [3])}, np.array([2, 3]), None),
    ("ConstantOfShape", {}, np.array([0, 4]), None),
    ("Expand", {}, np.array([2, 1, 4]), RNG.standard_normal((3, 1)).astype(np.float32)),
    ("Expand", {}, np.array([3, 1]), RNG.standard_normal((3, 1)).astype(np.float32)),
    ("Expand", {}, np.array([1]), RNG.standard_normal((3, 2)).astype(np.float32)),
    ("Reshape", {}, np.array([0, -1]), RNG.standard_normal((2, 3, 4)).astype(np.float32)),
    ("Reshape", {}, np.array([4, -1, 2]), RNG.standard_normal((2, 3, 4)).astype(np.float32)),
    ("Reshape", {"allowzero": 1}, np.array([3, 0]), np.zeros((0, 3), np.float32)),
    ("Tile", {}, np.array([2, 1]), RNG.standard_normal((2, 3)).astype(np.float32)),
    ("Tile", {}, np.array([1, 0]), RNG.standard_normal((2, 3)).astype(np.float32)),
]


def _op_node(op: str, attrs: dict[str, object]) -> onnx.NodeProto:
    if op == "Range":
        return node("Range", ["a0", "a1", "a2"], ["y"], **attrs)
    if op == "ConstantOfShape":
        return node(op, ["sizes"], ["y"], **attrs)
    return node(op, ["x", "sizes"], ["y"], **attrs)


def _op_case(
    op: str, sizes: np.ndarray, x: np.ndarray | None
) -> tuple[list[onnx.ValueInfoProto], dict[str, np.ndarray]]:
    """The op's input declarations and feed (Range's bounds as three scalars)."""
    if op == "Range":
        t = helper.np_dtype_to_tensor_dtype(sizes.dtype)
        return [vi(f"a{j}", t, []) for j in range(3)], {
            f"a{j}": np.array(sizes[j]) for j in range(3)
        }
    ins = [vi("sizes", I64, [len(sizes)])]
    feed: dict[str, np.ndarray] = {"sizes": sizes}
    if x is not None:
        ins.append(vi("x", F32, list(x.shape)))
        feed["x"] = x
    return ins, feed


@pytest.mark.parametrize(("op", "attrs", "sizes", "x"), _CASES)
def test_an_op_sized_by_data_inside_a_loop(
    op: str, attrs: dict[str, object], sizes: np.ndarray, x: np.ndarray | None
) -> None:
    """The op in a Loop body (trip count from data, so not unrolled) with its sizes captured
    from the model's inputs: a Dynamic op; its result is the loop's scan output."""
    ins, feed = _op_case(op, sizes, x)
    body = helper.make_graph(
        [_op_node(op, attrs), node("Identity", ["c_in"], ["c_out"])],
        "body",
        [vi("i", I64, []), vi("c_in", BOOL, [])],
        [vi("c_out", BOOL, []), onnx.ValueInfoProto(name="y")],
    )
    m = _model([node("Loop", ["M", ""], ["ys"], body=body)], [vi("M", I64, []), *ins], ["ys"])
    assert op.lower().replace("constantofshape", "constant_of_shape") in _body_kinds(
        load_onnx(m)  # type: ignore[arg-type]
    )
    check_everywhere(m, [{**feed, "M": np.array(2)}])


@pytest.mark.parametrize(("op", "attrs", "sizes", "x"), _CASES)
def test_the_same_op_in_the_models_graph_loads_per_value(
    op: str, attrs: dict[str, object], sizes: np.ndarray, x: np.ndarray | None
) -> None:
    """In the model's own graph a size from an input is given its value: one fixed-size graph
    per distinct value (value specialization), no Dynamic op."""
    ins, feed = _op_case(op, sizes, x)
    m = _model([_op_node(op, attrs)], ins, ["y"])
    loaded = load_onnx(m)
    assert isinstance(loaded, ValueSpecializedModel)
    assert not loaded.specialize(feed).has_dynamic
    check_everywhere(m, [feed])


# -- bad values -------------------------------------------------------------------------------------
def _bad_loop(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    body = helper.make_graph(
        [*nodes, node("Identity", ["c_in"], ["c_out"])],
        "body",
        [vi("i", I64, []), vi("c_in", BOOL, [])],
        [vi("c_out", BOOL, []), onnx.ValueInfoProto(name="y")],
        initializer=inits,
    )
    inputs = [vi("M", I64, []), vi("x", F32, ["n"])]
    return _model([node("Loop", ["M", ""], ["ys"], body=body)], inputs, ["ys"])


_BAD = {
    "range_delta_zero": (
        [node("Range", ["zero", "five", "i"], ["y"], name="steps")],
        [_const("zero", 0), _const("five", 5)],
        r"Range 'steps': delta is zero",
    ),
    "reshape_count": (
        [
            node("Add", ["i", "one"], ["n"]),
            node("Unsqueeze", ["n", "ax0"], ["n1"]),
            node("Concat", ["n1", "three"], ["shape"], axis=0),
            node("Reshape", ["x", "shape"], ["y"], name="fold"),
        ],
        [_const("one", 1), _const("ax0", [0]), _const("three", [3])],
        r"Reshape 'fold': cannot reshape \[6\] \(6 elements\) to \[1, 3\]",
    ),
    "negative_size": (
        [
            node("Sub", ["i", "two"], ["n"]),
            node("Unsqueeze", ["n", "ax0"], ["shape"]),
            node("ConstantOfShape", ["shape"], ["y"], name="zeros"),
        ],
        [_const("two", 2), _const("ax0", [0])],
        r"ConstantOfShape 'zeros': the shape \[-2\] has a negative size",
    ),
}


@pytest.mark.parametrize("case", sorted(_BAD))
def test_a_bad_size_from_data_is_our_error_naming_the_node(case: str) -> None:
    nodes, inits, message = _BAD[case]
    m = _bad_loop(nodes, inits)
    feed = {"M": np.array(3), "x": np.arange(6, dtype=np.float32)}
    opts = ort.SessionOptions()  # its Reshape fusion would turn the Concat'ed shape into [-1, 3]
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    with pytest.raises(ORT_ERRORS):  # onnxruntime refuses it too
        sess.run(None, feed)
    loaded = load_onnx(m)
    assert isinstance(loaded, Graph)
    with pytest.raises(EvaluationError, match=message):
        evaluate(loaded, feed)
    with pytest.raises(EvaluationError, match=message):
        Device.cpu().prepare(loaded).eval(feed)


# -- Scan and If bodies, Trilu's k ------------------------------------------------------------------
def test_a_scan_body_sums_a_range_to_each_scanned_element() -> None:
    """Scan over n: per element t, sum(Range(0, t)) (a run-time size per step)."""
    body = helper.make_graph(
        [
            node("Range", ["zero", "t", "one"], ["r"], name="rng"),
            node("ReduceSum", ["r"], ["s"], keepdims=0),
            node("Add", ["acc", "s"], ["acc_out"]),
            node("Identity", ["s"], ["y"]),
        ],
        "body",
        [vi("acc", I64, []), vi("t", I64, [])],
        [vi("acc_out", I64, []), vi("y", I64, [])],
        initializer=[_const("zero", 0), _const("one", 1)],
    )
    scan = node("Scan", ["a0", "n"], ["acc", "ys"], body=body, num_scan_inputs=1)
    m = _model([scan], [vi("a0", I64, []), vi("n", I64, ["len"])], ["acc", "ys"])
    assert "range" in _body_kinds(load_onnx(m))  # type: ignore[arg-type]
    feeds = [{"a0": np.array(0), "n": np.array(n)} for n in ([3, 0, 5, 1], [7, 2])]
    check_everywhere(m, feeds)


def test_an_if_branch_sized_by_data() -> None:
    """If on data: the then branch is ConstantOfShape([n]) and Tile(x, [n]), the else branch
    Expand(x, [n, 1])'s row sums; the branches' sizes differ and come from the input n."""
    then_b = helper.make_graph(
        [
            node("Unsqueeze", ["n", "ax0"], ["n1"]),
            node("Tile", ["x", "n1"], ["t"], name="tile"),
            node("ConstantOfShape", ["n1"], ["ones"], value=helper.make_tensor("v", F32, [1], [1])),
            node("Concat", ["t", "ones"], ["out"], axis=0),
        ],
        "then",
        [],
        [onnx.ValueInfoProto(name="out")],
    )
    else_b = helper.make_graph(
        [
            node("Unsqueeze", ["n", "ax0"], ["n1"]),
            node("Concat", ["n1", "one1"], ["shape"], axis=0),
            node("Unsqueeze", ["x", "ax0"], ["xr"]),
            node("Expand", ["xr", "shape"], ["e"], name="expand"),
            node("ReduceSum", ["e", "ax1"], ["out"], keepdims=0),
        ],
        "else",
        [],
        [onnx.ValueInfoProto(name="out")],
    )
    nodes = [
        node("Greater", ["n", "three"], ["c"]),
        node("If", ["c"], ["y"], then_branch=then_b, else_branch=else_b),
    ]
    inits = [_const("ax0", [0]), _const("ax1", [1]), _const("one1", [1]), _const("three", 3)]
    m = _model(nodes, [vi("n", I64, []), vi("x", F32, ["k"])], ["y"], inits)
    assert {"tile", "constant_of_shape", "expand"} <= _body_kinds(load_onnx(m))  # type: ignore[arg-type]
    x = RNG.standard_normal(4).astype(np.float32)
    outs = check_everywhere(m, [{"n": np.array(5), "x": x}, {"n": np.array(2), "x": x}])
    assert [o[0].shape for o in outs] == [(25,), (2,)]


def test_trilu_with_k_from_data_loads_once() -> None:
    """Trilu's k does not decide sizes: from a model input or a Loop's iteration number it is
    compared at run time, without a load per value."""
    loop_body = helper.make_graph(
        [node("Trilu", ["x", "i"], ["y"], upper=1), node("Identity", ["c_in"], ["c_out"])],
        "body",
        [vi("i", I64, []), vi("c_in", BOOL, [])],
        [vi("c_out", BOOL, []), onnx.ValueInfoProto(name="y")],
    )
    nodes = [
        node("Trilu", ["x", "k"], ["low"], upper=0),
        node("Loop", ["M", ""], ["ups"], body=loop_body),
    ]
    m = _model(nodes, [vi("x", F32, [3, 4]), vi("k", I64, []), vi("M", I64, [])], ["low", "ups"])
    assert isinstance(load_onnx(m), Graph)
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    check_everywhere(m, [{"x": x, "k": np.array(k), "M": np.array(5)} for k in (-1, 0, 2, -7)])


def test_a_body_meeting_new_sizes_every_step_stops_planning_them() -> None:
    """40 steps of Range(0, i): each step is a binding never seen before. The CPU backend plans
    the first `max_bindings` per segment, then runs the small segment in NumPy
    (`kn_runtime.prepared.SMALL_SEGMENT_ELEMENTS`) instead of planning 40 sizes once each; the
    results stay onnxruntime's."""
    loop = node("Loop", ["M", "", "k0", "a0", "s0"], ["k", "acc", "seq"], body=_range_body("i"))
    m = _model(
        [loop],
        [vi("M", I64, []), vi("k0", I64, []), vi("a0", I64, [1]), vi("s0", I64, [0])],
        ["k", "acc", "seq"],
    )
    feed = {"M": np.array(40), "k0": np.array(0), "a0": np.array([0]), "s0": np.zeros(0, np.int64)}
    want = ort.InferenceSession(m.SerializeToString()).run(None, feed)
    prepared = Device.cpu(threads=1).prepare(load_onnx(m), max_bindings=3)
    for _ in range(2):
        for got, w in zip(prepared.eval(feed), want, strict=True):
            np.testing.assert_array_equal(got, w)
    builds = prepared._segment_builds  # segment graph id -> executors built
    assert builds and max(builds.values()) == 3 and prepared.cache.built == sum(builds.values())
