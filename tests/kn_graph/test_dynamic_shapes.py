"""Dynamic shapes as real exports use them: size expressions through the loader, guards (each
kind fires with a clear error), unnamed and expression dims, symbol unification, shape-deciding
inputs through the public API, and KV-cache greedy decoding against onnxruntime's tokens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from kn_cuda_eval import emulate, plan
from kn_graph import Shape, ShapeMismatchError, Size
from kn_graph.binding import bind_inputs
from kn_graph.errors import InputMismatchError, KnError, StaticInputRequiredError
from kn_graph.onnx import ValueSpecializedModel, load_onnx
from kn_graph.optimizer import optimize
from kn_graph.reference import evaluate
from kn_runtime import Device
from tests.paths import MODELS

FIXTURES = {f["name"]: f for f in json.loads((MODELS / "manifest.json").read_text())["fixtures"]}
F = TensorProto.FLOAT
I64 = TensorProto.INT64


def model(nodes, inputs, outputs, inits=(), opset=18) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def vi(name, elem, dims):
    return helper.make_tensor_value_info(name, elem, dims)


def i64(name, values):
    return helper.make_tensor(name, I64, [len(values)], values)


# -- sizes through the loader ----------------------------------------------------------------------
def test_strided_conv_on_a_dynamic_image_prints_its_size_formula() -> None:
    w = helper.make_tensor("w", F, [4, 3, 3, 3], np.ones(108, np.float32).tolist())
    conv = helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])
    g = load_onnx(model([conv], [vi("x", F, ["N", 3, "height", "width"])], [vi("y", F, None)], [w]))
    assert str(g[g.outputs[0]].shape) == "[B,4,(height+1)//2,(width+1)//2]"
    x = np.random.default_rng(0).normal(size=(2, 3, 7, 10)).astype(np.float32)
    (y,) = evaluate(g, [x])
    assert y.shape == (2, 4, 4, 5)


def test_unnamed_dims_become_symbols_named_after_input_and_axis() -> None:
    relu = helper.make_node("Relu", ["x"], ["y"])
    x = vi("x", F, [None, 3])
    x.type.tensor_type.shape.dim[0].dim_param = "?"
    z = vi("z", F, [2, 0])
    z.type.tensor_type.shape.dim[1].Clear()  # neither a value nor a name
    add = helper.make_node("Relu", ["z"], ["w"])
    g = load_onnx(model([relu, add], [x, z], [vi("y", F, None), vi("w", F, None)]))
    assert [str(g[v].shape) for v in g.inputs] == ["[x_0,3]", "[2,z_1]"]
    ys = evaluate(g, [np.ones((5, 3), np.float32), np.ones((2, 4), np.float32)])
    assert [y.shape for y in ys] == [(5, 3), (2, 4)]


def test_dim_param_expressions_are_parsed() -> None:
    add = helper.make_node("Add", ["a", "b"], ["c"])
    g = load_onnx(
        model(
            [add],
            [vi("a", F, ["batch", "past + 1"]), vi("b", F, ["batch", "past+1"])],
            [vi("c", F, None)],
        )
    )
    assert str(g[g.outputs[0]].shape) == "[B,past+1]"
    prepared = Device.cpu().prepare(g)
    assert prepared.check_inputs([np.ones((2, 4), np.float32)] * 2) == {"B": 2, "past": 3}


def test_slice_to_the_end_sentinel_clamps_to_a_symbolic_axis() -> None:
    nodes = [helper.make_node("Slice", ["x", "starts", "ends", "axes"], ["y"])]
    inits = [i64("starts", [1]), i64("ends", [10**9]), i64("axes", [1])]
    g = load_onnx(model(nodes, [vi("x", F, [2, "seq"])], [vi("y", F, None)], inits))
    assert g[g.outputs[0]].shape == Shape.of(2, Size.sym("seq") - 1)
    x = np.arange(14, dtype=np.float32).reshape(2, 7)
    np.testing.assert_array_equal(evaluate(g, [x])[0], x[:, 1:])


def test_range_to_a_computed_size_plus_one_keeps_a_symbolic_length() -> None:
    # Range(0, past + 1) as a KV-cache mask is built; the limit is shape arithmetic
    nodes = [
        helper.make_node("Shape", ["k"], ["s"], start=2, end=3),
        helper.make_node("Squeeze", ["s"], ["past"]),
        helper.make_node("Add", ["past", "one"], ["n"]),
        helper.make_node("Range", ["zero", "n", "one"], ["r"]),
    ]
    inits = [helper.make_tensor("zero", I64, [], [0]), helper.make_tensor("one", I64, [], [1])]
    g = load_onnx(model(nodes, [vi("k", F, [1, 2, "past", 4])], [vi("r", I64, None)], inits))
    assert str(g[g.outputs[0]].shape) == "[past+1]"
    (r,) = evaluate(g, [np.zeros((1, 2, 5, 4), np.float32)])
    np.testing.assert_array_equal(r, np.arange(6))


def test_tile_with_symbolic_repeats() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], start=0, end=1),
        helper.make_node("Concat", ["s", "ones"], ["reps"], axis=0),
        helper.make_node("Tile", ["t", "reps"], ["y"]),
    ]
    inits = [i64("ones", [1, 1]), helper.make_tensor("t", F, [1, 2, 3], list(range(6)))]
    g = load_onnx(model(nodes, [vi("x", F, ["batch", 5])], [vi("y", F, None)], inits))
    assert str(g[g.outputs[0]].shape) == "[B,2,3]"
    (y,) = evaluate(g, [np.zeros((4, 5), np.float32)])
    np.testing.assert_array_equal(
        y, np.tile(np.arange(6, dtype=np.float32).reshape(1, 2, 3), (4, 1, 1))
    )


def test_reflect_pad_on_a_symbolic_length() -> None:
    nodes = [helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")]
    g = load_onnx(
        model(nodes, [vi("x", F, [1, "n"])], [vi("y", F, None)], [i64("pads", [0, 2, 0, 3])])
    )
    assert str(g[g.outputs[0]].shape) == "[1,n+5]"
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    np.testing.assert_array_equal(evaluate(g, [x])[0], np.pad(x, ((0, 0), (2, 3)), "reflect"))
    with pytest.raises(InputMismatchError, match=r"pad \(reflect\).*n >= 4.*n=3"):
        evaluate(g, [x[:, :3]])


# -- guards: each kind fires with the input, axis and condition --------------------------------------
def test_guard_nonnegative_size_conv_kernel_larger_than_input() -> None:
    w = helper.make_tensor("w", F, [1, 1, 5], [1.0] * 5)
    conv = helper.make_node("Conv", ["x", "w"], ["y"])
    g = load_onnx(model([conv], [vi("x", F, [1, 1, "samples"])], [vi("y", F, None)], [w]))
    assert str(g[g.outputs[0]].shape) == "[1,1,samples-4]"
    assert evaluate(g, [np.ones((1, 1, 5), np.float32)])[0].shape == (1, 1, 1)
    with pytest.raises(
        InputMismatchError, match=r"node 'Conv#0' \(Conv\).*samples=3 \(input 'x', axis 2\)"
    ):
        evaluate(g, [np.ones((1, 1, 3), np.float32)])


def test_guard_nonnegative_size_of_a_computed_length() -> None:
    from kn_graph import DType, Graph

    g = Graph()
    n = Size.sym("n")
    x = g.input(Shape.of(n), DType.F32, "x")
    g.add_output(g.slice_raw(x, 0, 0, 1, n - 3))  # the first n - 3 elements
    assert [str(gd) for gd in g.guards] == ["n >= 3"]
    np.testing.assert_array_equal(evaluate(g, [np.arange(5, dtype=np.float32)])[0], [0, 1])
    with pytest.raises(
        InputMismatchError, match=r"must not be negative.*n=2 \(input 'x', axis 0\)"
    ):
        evaluate(g, [np.arange(2, dtype=np.float32)])


def test_guard_divisibility_of_an_inferred_reshape_dim() -> None:
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
    g = load_onnx(model(nodes, [vi("x", F, ["n"])], [vi("y", F, None)], [i64("shape", [-1, 4])]))
    assert str(g[g.outputs[0]].shape) == "[n//4,4]"
    assert evaluate(g, [np.zeros(8, np.float32)])[0].shape == (2, 4)
    with pytest.raises(InputMismatchError, match=r"must divide by 4.*n=10 \(input 'x', axis 0\)"):
        evaluate(g, [np.zeros(10, np.float32)])
    p = plan(g, bindings={"n": 12})  # the planner checks the guards too
    with pytest.raises(ShapeMismatchError, match="must divide by 4"):
        plan(g, bindings={"n": 13})
    assert emulate(p, [np.zeros(12, np.float32)])[0].shape == (3, 4)


def test_guard_equality_of_sizes_that_are_not_plain_symbols() -> None:
    # a YOLO-style FPN: an upsampled h/4 feature concatenated with an h/2 feature
    nodes = [
        helper.make_node("MaxPool", ["x"], ["p2"], kernel_shape=[2], strides=[2]),
        helper.make_node("MaxPool", ["p2"], ["p4"], kernel_shape=[2], strides=[2]),
        helper.make_node("Resize", ["p4", "", "scales"], ["u"], mode="nearest"),
        helper.make_node("Concat", ["u", "p2"], ["y"], axis=1),
    ]
    scales = helper.make_tensor("scales", F, [3], [1.0, 1.0, 2.0])
    g = load_onnx(model(nodes, [vi("x", F, [1, 1, "h"])], [vi("y", F, None)], [scales]))
    guards = [str(gd) for gd in g.guards]
    assert "2*(h//4) == h//2" in guards
    x = np.random.default_rng(1).normal(size=(1, 1, 16)).astype(np.float32)
    p2 = x.reshape(1, 1, 8, 2).max(-1)
    up = np.repeat(p2.reshape(1, 1, 4, 2).max(-1), 2, axis=-1)
    np.testing.assert_allclose(evaluate(g, [x])[0], np.concatenate([up, p2], 1))
    with pytest.raises(InputMismatchError, match=r"Concat.*2\*\(h//4\) == h//2.*h=6"):
        evaluate(g, [x[:, :, :6]])


def test_unified_symbols_are_checked_at_binding() -> None:
    # the exporter named one length twice: seq and s34 are unified into one symbol
    add = helper.make_node("Add", ["a", "b"], ["c"])
    g = load_onnx(
        model([add], [vi("a", F, ["batch", "seq"]), vi("b", F, ["s33", "s34"])], [vi("c", F, None)])
    )
    assert [str(g[v].shape) for v in g.inputs] == ["[B,seq]", "[B,seq]"]
    a = np.ones((2, 5), np.float32)
    np.testing.assert_array_equal(evaluate(g, [a, a])[0], a + a)
    with pytest.raises(InputMismatchError, match=r"input 'b', axis 1: expected size seq = 5"):
        evaluate(g, [a, np.ones((2, 4), np.float32)])


def test_guarded_slice_of_a_position_table_refuses_a_too_long_sequence() -> None:
    # pos[:, :seq] of a 4-row table: the sequence may not exceed the table (no NaN rows)
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], start=1, end=2),
        helper.make_node("Slice", ["pos", "zero", "s", "one"], ["p"]),
        helper.make_node("Add", ["x", "p"], ["y"]),
    ]
    inits = [
        helper.make_tensor("pos", F, [1, 4], [0.0, 1.0, 2.0, 3.0]),
        i64("zero", [0]),
        i64("one", [1]),
    ]
    g = load_onnx(model(nodes, [vi("x", F, [1, "seq"])], [vi("y", F, None)], inits))
    np.testing.assert_array_equal(evaluate(g, [np.zeros((1, 3), np.float32)])[0], [[0, 1, 2]])
    with pytest.raises(InputMismatchError, match=r"4 >= seq.*seq=5"):
        evaluate(g, [np.zeros((1, 5), np.float32)])
    with pytest.raises(ShapeMismatchError, match=r"4 >= seq"):
        plan(optimize(g), bindings={"seq": 5})


# -- inputs that decide shapes ----------------------------------------------------------------------
def _value_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Tile", ["r", "reps"], ["y"]),
    ]
    return model(
        nodes,
        [vi("x", F, ["n"]), vi("shape", I64, [2]), vi("reps", I64, [2])],
        [vi("y", F, None)],
    )


def test_shape_inputs_work_through_prepare_without_naming_their_values() -> None:
    loaded = load_onnx(_value_model())
    assert isinstance(loaded, ValueSpecializedModel)
    prepared = Device.cpu().prepare(loaded)
    x = np.arange(6, dtype=np.float32)
    for shape, reps in (([2, 3], [1, 2]), ([3, -1], [2, 1]), ([2, 3], [1, 2])):
        (y,) = prepared.eval([x, np.array(shape), np.array(reps)])
        np.testing.assert_array_equal(y, np.tile(x.reshape(shape), reps))
    used = prepared._specializing.model  # type: ignore[union-attr]  # prepare's optimizing copy
    assert used.optimizations and used.value_inputs == ["shape", "reps"]
    assert len(used._cache) == 2  # one graph per distinct value, the repeat was cached


def test_static_loading_still_names_the_input() -> None:
    with pytest.raises(StaticInputRequiredError, match="'shape'"):
        load_onnx(_value_model(), static=True)


def test_a_bad_shape_input_value_is_one_clear_error() -> None:
    prepared = Device.cpu().prepare(load_onnx(_value_model()))
    x = np.arange(6, dtype=np.float32)
    with pytest.raises(KnError, match="Reshape"):
        prepared.eval([x, np.array([4, -1]), np.array([1, 1])])
    with pytest.raises(KnError, match="Tile"):
        prepared.eval([x, np.array([2, 3]), np.array([1, -2])])


def test_kn_run_runs_a_model_with_shape_inputs(tmp_path: Path) -> None:
    from kn_runtime.cli import main

    path = tmp_path / "m.onnx"
    onnx.save(_value_model(), path)
    np.save(tmp_path / "shape.npy", np.array([3, 2]))
    np.save(tmp_path / "reps.npy", np.array([1, 1]))
    np.save(tmp_path / "x.npy", np.arange(6, dtype=np.float32))
    args = [str(path), "--no-optimize"]
    for n in ("x", "shape", "reps"):
        args += ["--input", f"{n}={tmp_path / (n + '.npy')}"]
    assert main(args) == 0


# -- KV-cache decoding ------------------------------------------------------------------------------
def _greedy(step, fx: dict, prompt: np.ndarray, n_steps: int) -> np.ndarray:
    data = {i: fx["input_dims"][i] for i in fx["input_names"]}
    heads, head_dim = data["past_key_0"][1], data["past_key_0"][3]
    b = prompt.shape[0]
    past = {n: np.zeros((b, heads, 0, head_dim), np.float32) for n in fx["input_names"][2:]}
    ids, tokens = prompt, []
    for _ in range(n_steps):
        length = next(iter(past.values())).shape[2]
        feed = {"input_ids": ids, "attention_mask": np.ones((b, length + 1), np.int64), **past}
        outs = dict(zip(fx["output_names"], step(feed), strict=True))
        ids = np.argmax(outs["logits"][:, -1, :], axis=-1).astype(np.int64).reshape(b, 1)
        tokens.append(ids[:, 0])
        past = {n: outs[n.replace("past", "present")] for n in past}
    return np.stack(tokens, axis=1)


@pytest.mark.parametrize("device", ["cpu", "emulated"])
def test_kv_cache_greedy_decode_matches_onnxruntime_token_for_token(device: str) -> None:
    fx = FIXTURES["kv_llm_dynamo"]
    graph = load_onnx(MODELS / fx["file"])  # once, for every past length
    assert str(graph[graph.inputs[1]].shape) == "[B,past+1]"
    ref = np.load(MODELS / fx["reference"])
    want = ref["greedy:tokens"]
    if device == "cpu":
        prepared = Device.cpu().prepare(graph)

        def step(feed):
            return prepared.eval(feed)
    else:
        opt = optimize(graph)

        def step(feed):
            arrays, binds = bind_inputs(opt, feed)
            return emulate(plan(opt, bindings=binds), arrays)

    got = _greedy(step, fx, ref["greedy:prompt"], want.shape[1])
    assert want.shape[1] >= 8
    np.testing.assert_array_equal(got, want)


# -- what only fixed sizes allow: loaded per input shape ----------------------------------------------
def _resize_model() -> onnx.ModelProto:
    """Nearest Resize by 1.5 of symbolic H and W: which source pixel each output pixel takes
    depends on the size, not an integer repetition (LSTMs over a symbolic length were the
    example here until they became a recurrent step)."""
    scales = helper.make_tensor("scales", F, [4], [1.0, 1.0, 1.5, 1.5])
    resize = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")
    return model([resize], [vi("x", F, ["batch", 2, "h", "w"])], [vi("y", F, None)], [scales])


def test_a_fractional_resize_of_symbolic_sizes_runs_per_shape_and_matches_onnxruntime() -> None:
    import onnxruntime as ort

    m = _resize_model()
    loaded = load_onnx(m)
    assert isinstance(loaded, ValueSpecializedModel) and loaded.by_shape
    with pytest.raises(KnError, match=r"symbolic axis 2 \(h -> h\+h//2\)"):
        load_onnx(m, static=True)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    prepared = Device.cpu().prepare(loaded)
    rng = np.random.default_rng(4)
    for shape in ((1, 2, 5, 3), (2, 2, 4, 7)):
        x = rng.normal(size=shape).astype(np.float32)
        (want,) = sess.run(None, {"x": x})
        np.testing.assert_array_equal(prepared.eval([x])[0], want)


def test_kn_run_makes_up_inputs_for_a_model_loaded_per_shape(tmp_path: Path, capsys) -> None:
    from kn_runtime.cli import main

    path = tmp_path / "resize.onnx"
    onnx.save(_resize_model(), path)
    assert main([str(path), "--dim", "h=4", "--dim", "w=6", "--batch", "2"]) == 0
    assert "f32[2, 2, 6, 9]" in capsys.readouterr().out
