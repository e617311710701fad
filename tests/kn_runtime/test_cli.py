"""kn-run: the embedded default model, given models and inputs, and clean one-line errors."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kn_graph.onnx import load_onnx
from kn_graph.reference import evaluate
from kn_runtime.cli import default_model_path, main, random_inputs
from tests.paths import MODELS

TIMES = re.compile(
    r"^prepare: (?P<prepare>\d+\.\d+) ms\n"
    r"first evaluation: (?P<first>\d+\.\d+) ms(?P<note>.*)\n"
    r"time per evaluation: (?P<steady>\d+\.\d+) ms \(median of (?P<n>\d+) after the first\)$",
    re.MULTILINE,
)


def printed_times(out: str) -> dict[str, str]:
    """The three timing lines of a kn-run printout (prepare, first, steady state), parsed."""
    m = TIMES.search(out)
    assert m is not None, out
    for k in ("prepare", "first", "steady"):
        float(m[k])
    return m.groupdict()


def test_default_model_ships_in_the_package() -> None:
    assert default_model_path().is_file()


def test_kn_run_default_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "resnet_tiny.onnx" in out and "output logits: f32[1, 10]" in out
    t = printed_times(out)  # planning and compilation are prepare's: the first call only runs
    assert t["note"] == "" and 1 <= int(t["n"]) <= 5


def test_kn_run_checksum_matches_direct_evaluation(capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(default_model_path()), "--batch", "2", "--no-optimize", "--device", "cpu-reference"]
    assert main(args) == 0  # the reference executor: another sum may differ in the 6th digit
    out = capsys.readouterr().out
    g = load_onnx(default_model_path())
    y = evaluate(g, random_inputs(g, {"B": 2}))[0]
    assert f"sum={float(np.sum(y.astype(np.float64))):.6g}" in out


def test_kn_run_given_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = np.zeros((3, 3, 64, 64), np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main([str(MODELS / "resnet18_ts.onnx"), "--input", f"input={tmp_path / 'x.npy'}"]) == 0
    assert "output logits: f32[3, 10]" in capsys.readouterr().out


def test_kn_run_bench(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--bench", "--runs", "2"]) == 0
    assert printed_times(capsys.readouterr().out)["n"] == "2"


def test_kn_run_times_on_the_reference_executor(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--device", "cpu-reference", "--batch", "2", "--bench", "--runs", "3"]) == 0
    assert printed_times(capsys.readouterr().out)["n"] == "3"


def test_kn_run_first_evaluation_plans_when_sizes_are_bound_per_call(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [str(MODELS / "resnet_hw_dynamo.onnx"), "--dim", "height=32", "--dim", "width=32"]
    assert main([*args, "--no-check"]) == 0
    t = printed_times(capsys.readouterr().out)
    assert "planned for this binding: height, width bound per call" in t["note"]


def test_kn_run_missing_model_is_one_clean_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["/no/such/model.onnx"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kn-run: error: cannot read ONNX model") and "\n" not in err


def test_kn_run_wrong_input_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 32, 32), np.float32))
    assert main(["--input", f"input={tmp_path / 'x.npy'}"]) == 2
    assert "input 'input', axis 2" in capsys.readouterr().err
