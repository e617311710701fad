"""The Stable Diffusion pipeline: prompt -> CLIP tokens -> text encoder -> UNet denoising loop with
classifier-free guidance -> VAE decoder -> pixels, over any `Executor` (Kyanite or onnxruntime).

Models are read from the folder layout of the common ONNX exporters (optimum, diffusers):
text_encoder/model.onnx, unet/model.onnx (+ external data), vae_decoder/model.onnx, tokenizer/,
with the diffusers config.json files and scheduler/scheduler_config.json when present.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kn_runtime.sd.executors import Executor, LoadedModel
from kn_runtime.sd.scheduler import SchedulerConfig, SchedulerError, make_scheduler
from kn_runtime.sd.signature import (
    PipelineError,
    read_signature,
    text_encoder_ports,
    unet_ports,
    vae_decoder_ports,
)
from kn_runtime.sd.tokenizer import load_tokenizer

__all__ = [
    "GenerationResult",
    "ModelFolder",
    "PipelineError",
    "Settings",
    "StableDiffusion",
    "to_pixels",
]

log = logging.getLogger(__name__)

LAYOUT = ("text_encoder/model.onnx", "unet/model.onnx", "vae_decoder/model.onnx", "tokenizer/")
DEFAULT_SCALING_FACTOR = 0.18215

StepCallback = Callable[[int, int, np.ndarray], None]
"""Called after every UNet step with (step index, timestep, latents)."""


@dataclass(frozen=True, slots=True)
class Settings:
    """One generation. `height`/`width` default to the UNet's sample_size times the VAE factor."""

    prompt: str
    negative_prompt: str = ""
    steps: int = 20
    guidance_scale: float = 7.5
    seed: int = 0
    height: int | None = None
    width: int | None = None
    scheduler: str = "pndm"
    scaling_factor: float | None = None


@dataclass
class GenerationResult:
    image: np.ndarray
    """uint8 [H, W, 3] pixels."""
    decoded: np.ndarray
    """float32 [1, 3, H, W], the VAE decoder's output (≈ [-1, 1])."""
    latents: np.ndarray
    """float32 [1, C, h, w] final latents, before the scaling factor."""
    token_ids: np.ndarray
    """[2, L] ids of the negative prompt and the prompt."""
    timings: dict[str, float] = field(default_factory=dict)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise PipelineError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise PipelineError(f"{path}: expected a JSON object")
    return data


class ModelFolder:
    """Paths, configs and signatures of an exported pipeline (no weights are read here)."""

    def __init__(self, root: Path) -> None:
        if not root.is_dir():
            what = "is not a folder" if root.exists() else "does not exist"
            raise PipelineError(f"model folder {root} {what}")
        missing = [p for p in LAYOUT if not (root / p).exists()]
        if missing:
            raise PipelineError(
                f"{root} lacks {', '.join(missing)} (expected the exported layout "
                f"{', '.join(LAYOUT)})"
            )
        self.root = root
        vae_cfg = _read_json(root / "vae_decoder" / "config.json")
        unet_cfg = _read_json(root / "unet" / "config.json")
        try:
            self.vae_factor = 2 ** (len(vae_cfg.get("block_out_channels", [0] * 4)) - 1)
            # the UNet halves the latents once per down block but the last, then doubles them
            # back and concatenates the skips: the latent sides must divide by that factor
            self.unet_factor = 2 ** max(0, len(unet_cfg.get("down_block_types", [0])) - 1)
            self.latent_channels = int(vae_cfg.get("latent_channels", 4))
            self.scaling_factor = float(vae_cfg.get("scaling_factor", DEFAULT_SCALING_FACTOR))
            self.sample_size = int(unet_cfg.get("sample_size") or 64)
            self.scheduler_config = SchedulerConfig.from_dict(
                _read_json(root / "scheduler" / "scheduler_config.json")
            )
        except SchedulerError:
            raise
        except (TypeError, ValueError) as e:  # a config value of the wrong type
            raise PipelineError(f"{root}: unusable config.json value ({e})") from None

        self.text_sig = read_signature(root / "text_encoder" / "model.onnx")
        self.unet_sig = read_signature(root / "unet" / "model.onnx")
        self.vae_sig = read_signature(root / "vae_decoder" / "model.onnx")
        self.text_ids, self.text_out = text_encoder_ports(self.text_sig)
        self.unet = unet_ports(self.unet_sig, self.latent_channels)
        self.vae_in, self.vae_out = vae_decoder_ports(self.vae_sig, self.latent_channels)

        length = self.text_ids.static(1)
        unet_len = self.unet.encoder_hidden_states.static(1)
        if length is not None and unet_len is not None and length != unet_len:
            raise PipelineError(
                f"the text encoder makes {length} tokens, the UNet expects {unet_len}"
            )
        self.tokenizer = load_tokenizer(root / "tokenizer", length or unet_len)
        hidden, cross = self.text_out.static(2), self.unet.encoder_hidden_states.static(2)
        if hidden is not None and cross is not None and hidden != cross:
            raise PipelineError(
                f"the text encoder's hidden size {hidden} is not the UNet's "
                f"cross-attention size {cross}"
            )

    def check(self, s: Settings) -> tuple[int, int]:
        """The settings against this folder, before any model is loaded: the image's height and
        width (the UNet's default size when not set)."""
        if not s.prompt.strip():
            raise PipelineError("the prompt is empty")
        if s.seed < 0:
            raise PipelineError(f"the seed must be >= 0, found {s.seed}")
        train_steps = self.scheduler_config.num_train_timesteps
        if not 1 <= s.steps <= train_steps:
            raise PipelineError(f"steps must be >= 1 and <= {train_steps}, found {s.steps}")
        if not np.isfinite(s.guidance_scale) or s.guidance_scale < 0:
            raise PipelineError(
                f"guidance scale must be a finite number >= 0, found {s.guidance_scale}"
            )
        if s.scaling_factor is not None and not s.scaling_factor > 0:
            raise PipelineError(f"the scaling factor must be > 0, found {s.scaling_factor}")
        f = self.vae_factor * self.unet_factor
        h = self.default_size if s.height is None else s.height
        w = self.default_size if s.width is None else s.width
        if h <= 0 or w <= 0 or h % f or w % f:
            raise PipelineError(
                f"height and width must be positive multiples of {f} (the VAE factor "
                f"{self.vae_factor} x the UNet's {self.unet_factor}), found {h}x{w}"
            )
        return h, w

    @property
    def default_size(self) -> int:
        return self.sample_size * self.vae_factor


class StableDiffusion:
    """Text-to-image over one model folder and one executor; models load on first use for the
    shapes of the run (the UNet after the text encoder has told its hidden size)."""

    def __init__(self, folder: Path | ModelFolder, executor: Executor) -> None:
        self.folder = folder if isinstance(folder, ModelFolder) else ModelFolder(folder)
        self.executor = executor
        self._models: dict[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]], LoadedModel] = {}
        self.timings: dict[str, float] = {}

    # -- helpers ------------------------------------------------------------------------------
    def _model(self, part: str, shapes: dict[str, tuple[int, ...]]) -> LoadedModel:
        key = (part, tuple(sorted(shapes.items())))
        if key not in self._models:
            times: dict[str, float] = {}
            self._models[key] = self.executor.load(
                self.folder.root / part / "model.onnx", shapes, times
            )
            for phase, s in times.items():
                self._add(f"{phase} {part}", s)
        return self._models[key]

    def _add(self, stage: str, seconds: float) -> None:
        self.timings[stage] = self.timings.get(stage, 0.0) + seconds

    def check(self, s: Settings) -> tuple[int, int]:
        """The settings against the model folder (`ModelFolder.check`): the image height, width."""
        return self.folder.check(s)

    # -- stages -------------------------------------------------------------------------------
    def encode_text(self, prompts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids [n, L] and hidden states [n, L, D], one prompt per call (batch 1 always
        fits the exported text encoders)."""
        t0 = time.perf_counter()
        tok = self.folder.tokenizer
        for p in prompts:
            n = len(tok.tokenize(p)) + 2
            if n > tok.max_length:
                log.warning(
                    "the prompt '%s' has %d tokens, the text encoder takes %d: cut",
                    p,
                    n,
                    tok.max_length,
                )
        ids = np.array([tok.encode(p) for p in prompts], dtype=self.folder.text_ids.dtype)
        self._add("tokenize", time.perf_counter() - t0)
        port = self.folder.text_ids
        model = self._model("text_encoder", {port.name: (1, ids.shape[1])})
        t0 = time.perf_counter()
        outs = [model.run({port.name: ids[i : i + 1]}) for i in range(len(prompts))]
        k = self.folder.text_sig.outputs.index(self.folder.text_out)
        hidden = np.concatenate([o[k] for o in outs]).astype(
            self.folder.unet.encoder_hidden_states.dtype
        )
        self._add("text encoder", time.perf_counter() - t0)
        return ids, hidden

    def _unet_calls(self, batch: int) -> int:
        """How many UNet calls one step takes (2 when the export fixes a batch of 1)."""
        fixed = self.folder.unet.sample.static(0)
        if fixed is None or fixed == batch:
            return 1
        if fixed == 1:
            return batch
        raise PipelineError(
            f"the UNet's batch is fixed to {fixed}, the pipeline needs {batch} or 1"
        )

    def _unet_feeds(
        self, x_shape: tuple[int, ...], hidden: np.ndarray
    ) -> tuple[LoadedModel, int, tuple[int, ...]]:
        """The UNet loaded for this run's shapes, the calls per step and the timestep's shape."""
        u = self.folder.unet
        calls = self._unet_calls(x_shape[0])
        per = x_shape[0] // calls
        tshape: tuple[int, ...] = (
            () if u.timestep.rank == 0 else (1,) if u.timestep.static(0) == 1 else (per,)
        )
        shapes = {
            u.sample.name: (per, *x_shape[1:]),
            u.timestep.name: tshape,
            u.encoder_hidden_states.name: (per, *hidden.shape[1:]),
        }
        return self._model("unet", shapes), calls, tshape

    def predict_noise(
        self, latents: np.ndarray, t: int, hidden: np.ndarray, scale: float
    ) -> np.ndarray:
        """ε for one step: the UNet on [uncond, cond] (or cond alone when scale <= 1), combined as
        e_u + s·(e_c - e_u)."""
        u = self.folder.unet
        x = np.concatenate([latents] * hidden.shape[0]).astype(u.sample.dtype)
        model, calls, tshape = self._unet_feeds(x.shape, hidden)
        per = x.shape[0] // calls
        t_feed = np.full(tshape, t, dtype=u.timestep.dtype)
        outs = [
            model.run(
                {
                    u.sample.name: x[i * per : (i + 1) * per],
                    u.timestep.name: t_feed,
                    u.encoder_hidden_states.name: hidden[i * per : (i + 1) * per],
                }
            )[0]
            for i in range(calls)
        ]
        eps = np.concatenate(outs).astype(np.float64)
        if hidden.shape[0] == 1:
            return eps
        return eps[0:1] + scale * (eps[1:2] - eps[0:1])

    def decode(self, latents: np.ndarray, scaling_factor: float) -> np.ndarray:
        """VAE decoder on latents / scaling factor -> float32 [1, 3, H, W]."""
        port = self.folder.vae_in
        x = (latents / scaling_factor).astype(port.dtype)
        model = self._model("vae_decoder", {port.name: x.shape})
        t0 = time.perf_counter()
        (out, *_) = model.run({port.name: x})
        self._add("vae decoder", time.perf_counter() - t0)
        return out.astype(np.float32)

    def generate(
        self, s: Settings, *, progress: bool = False, on_step: StepCallback | None = None
    ) -> GenerationResult:
        """Run the whole pipeline for one image."""
        h, w = self.check(s)
        self.timings = {}  # this run's stages (models loaded by an earlier run cost nothing)
        scheduler = make_scheduler(s.scheduler, s.steps, self.folder.scheduler_config)
        guided = s.guidance_scale > 1.0
        ids, hidden = self.encode_text([s.negative_prompt, s.prompt])
        if not guided:
            hidden = hidden[1:]
        f = self.folder.vae_factor
        rng = np.random.default_rng(s.seed)
        shape = (1, self.folder.latent_channels, h // f, w // f)
        latents = (rng.standard_normal(shape) * scheduler.init_noise_sigma).astype(np.float32)
        self._unet_feeds((hidden.shape[0], *shape[1:]), hidden)  # load before the timed loop

        timesteps = [int(t) for t in scheduler.timesteps]
        steps: Any = timesteps
        if progress:
            from tqdm import tqdm

            steps = tqdm(timesteps, desc="unet", unit="step")
        unet_time = 0.0
        for i, t in enumerate(steps):
            t0 = time.perf_counter()
            eps = self.predict_noise(latents, t, hidden, s.guidance_scale)
            latents = scheduler.step(eps, t, latents).astype(np.float32)
            unet_time += time.perf_counter() - t0
            if on_step is not None:
                on_step(i, t, latents)
        self._add(f"unet loop ({len(timesteps)} steps)", unet_time)
        scaling = s.scaling_factor or self.folder.scaling_factor
        decoded = self.decode(latents, scaling)
        return GenerationResult(to_pixels(decoded), decoded, latents, ids, dict(self.timings))


def to_pixels(decoded: np.ndarray) -> np.ndarray:
    """[1, 3, H, W] in ≈[-1, 1] -> uint8 [H, W, 3]: clamp((x + 1) / 2, 0, 1) · 255, rounded."""
    x = np.clip((decoded[0].astype(np.float64) + 1) / 2, 0, 1)
    return np.round(x * 255).astype(np.uint8).transpose(1, 2, 0)
