"""Misuse of the public API and the command-line tools: one clear error from our hierarchy (that
is also the builtin Python convention expects), never a traceback from inside; huge work is
refused or done cleverly, never a hang; a prepared graph may be shared between threads."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from kn_graph import DType, Graph, ReduceOp, Shape, Size, UnaryOp
from kn_graph.errors import (
    ArgumentTypeError,
    ArgumentValueError,
    EvaluationError,
    InputMismatchError,
)
from kn_graph.onnx import load_onnx
from kn_graph.reference import evaluate
from kn_runtime import Device
from kn_runtime.cli import default_model_path
from tests.paths import MODELS


def _graph() -> Graph:
    g = Graph()
    x = g.input(Shape.of(Size.sym("B"), 3), DType.F32, "x")
    g.add_output(g.relu(g.mul(x, 2.0)), "y")
    return g


# -- the Python API -----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [None, 3, "x"])
def test_eval_of_something_that_is_no_inputs_is_a_type_error(bad) -> None:
    prepared = Device.cpu().prepare(_graph())
    with pytest.raises(ArgumentTypeError, match="inputs"):
        prepared.eval(bad)
    with pytest.raises(TypeError):  # the builtin convention holds too
        prepared.eval(bad)


def test_a_ragged_nested_list_names_the_input() -> None:
    with pytest.raises(InputMismatchError, match="input 'x': not an array"):
        Device.cpu().prepare(_graph()).eval([[[1.0, 2.0, 3.0], [1.0]]])


@pytest.mark.parametrize(
    ("batch", "error"),
    [
        ("2", ArgumentTypeError),
        (2.5, ArgumentTypeError),
        (True, ArgumentTypeError),
        (-1, ArgumentValueError),
    ],
)
def test_prepare_checks_the_batch_size(batch, error) -> None:
    with pytest.raises(error, match="batch_size"):
        Device.cpu().prepare(_graph(), batch_size=batch)


def test_prepare_takes_a_model_path_bytes_or_proto_and_refuses_other_things() -> None:
    path = default_model_path()
    x = np.zeros((1, 3, 64, 64), np.float32)
    want = Device.cpu().prepare(load_onnx(path)).eval([x])[0]
    for source in (path, str(path), path.read_bytes(), onnx.load(path)):
        np.testing.assert_array_equal(Device.cpu().prepare(source).eval([x])[0], want)
    with pytest.raises(ArgumentTypeError, match="prepare: expected a Graph"):
        Device.cpu().prepare(3.5)


def test_device_cuda_index_must_be_an_int() -> None:
    with pytest.raises(ArgumentTypeError, match="index"):
        Device.cuda("0")  # type: ignore[arg-type]


def test_summing_a_huge_broadcast_is_instant_and_exact() -> None:
    # a ConstantOfShape of [2^20, 2^20] summed: the CPU executor reduces one copy per broadcast
    g = Graph()
    ones = g.full(1.0, [2**20, 2**20], DType.F32)
    g.add_output(g.reduce(ones, [0, 1], ReduceOp.SUM))
    g.add_output(g.reduce(g.full(3, [2**20, 2], DType.I64), [0], ReduceOp.MAX))
    g.add_output(g.reduce(g.full(2.0, [4, 3], DType.F64), [0], ReduceOp.PROD))
    total, top, prod = evaluate(g, [])
    assert total == np.float32(2.0**40)
    np.testing.assert_array_equal(top, [3, 3])
    np.testing.assert_array_equal(prod, [16.0, 16.0, 16.0])


def test_a_value_larger_than_memory_is_refused_before_allocating() -> None:
    g = Graph()
    big = g.add(g.full(1.0, [2**20, 2**20], DType.F32), g.full(2.0, [2**20, 2**20], DType.F32))
    g.add_output(g.reduce(big, [0, 1], ReduceOp.SUM))
    with pytest.raises(EvaluationError, match=r"needs 4\.1e\+03 GiB for this value, have"):
        evaluate(g, [])


def test_one_prepared_graph_evaluated_from_eight_threads_matches_sequential_calls() -> None:
    g = load_onnx(MODELS / "resnet_hw_dynamo.onnx")
    prepared = Device.cpu().prepare(g)
    rng = np.random.default_rng(0)
    feeds = [
        rng.standard_normal((1 + i % 2, 3, 32 + 8 * (i % 3), 40)).astype(np.float32)
        for i in range(8)
    ]
    want = [prepared.eval([x])[0] for x in feeds]
    got: list[np.ndarray | None] = [None] * 8
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(3):
                got[i] = prepared.eval([feeds[i]])[0]
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_value_specialized_model_is_shared_between_threads() -> None:
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
    m = helper.make_model(
        helper.make_graph(
            nodes,
            "g",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [12]),
                helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        ),
        opset_imports=[helper.make_opsetid("", 18)],
    )
    prepared = Device.cpu().prepare(load_onnx(m))
    x = np.arange(12, dtype=np.float32)
    shapes = [(3, 4), (4, 3), (2, 6), (6, 2)] * 2
    got: list[tuple[int, ...] | None] = [None] * 8

    def work(i: int) -> None:
        got[i] = prepared.eval([x, np.array(shapes[i])])[0].shape

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == shapes


# -- the command-line tools: one line, exit 2 -------------------------------------------------------
def _npy(tmp_path: Path, name: str, a: np.ndarray) -> str:
    p = tmp_path / name
    np.save(p, a)
    return str(p)


def _kn_run_cases(tmp_path: Path) -> list[list[str]]:
    (tmp_path / "folder").mkdir()
    (tmp_path / "bad.npy").write_text("not numpy")
    good = _npy(tmp_path, "x.npy", np.zeros((1, 3, 64, 64), np.float32))
    return [
        ["--input", f"input={tmp_path / 'missing.npy'}"],
        ["--input", f"input={tmp_path / 'bad.npy'}"],
        ["--input", f"input={tmp_path / 'folder'}"],
        ["--input", f"nosuch={good}"],
        ["--input", "noequals"],
        ["--input", f"input={good}", "--input", f"input={good}"],
        ["--dim", "seq=abc"],
        ["--dim", "nosuch=3"],
        ["--batch", "-1"],
        ["--batch", "99999999999"],
        ["--batch", "two"],
        ["--runs", "0", "--bench"],
        [str(tmp_path / "missing.onnx")],
        [str(tmp_path / "folder")],
        [str(tmp_path / "bad.npy")],
        ["--device", "tpu"],
        ["--no-such-flag"],
    ]


def test_kn_run_bad_invocations_print_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    from kn_runtime.cli import main

    for args in _kn_run_cases(tmp_path):
        try:
            code = main(args)
        except SystemExit as e:  # argparse's own errors
            code = e.code
        err = capsys.readouterr().err.strip()
        assert code == 2, (args, err)
        assert len(err.splitlines()) == 1 and err.startswith("kn-run: error:"), (args, err)


def test_kn_svg_bad_invocations_print_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    from kn_graph.svg import main

    model = str(MODELS / "resnet18_ts.onnx")
    (tmp_path / "folder").mkdir()
    cases = [
        [model, str(tmp_path / "nosuch" / "g.svg")],
        [model, str(tmp_path / "folder")],
        [model, str(tmp_path / "g.png")],
        [model, "/proc/g.dot"],
        [model, str(tmp_path / "g.svg"), "--batch", "x"],
        [model, str(tmp_path / "g.svg"), "--input", "nofile"],
        [str(tmp_path / "missing.onnx"), str(tmp_path / "g.svg")],
        [model],
    ]
    for args in cases:
        try:
            code = main(args)
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err.strip()
        assert code == 2, (args, err)
        assert len(err.splitlines()) == 1 and err.startswith("kn-svg: error:"), (args, err)
    assert main([model, str(tmp_path / "g.dot"), "--batch", "2"]) == 0
    assert "[2,3,64,64]" in (tmp_path / "g.dot").read_text()


def test_an_empty_iota_allocates_nothing_and_an_empty_argmax_is_our_error() -> None:
    g = Graph()
    n = Size.sym("n")
    x = g.input(Shape.of(2, n), DType.F32, "x")
    g.add_output(g.iota(Shape.of(0, 2**40), 1))  # 8 TiB of arange if it were built
    g.add_output(g.reduce(x, [1], ReduceOp.ARGMAX))
    with pytest.raises(EvaluationError, match=r"argmax over axis 1, which is empty"):
        evaluate(g, [np.zeros((2, 0), np.float32)])
    iota, arg = evaluate(g, [np.zeros((2, 3), np.float32)])
    assert iota.shape == (0, 2**40) and list(arg) == [0, 0]


def test_the_memory_check_counts_what_the_evaluation_already_holds(monkeypatch) -> None:
    import kn_graph.reference as cpu

    monkeypatch.setattr(cpu, "available_bytes", lambda: 3 * 4 * 1024)  # three 1k-float values
    g = Graph()
    x = g.input(Shape.of(1024), DType.F32, "x")
    a, b = g.exp(x), g.unary(UnaryOp.SIN, x)
    g.add_output(g.add(a, b))  # a, b and a + b live at once: 12 KiB
    evaluate(g, [np.zeros(1024, np.float32)])
    g.add_output(a)
    g.add_output(g.unary(UnaryOp.COS, b))  # a kept as an output: four at once
    with pytest.raises(EvaluationError, match=r"needs .* GiB for this value"):
        evaluate(g, [np.zeros(1024, np.float32)])
