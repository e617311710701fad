"""`kn-sd` / `python -m examples.stable_diffusion`: text to image with Stable Diffusion 1.x ONNX
exports on Kyanite (or onnxruntime, for comparison), with per-stage timings.

    kn-sd "a photograph of an astronaut riding a horse"            # the tiny shipped pipeline
    kn-sd "a castle" --model ~/sd15-onnx --steps 30 --scheduler ddim --device cpu

With no --model it runs the tiny random-weight pipeline in examples/tiny_sd/ (a few seconds on
a CPU). Bad input ends with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

from examples.sd.executors import make_executor
from examples.sd.pipeline import (
    GenerationResult,
    PipelineError,
    Settings,
    StableDiffusion,
    to_pixels,
)
from examples.sd.scheduler import SchedulerError
from examples.sd.tokenizer import TokenizerError
from kn_graph.errors import KnError

__all__ = ["TINY_SD", "main"]

TINY_SD = Path(__file__).resolve().parent / "tiny_sd"
"""The tiny Stable-Diffusion-shaped pipeline that ships with the repository."""


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
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
        help="exported model folder (default: the tiny pipeline in examples/tiny_sd)",
    )
    ap.add_argument("--steps", type=int, default=20, help="denoising steps (default 20)")
    ap.add_argument(
        "--guidance-scale", type=float, default=7.5, help="classifier-free guidance (7.5)"
    )
    ap.add_argument(
        "--scheduler",
        default="pndm",
        choices=["pndm", "plms", "ddim"],
        help="pndm/plms (the classic SD 1.x sampler) or ddim",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the initial latents (NumPy PCG64)")
    ap.add_argument(
        "--height",
        type=int,
        default=None,
        help="image height (default: the UNet's sample size x 8)",
    )
    ap.add_argument("--width", type=int, default=None, help="image width")
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
        help="write the image here (default: OUT/<prompt>-<seed>.png)",
    )
    ap.add_argument(
        "--save-intermediate",
        action="store_true",
        help="also save the latents (.npy) and their decoded image (.png) after every step",
    )
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


def slug(text: str, limit: int = 40) -> str:
    """A file-name-safe short form of the prompt."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:limit].rstrip("-") or "image"


def save_png(pixels: np.ndarray, path: Path) -> None:
    from PIL import Image

    try:
        Image.fromarray(pixels, "RGB").save(path)
    except OSError as e:
        raise PipelineError(f"cannot write {path}: {e.strerror or e}") from None


def make_folder(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PipelineError(f"cannot create the output folder {path}: {e.strerror or e}") from None
    return path


def run(args: argparse.Namespace) -> GenerationResult:
    folder = args.model if args.model is not None else TINY_SD
    executor = make_executor(args.executor, args.device)
    pipe = StableDiffusion(folder, executor)
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
    pipe.check(settings)  # before any file is written
    stem = f"{slug(args.prompt)}-{args.seed}"
    path = args.png if args.png is not None else make_folder(args.out) / f"{stem}.png"
    on_step = None
    if args.save_intermediate:
        steps_dir = make_folder(args.out / f"{stem}-steps")
        scaling = args.scaling_factor or pipe.folder.scaling_factor

        def on_step(i: int, t: int, latents: np.ndarray) -> None:
            name = steps_dir / f"step{i:03d}-t{t:04d}"
            np.save(name.with_suffix(".npy"), latents)
            save_png(to_pixels(pipe.decode(latents, scaling)), name.with_suffix(".png"))

    print(
        f"model: {folder}  executor: {executor.name}  scheduler: {args.scheduler}  "
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
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except (PipelineError, SchedulerError, TokenizerError, KnError) as e:
        one_line = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
        print(f"kn-sd: error: {one_line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kn-sd: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
