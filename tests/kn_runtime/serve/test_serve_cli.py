"""`kn-serve`'s bad invocations: one line on stderr, status 2, before any engine starts."""

from __future__ import annotations

import pytest

from kn_runtime.serve.cli import main
from tests.paths import ROOT

TINY = str(ROOT / "kn_runtime" / "models" / "resnet_tiny.onnx")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["missing.onnx"], "model: 'missing.onnx' is not a file"),
        ([TINY, "--replicas", "0"], "--replicas: expected a positive integer, found 0"),
        ([TINY, "--max-batch-size", "-1"], "--max-batch-size: expected a positive integer"),
        ([TINY, "--engine", "flask"], "invalid choice: 'flask'"),
        (["export-triton", TINY, "out", "--instances", "0"], "--instances: expected a positive"),
        (["export-triton", TINY, "out", "--threads", "0"], "--threads: expected a positive"),
        (["export-triton", TINY, "out", "--batch-wait-ms", "-1"], "expected a wait >= 0"),
        ([TINY, "--engine", "triton", "--batch-wait-ms", "nan"], "expected a wait >= 0, found nan"),
        ([TINY, "--engine", "pytriton", "--replicas", "2"], "share one model in this process"),
        ([TINY, "--warmup", "seq"], "--warmup: expected SYMBOL=SIZE with a positive size"),
        ([TINY, "--warmup", "seq=0"], "found 'seq=0'"),
    ],
)
def test_bad_arguments_are_one_line_and_status_2(argv, words, capsys) -> None:
    if "invalid choice" in words:  # argparse's own check exits from inside the parser
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
    else:
        assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and err.startswith("kn-serve") and "\n" not in err


@pytest.mark.parametrize("engine", ["ray", "triton", "pytriton"])
@pytest.mark.parametrize(
    ("flags", "want"), [([], False), (["--warmup"], True), (["--warmup", "seq=128"], {"seq": 128})]
)
def test_warmup_reaches_the_engine(engine, flags, want, monkeypatch) -> None:
    """What `--warmup` says arrives as `serve_forever(warmup=...)` of the chosen engine."""
    from kn_runtime.serve import ray_serve, triton

    seen = {}
    for module in (ray_serve, triton):
        monkeypatch.setattr(module, "serve_forever", lambda *a, **kw: seen.update(kw))
    assert main([TINY, "--engine", engine, *flags]) == 0
    assert seen["warmup"] == want
    if engine != "ray":  # triton: inside the server; pytriton: bound in this process
        assert seen["in_process"] is (engine == "pytriton")


def test_export_writes_the_flags_into_the_repository(tmp_path) -> None:
    """`kn-serve export-triton`'s wait, threads and warm-up land in config.pbtxt."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    argv = ["export-triton", TINY, str(tmp_path), "--threads", "2", "--batch-wait-ms", "0.5"]
    assert main([*argv, "--warmup", "seq=64"]) == 0
    text = (tmp_path / "kyanite" / "config.pbtxt").read_text()
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert (params["kyanite_threads"], params["kyanite_warmup"]) == ("2", "seq=64")
