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


@pytest.mark.parametrize("engine", ["ray", "triton"])
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
