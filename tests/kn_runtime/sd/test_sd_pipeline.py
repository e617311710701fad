"""The tiny shipped pipeline end to end: Kyanite's CPU executor and onnxruntime run through the
same pipeline code (prompt, negative prompt, guidance, scheduler, VAE) from the same seed, and the
decoded images must agree to f32 tolerance; the CLI writes the PNG, the per-step files and the
per-stage timings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kn_runtime import Device
from kn_runtime.sd import TINY_SD
from kn_runtime.sd.cli import main
from kn_runtime.sd.executors import KyaniteExecutor, OnnxruntimeExecutor
from kn_runtime.sd.pipeline import GenerationResult, Settings, StableDiffusion

pytest.importorskip("onnxruntime")

PROMPT = "a photograph of an astronaut riding a horse on mars"
# ids from transformers' CLIPTokenizer on the shipped vocabulary, padded to 16
PROMPT_IDS = [912, 320, 586, 327, 524, 530, 716, 81, 891, 320, 888, 519, 76, 703, 913, 913]
NEGATIVE_IDS = {
    "pndm": [912, 734, 267, 545, 342, 643, 682, *[913] * 9],  # "blurry, low quality"
    "ddim": [912, *[913] * 15],  # ""
}
RUNS = {
    "pndm": Settings(PROMPT, negative_prompt="blurry, low quality", steps=4, seed=3),
    "ddim": Settings(PROMPT, steps=3, seed=5, scheduler="ddim", guidance_scale=5.0),
}


@pytest.fixture(scope="module")
def results() -> dict[tuple[str, str], GenerationResult]:
    out = {}
    for ex_name, ex in (("kyanite", KyaniteExecutor(Device.cpu())), ("ort", OnnxruntimeExecutor())):
        pipe = StableDiffusion(TINY_SD, ex)
        for name, s in RUNS.items():
            out[(ex_name, name)] = pipe.generate(s)
    return out


@pytest.mark.parametrize("run", list(RUNS))
def test_kyanite_matches_onnxruntime(
    results: dict[tuple[str, str], GenerationResult], run: str
) -> None:
    kn, ort = results[("kyanite", run)], results[("ort", run)]
    np.testing.assert_array_equal(kn.token_ids, ort.token_ids)
    assert kn.token_ids.tolist() == [NEGATIVE_IDS[run], PROMPT_IDS]  # known ids of the vocabulary
    assert kn.decoded.shape == ort.decoded.shape == (1, 3, 32, 32)
    assert kn.latents.shape == (1, 4, 16, 16)
    lat_err = float(np.max(np.abs(kn.latents - ort.latents)))
    img_err = float(np.max(np.abs(kn.decoded - ort.decoded)))
    assert lat_err < 1e-4 * max(1.0, float(np.max(np.abs(ort.latents)))), lat_err
    assert img_err < 1e-4, img_err
    assert int(np.max(np.abs(kn.image.astype(int) - ort.image.astype(int)))) <= 1


@pytest.mark.parametrize("run", list(RUNS))
def test_image_is_not_degenerate(
    results: dict[tuple[str, str], GenerationResult], run: str
) -> None:
    r = results[("kyanite", run)]
    assert np.all(np.isfinite(r.decoded))
    assert 0.1 < float(r.decoded.std()) < 2.0
    assert r.image.dtype == np.uint8 and r.image.shape == (32, 32, 3)
    assert len(np.unique(r.image)) > 50 and r.image.min() < 64 and r.image.max() > 192


def test_seed_and_prompt_change_the_image(results: dict[tuple[str, str], GenerationResult]) -> None:
    pipe = StableDiffusion(TINY_SD, OnnxruntimeExecutor())
    base = results[("ort", "pndm")]
    again = pipe.generate(RUNS["pndm"])
    np.testing.assert_array_equal(again.decoded, base.decoded)
    other = pipe.generate(Settings(PROMPT, negative_prompt="blurry, low quality", steps=4, seed=4))
    assert float(np.max(np.abs(other.decoded - base.decoded))) > 0.05
    unguided = pipe.generate(Settings("a red apple", steps=2, guidance_scale=1.0))
    assert unguided.decoded.shape == (1, 3, 32, 32)


def test_timings_cover_every_stage(results: dict[tuple[str, str], GenerationResult]) -> None:
    stages = set(results[("kyanite", "pndm")].timings)
    for s in (
        "tokenize",
        "load text_encoder",
        "optimize unet",
        "text encoder",
        "unet loop (5 steps)",
        "vae decoder",
    ):
        assert s in stages, stages


def test_cli_writes_png_steps_and_timings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from PIL import Image

    rc = main(
        [
            "a red apple on a table",
            "--steps",
            "2",
            "--seed",
            "7",
            "--out",
            str(tmp_path),
            "--save-intermediate",
            "--no-progress",
            "--device",
            "cpu",
            "--scheduler",
            "ddim",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    png = tmp_path / "a-red-apple-on-a-table-7.png"
    assert f"wrote {png} (32x32)" in out and "time per stage:" in out and "total" in out
    with Image.open(png) as im:
        assert im.size == (32, 32)
    steps = sorted(p.name for p in (tmp_path / "a-red-apple-on-a-table-7-steps").iterdir())
    assert steps == [
        "step000-t0501.npy",
        "step000-t0501.png",
        "step001-t0001.npy",
        "step001-t0001.png",
    ]


def test_long_prompt_is_cut_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    pipe = StableDiffusion(TINY_SD, KyaniteExecutor(Device.cpu()))
    with caplog.at_level("WARNING"):
        ids, hidden = pipe.encode_text(["", "a red apple " * 10])
    assert ids.shape == (2, 16) and ids.dtype == np.int32 and hidden.shape == (2, 16, 32)
    assert ids[1, -1] == 913 and "has 42 tokens, the text encoder takes 16" in caplog.text
