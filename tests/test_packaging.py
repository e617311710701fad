"""A newcomer's install: the wheel built from this checkout, installed WITHOUT extras into a fresh
venv, runs its three commands (`kn-run` on the embedded model, `kn-svg --help`, `kn-sd` on the
shipped tiny pipeline, found as package data); only our own top-level packages are installed.
Also: the checkout's example scripts still run.

Takes about 20 s on two cores (building the wheel, installing numpy/scipy/onnx from pip's local
index or cache); it never skips, since this is what `pip install` gives a new user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUR_PACKAGES = {"kn_graph", "kn_runtime", "kn_cuda_eval"}
# what a checkout holds but the wheel is not built from: git's ignores and the folders that stay
# in the checkout (so the build is also shown not to need them)
NOT_BUILT_FROM = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    ".ruff_cache",
    ".mypy_cache",
    "out",
    "tests",
    "examples",
    "benchmarks",
    "docs",
)

pytestmark = pytest.mark.slow


def clean_env() -> dict[str, str]:
    """The environment of a new user's shell: nothing pointing into this checkout or its venv;
    pip skips an unreachable index at once instead of retrying it (its local index still
    answers)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    }
    env.setdefault("PIP_RETRIES", "0")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    return env


def run(argv: Sequence[str | Path], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return proc


def must_run(argv: Sequence[str | Path], cwd: Path, timeout: float = 300) -> str:
    proc = run(argv, cwd, timeout)
    if proc.returncode != 0:
        cmd = " ".join(map(str, argv))
        pytest.fail(f"`{cmd}` exited {proc.returncode}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return proc.stdout


@dataclass(frozen=True, slots=True)
class FreshInstall:
    wheel: Path
    bin: Path
    home: Path
    """An empty working folder, outside the checkout."""


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> FreshInstall:
    """The wheel of this checkout, built from a copy (the build writes build/ and *.egg-info
    beside the sources), installed with its base dependencies only into a new venv."""
    tmp = tmp_path_factory.mktemp("newcomer")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=NOT_BUILT_FROM)
    must_run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", src, "-w", tmp], tmp)
    (wheel,) = tmp.glob("kyanite-*.whl")
    venv = tmp / "venv"
    must_run([sys.executable, "-m", "venv", "--without-pip", venv], tmp)
    python = venv / "bin" / "python"
    # this pip installs into the new venv (`--python`): no pip bootstrap in it, same result
    must_run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile", wheel],
        tmp,
    )
    home = tmp / "home"
    home.mkdir()
    return FreshInstall(wheel, venv / "bin", home)


def test_wheel_holds_only_our_packages_and_the_tiny_pipeline(fresh: FreshInstall) -> None:
    with zipfile.ZipFile(fresh.wheel) as z:
        names = z.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == OUR_PACKAGES
    tiny = {n.removeprefix("kn_runtime/sd/tiny_sd/") for n in names if "/tiny_sd/" in n}
    for part in ("text_encoder/model.onnx", "unet/model.onnx", "unet/model.onnx_data"):
        assert part in tiny, sorted(tiny)
    assert {"vae_decoder/model.onnx", "tokenizer/vocab.json", "tokenizer/merges.txt"} <= tiny
    assert "kn_runtime/models/resnet_tiny.onnx" in names
    for part in ("model.onnx", "config.json", "tokenizer.json"):
        assert f"kn_runtime/models/tiny_llm/{part}" in names


def test_no_extras_and_no_examples_package(fresh: FreshInstall) -> None:
    code = (
        "import importlib.util as u, kn_runtime;"
        "print(kn_runtime.__file__);"
        "print([m for m in ('examples', 'tests', 'tokenizers', 'onnxruntime', 'pytest')"
        " if u.find_spec(m)])"
    )
    where, found = must_run([fresh.bin / "python", "-c", code], fresh.home).splitlines()
    assert Path(where).is_relative_to(fresh.bin.parent), where  # the wheel, not the checkout
    assert found == "[]"


def test_kn_run_embedded_model(fresh: FreshInstall) -> None:
    out = must_run([fresh.bin / "kn-run"], fresh.home)
    assert "resnet_tiny.onnx" in out and "output logits" in out
    # the CPU backend (compiled C from the wheel's prelude, oneDNN from the base dependencies)
    assert "device: cpu (plan on the host)" in out
    assert float(out.split("max |d| / max |ref| = ")[1].split()[0]) < 1e-4


def test_kn_generate_on_the_shipped_tiny_llm_without_tokenizers(fresh: FreshInstall) -> None:
    """The default model's character tokenizer is read without `tokenizers` (not installed)."""
    out = must_run(
        [fresh.bin / "kn-generate", "--prompt", "Hi", "--max-new-tokens", "3"], fresh.home
    )
    assert out.startswith("Hi") and "decode:" in out and "peak memory (VmHWM):" in out


def test_kn_svg_help(fresh: FreshInstall) -> None:
    assert "usage: kn-svg" in must_run([fresh.bin / "kn-svg", "--help"], fresh.home)


def test_kn_sd_on_the_shipped_tiny_pipeline(fresh: FreshInstall) -> None:
    png = fresh.home / "x.png"
    argv: list[str | Path] = [fresh.bin / "kn-sd", "--steps", "2", "--out", fresh.home / "out"]
    argv += ["--png", png]
    out = must_run(argv, fresh.home)
    tiny = fresh.bin.parent / "lib"
    assert any(
        line.startswith(f"model: {tiny}") and "/kn_runtime/sd/tiny_sd" in line
        for line in out.splitlines()
    ), out
    assert f"wrote {png} (32x32)" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_kn_sd_bad_invocation_is_one_line(fresh: FreshInstall) -> None:
    proc = run([fresh.bin / "kn-sd", "--png", "x.onnx"], fresh.home)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "kn-sd: error: --png x.onnx: the file name must end in .png"
    ]


@pytest.mark.parametrize(
    "argv",
    [["examples/stable_diffusion.py"], ["-m", "examples.stable_diffusion"]],
    ids=["script", "module"],
)
def test_checkout_script_runs(argv: list[str]) -> None:
    out = must_run([sys.executable, *argv, "--help"], ROOT, timeout=60)
    assert out.startswith("usage: kn-sd")
