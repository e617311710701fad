"""`kn-sd`: text to image with Stable Diffusion 1.x ONNX exports on Kyanite (or onnxruntime, for
comparison), with per-stage timings.

    kn-sd "a photograph of an astronaut riding a horse"            # the tiny shipped pipeline
    kn-sd "a castle" --model ~/sd15-onnx --steps 30 --scheduler ddim --device cpu

With no --model it runs the tiny random-weight pipeline that ships inside the package (a few
seconds on a CPU). The arguments, the output paths and the model folder are checked before any
model runs; bad input ends with one line on stderr (`kn-sd: error: ...`) and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import numpy as np

from kn_graph._cli import CliError, run_tool
from kn_graph.errors import KnError
from kn_runtime.sd import TINY_SD
from kn_runtime.sd.executors import make_executor
from kn_runtime.sd.pipeline import (
    GenerationResult,
    ModelFolder,
    PipelineError,
    Settings,
    StableDiffusion,
    to_pixels,
)
from kn_runtime.sd.scheduler import SchedulerError
from kn_runtime.sd.tokenizer import TokenizerError

__all__ = ["TINY_SD", "build_parser", "check_args", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse whose complaints are a `CliError` (the one-line errors of kn-run and kn-svg),
    so that `main` reports them like every other bad input, and returns 2 instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise CliError(f"{message} (see --help)")


def _int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, found '{text}'") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, found {value}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="kn-sd", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "prompt", nargs="?", default="a photograph of an astronaut riding a horse on mars"
    )
    ap.add_argument("--negative-prompt", default="", help="what to steer away from (default: none)")
    ap.add_argument(
        "--model",
        type=Path,
        default=None,
        help="exported model folder (default: the tiny pipeline shipped in kn_runtime/sd/tiny_sd)",
    )
    ap.add_argument("--steps", type=_int_at_least(1), default=20, help="denoising steps (20)")
    ap.add_argument(
        "--guidance-scale", type=float, default=7.5, help="classifier-free guidance (7.5)"
    )
    ap.add_argument(
        "--scheduler",
        default="pndm",
        choices=["pndm", "plms", "ddim"],
        help="pndm/plms (the classic SD 1.x sampler) or ddim",
    )
    ap.add_argument(
        "--seed", type=_int_at_least(0), default=0, help="seed of the initial latents (PCG64)"
    )
    ap.add_argument(
        "--height",
        type=_int_at_least(1),
        default=None,
        help="image height, a multiple of the model's size factor (default: the UNet's size)",
    )
    ap.add_argument("--width", type=_int_at_least(1), default=None, help="image width")
    ap.add_argument(
        "--scaling-factor",
        type=float,
        default=None,
        help="latent scaling factor (default: vae_decoder/config.json, else 0.18215)",
    )
    ap.add_argument("--device", default="best", choices=["cpu", "cuda", "best"])
    ap.add_argument(
        "--executor",
        default="kyanite",
        choices=["kyanite", "onnxruntime"],
        help="run the models on Kyanite (default) or on onnxruntime",
    )
    ap.add_argument("--out", type=Path, default=Path("out"), help="output folder (default ./out)")
    ap.add_argument(
        "--png",
        type=Path,
        default=None,
        help="write the image here, a .png file (default: OUT/<prompt>-<seed>.png)",
    )
    ap.add_argument(
        "--save-intermediate",
        action="store_true",
        help="also save the latents (.npy) and their decoded image (.png) after every step",
    )
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def _nearest_existing(path: Path) -> Path:
    """`path` or its closest ancestor that exists (the folder that `mkdir -p` would write in)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_png(png: Path) -> None:
    if png.suffix.lower() != ".png":
        raise CliError(f"--png {png}: the file name must end in .png")
    if png.is_dir():
        raise CliError(f"--png {png} is a folder, expected a .png file name")
    folder = png.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise CliError(f"cannot write {png}: the folder {folder} {what}")
    if not os.access(folder, os.W_OK) or (png.exists() and not os.access(png, os.W_OK)):
        raise CliError(f"cannot write {png}: permission denied")


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise CliError(f"--out {out} is not a folder")
    base = _nearest_existing(out)
    if not base.is_dir():
        raise CliError(f"cannot create the output folder {out}: {base} is not a folder")
    if not os.access(base, os.W_OK):
        raise CliError(f"cannot create the output folder {out}: {base} is not writable")


def check_args(args: argparse.Namespace) -> None:
    """What can be checked without reading a model: the output paths (so that a long run never
    ends on an unwritable or misnamed file) and the numbers argparse's types do not cover."""
    if args.png is not None:
        _check_png(args.png)
    if args.png is None or args.save_intermediate:
        _check_out(args.out)
    if not np.isfinite(args.guidance_scale) or args.guidance_scale < 0:
        raise CliError(
            f"argument --guidance-scale: must be a finite number >= 0, found {args.guidance_scale}"
        )
    if args.scaling_factor is not None and not args.scaling_factor > 0:
        raise CliError(f"argument --scaling-factor: must be > 0, found {args.scaling_factor}")
    if not args.prompt.strip():
        raise CliError("the prompt is empty")


def slug(text: str, limit: int = 40) -> str:
    """A file-name-safe short form of the prompt."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit].rstrip("-") or "image"


def save_png(pixels: np.ndarray, path: Path) -> None:
    from PIL import Image

    try:
        Image.fromarray(pixels, "RGB").save(path, format="PNG")
    except OSError as e:
        raise PipelineError(f"cannot write {path}: {e.strerror or e}") from None


def make_folder(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PipelineError(f"cannot create the output folder {path}: {e.strerror or e}") from None
    return path


def run(args: argparse.Namespace) -> GenerationResult:
    """One generation from checked arguments: the model folder and the settings are checked
    against each other before the executor is made and any model is loaded."""
    folder = ModelFolder(args.model if args.model is not None else TINY_SD)
    settings = Settings(
        prompt=args.prompt,
        negative_prompt=args.negative_prompt,
        steps=args.steps,
        guidance_scale=args.guidance_scale,
        seed=args.seed,
        height=args.height,
        width=args.width,
        scheduler=args.scheduler,
        scaling_factor=args.scaling_factor,
    )
    folder.check(settings)
    executor = make_executor(args.executor, args.device)
    pipe = StableDiffusion(folder, executor)
    stem = f"{slug(args.prompt)}-{args.seed}"
    path = args.png if args.png is not None else make_folder(args.out) / f"{stem}.png"
    on_step = None
    if args.save_intermediate:
        steps_dir = make_folder(args.out / f"{stem}-steps")
        scaling = args.scaling_factor or folder.scaling_factor

        def on_step(i: int, t: int, latents: np.ndarray) -> None:
            name = steps_dir / f"step{i:03d}-t{t:04d}"
            np.save(name.with_suffix(".npy"), latents)
            save_png(to_pixels(pipe.decode(latents, scaling)), name.with_suffix(".png"))

    print(
        f"model: {folder.root}  executor: {executor.name}  scheduler: {args.scheduler}  "
        f"steps: {args.steps}  guidance: {args.guidance_scale}  seed: {args.seed}"
    )
    result = pipe.generate(settings, progress=not args.no_progress, on_step=on_step)
    t0 = time.perf_counter()
    save_png(result.image, path)
    result.timings["save png"] = time.perf_counter() - t0
    h, w, _ = result.image.shape
    print(f"wrote {path} ({w}x{h})")
    print_timings(result.timings)
    return result


def print_timings(timings: dict[str, float]) -> None:
    """The time per stage, in the order the stages ran, and the total."""
    width = max(len(k) for k in timings)
    print("time per stage:")
    for k, v in timings.items():
        print(f"  {k:<{width}}  {v:9.3f} s")
    print(f"  {'total':<{width}}  {sum(timings.values()):9.3f} s")


def main(argv: list[str] | None = None) -> int:
    """Exit status 0 on success, 2 on any bad invocation, model folder or file (one line on
    stderr, no traceback), 130 on Ctrl-C."""

    def body() -> None:
        args = build_parser().parse_args(argv)
        check_args(args)
        run(args)

    return run_tool(
        "kn-sd", body, (PipelineError, SchedulerError, TokenizerError, KnError, OSError)
    )


if __name__ == "__main__":
    sys.exit(main())
