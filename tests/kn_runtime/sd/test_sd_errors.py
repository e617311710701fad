"""Bad input to `kn-sd` ends with exactly one line on stderr (`kn-sd: error: ...`) and status 2,
never a traceback: missing folders and files, models that are not what the layout says, empty
prompts, step counts and sizes that cannot work."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from kn_runtime.sd import TINY_SD, cli
from kn_runtime.sd.cli import main
from kn_runtime.sd.pipeline import ModelFolder, PipelineError, Settings


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A private copy of the tiny pipeline to break."""
    dst = tmp_path / "sd"
    shutil.copytree(TINY_SD, dst)
    return dst


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], match: str) -> str:
    rc = main([*argv, "--no-progress", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kn-sd: error: "), err
    assert match in lines[0], lines[0]
    return lines[0]


def identity_model(path: Path, inputs: list[tuple[str, int, list[int | str]]]) -> None:
    """A valid ONNX model with the given inputs (the first one is passed through)."""
    ins = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs]
    out = helper.make_tensor_value_info("y", inputs[0][1], inputs[0][2])
    g = helper.make_graph([helper.make_node("Identity", [inputs[0][0]], ["y"])], "g", ins, [out])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_missing_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    one_line_error(capsys, ["a cat", "--model", str(tmp_path / "nowhere")], "does not exist")


def test_missing_unet_file(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    (folder / "unet" / "model.onnx").unlink()
    one_line_error(capsys, ["a cat", "--model", str(folder)], "lacks unet/model.onnx")


def test_missing_external_data(
    capsys: pytest.CaptureFixture[str], folder: Path, tmp_path: Path
) -> None:
    (folder / "unet" / "model.onnx_data").unlink()
    one_line_error(
        capsys,
        ["a cat", "--model", str(folder), "--steps", "1", "--out", str(tmp_path)],
        "model.onnx_data",
    )


def test_missing_tokenizer_files(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    (folder / "tokenizer" / "merges.txt").unlink()
    one_line_error(
        capsys,
        ["a cat", "--model", str(folder)],
        "neither vocab.json + merges.txt nor tokenizer.json",
    )


def test_not_an_onnx_file(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    (folder / "vae_decoder" / "model.onnx").write_bytes(b"\x00garbage" * 10)
    one_line_error(capsys, ["a cat", "--model", str(folder)], "vae_decoder")


def test_unet_with_wrong_inputs(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    identity_model(
        folder / "unet" / "model.onnx", [("pixel_values", TensorProto.FLOAT, [1, 3, 224, 224])]
    )
    line = one_line_error(capsys, ["a cat", "--model", str(folder)], "not a Stable Diffusion UNet")
    assert "pixel_values: float32[1,3,224,224]" in line


def test_unet_with_wrong_ranks(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    identity_model(
        folder / "unet" / "model.onnx",
        [
            ("sample", TensorProto.FLOAT, ["b", 4, "h", "w"]),
            ("timestep", TensorProto.INT64, ["b", 2]),
            ("encoder_hidden_states", TensorProto.FLOAT, ["b", 16, 32]),
        ],
    )
    one_line_error(
        capsys, ["a cat", "--model", str(folder)], "'timestep' is not a numeric scalar or vector"
    )


def test_unet_with_wrong_channels(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    identity_model(
        folder / "unet" / "model.onnx",
        [
            ("sample", TensorProto.FLOAT, ["b", 9, "h", "w"]),
            ("timestep", TensorProto.INT64, []),
            ("encoder_hidden_states", TensorProto.FLOAT, ["b", 16, 32]),
        ],
    )
    one_line_error(capsys, ["a cat", "--model", str(folder)], "9 channels")


def test_hidden_size_mismatch(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    identity_model(
        folder / "unet" / "model.onnx",
        [
            ("sample", TensorProto.FLOAT, ["b", 4, "h", "w"]),
            ("timestep", TensorProto.INT64, []),
            ("encoder_hidden_states", TensorProto.FLOAT, ["b", 16, 768]),
        ],
    )
    identity_model(
        folder / "text_encoder" / "model.onnx", [("input_ids", TensorProto.INT32, ["b", 16])]
    )
    m = onnx.load(str(folder / "text_encoder" / "model.onnx"))  # give it a [b, 16, 32] output
    m.graph.output[0].CopyFrom(
        helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["b", 16, 32])
    )
    m.graph.node[0].output[0] = "last_hidden_state"
    onnx.save(m, str(folder / "text_encoder" / "model.onnx"))
    one_line_error(
        capsys,
        ["a cat", "--model", str(folder)],
        "hidden size 32 is not the UNet's cross-attention size 768",
    )


@pytest.fixture
def no_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if kn-sd gets as far as making an executor: bad arguments must be caught
    before any model is loaded, let alone a whole generation run."""

    def refuse(*args: object) -> None:
        raise AssertionError("kn-sd made an executor for a bad invocation")

    monkeypatch.setattr(cli, "make_executor", refuse)


BAD_INVOCATIONS = {
    "png suffix": (["--png", "{tmp}/x.onnx"], "the file name must end in .png"),
    "png no suffix": (["--png", "{tmp}/x"], "the file name must end in .png"),
    "png is a folder": (["--png", "{tmp}/dir.png"], "is a folder"),
    "png folder missing": (["--png", "{tmp}/no/such/x.png"], "does not exist"),
    "png folder is a file": (["--png", "{tmp}/file/x.png"], "is not a folder"),
    "out is a file": (["--out", "{tmp}/file"], "--out {tmp}/file is not a folder"),
    "out under a file": (["--out", "{tmp}/file/sub"], "cannot create the output folder"),
    "steps zero": (["--steps", "0"], "argument --steps: must be an integer >= 1, found 0"),
    "steps negative": (["--steps", "-5"], "argument --steps: must be an integer >= 1"),
    "steps not a number": (["--steps", "many"], "argument --steps: expected an integer"),
    "steps too many": (["--steps", "1001"], "steps must be >= 1 and <= 1000, found 1001"),
    "height zero": (["--height", "0"], "argument --height: must be an integer >= 1"),
    "width negative": (["--width", "-8"], "argument --width: must be an integer >= 1"),
    "height odd": (["--height", "33"], "multiples of 4 (the VAE factor 2 x the UNet's 2)"),
    "width off the unet grid": (["--width", "34"], "found 32x34"),
    "seed negative": (["--seed", "-1"], "argument --seed: must be an integer >= 0"),
    "scaling factor": (["--scaling-factor", "0"], "argument --scaling-factor: must be > 0"),
    "guidance nan": (["--guidance-scale", "nan"], "must be a finite number >= 0"),
    "guidance text": (["--guidance-scale", "high"], "argument --guidance-scale: invalid float"),
    "scheduler": (["--scheduler", "euler"], "argument --scheduler: invalid choice: 'euler'"),
    "unknown option": (["--bogus"], "unrecognized arguments: --bogus"),
    "model missing": (["--model", "{tmp}/nowhere"], "model folder {tmp}/nowhere does not exist"),
    "model is a file": (["--model", "{tmp}/file"], "model folder {tmp}/file is not a folder"),
    "model layout": (["--model", "{tmp}"], "lacks text_encoder/model.onnx"),
}


@pytest.mark.parametrize("case", list(BAD_INVOCATIONS))
@pytest.mark.usefixtures("no_models")
def test_bad_invocation_is_one_line_before_any_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str
) -> None:
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "dir.png").mkdir()
    argv, match = BAD_INVOCATIONS[case]
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    one_line_error(capsys, ["a cat", *argv], match.replace("{tmp}", str(tmp_path)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.png", "file"]  # nothing written


@pytest.mark.parametrize("prompt", ["", "   \n\t"])
@pytest.mark.usefixtures("no_models")
def test_empty_prompt(capsys: pytest.CaptureFixture[str], prompt: str) -> None:
    one_line_error(capsys, [prompt], "the prompt is empty")


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        (Settings("a cat", steps=0), "steps must be >= 1"),
        (Settings("a cat", seed=-1), "the seed must be >= 0"),
        (Settings(" "), "the prompt is empty"),
        (Settings("a cat", height=-4), "positive multiples of 4"),
        (Settings("a cat", scaling_factor=0.0), "the scaling factor must be > 0"),
        (Settings("a cat", guidance_scale=float("inf")), "guidance scale"),
    ],
)
def test_library_checks_settings(settings: Settings, match: str) -> None:
    with pytest.raises(PipelineError, match=match):
        ModelFolder(TINY_SD).check(settings)


def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0 and "usage: kn-sd" in capsys.readouterr().out


def test_cuda_without_a_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    from kn_runtime import Device

    try:
        Device.cuda()
    except Exception:
        rc = main(["a cat", "--device", "cuda", "--no-progress"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and err[0].startswith("kn-sd: error: CUDA device 0")
    else:
        pytest.skip("a CUDA device is present")


def test_onnxruntime_executor_load_error(
    capsys: pytest.CaptureFixture[str], folder: Path, tmp_path: Path
) -> None:
    (folder / "unet" / "model.onnx_data").write_bytes(b"short")
    argv = ["a cat", "--model", str(folder), "--steps", "1", "--out", str(tmp_path)]
    one_line_error(capsys, [*argv, "--executor", "onnxruntime"], "onnxruntime cannot load")
    one_line_error(capsys, argv, "model.onnx_data")


def test_bad_configs(capsys: pytest.CaptureFixture[str], folder: Path) -> None:
    cfg = folder / "scheduler" / "scheduler_config.json"
    cfg.write_text('{"prediction_type": "v_prediction"}')
    one_line_error(capsys, ["a cat", "--model", str(folder)], "prediction_type 'v_prediction'")
    cfg.write_text("{}")
    (folder / "vae_decoder" / "config.json").write_text('{"block_out_channels": 5}')
    one_line_error(capsys, ["a cat", "--model", str(folder)], "unusable config.json value")
    (folder / "vae_decoder" / "config.json").write_text("[1, 2")
    one_line_error(capsys, ["a cat", "--model", str(folder)], "is not valid JSON")
