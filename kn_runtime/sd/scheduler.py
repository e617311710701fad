"""Noise schedulers of Stable Diffusion 1.x in plain NumPy: PNDM in PLMS mode and DDIM (eta 0).

Both walk the same 1000-step ᾱ table backwards with `1000 // N`-sized strides; they differ in how
the noise predictions of earlier steps are combined. The behaviour follows diffusers'
`PNDMScheduler(skip_prk_steps=True)` and `DDIMScheduler` with SD 1.x's configuration
(`scaled_linear` betas 0.00085..0.012, `steps_offset=1`, `set_alpha_to_one=False`), including
PNDM's repeated second timestep. Arithmetic is float64; samples keep their dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

__all__ = [
    "DDIMScheduler",
    "PNDMScheduler",
    "Scheduler",
    "SchedulerConfig",
    "alphas_cumprod",
    "make_scheduler",
    "plms_combine",
]


class SchedulerError(ValueError):
    """A scheduler configuration or call that cannot work (steps <= 0, unknown schedule)."""


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The fields of diffusers' scheduler_config.json that SD 1.x uses."""

    num_train_timesteps: int = 1000
    beta_start: float = 0.00085
    beta_end: float = 0.012
    beta_schedule: str = "scaled_linear"
    steps_offset: int = 1
    set_alpha_to_one: bool = False
    prediction_type: str = "epsilon"

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> SchedulerConfig:
        """Known keys only (diffusers configs carry many more); values checked here."""
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        cfg = cls(**kw)  # type: ignore[arg-type]
        if cfg.beta_schedule not in ("scaled_linear", "linear"):
            raise SchedulerError(
                f"beta_schedule '{cfg.beta_schedule}' is not supported (scaled_linear, linear)"
            )
        if cfg.prediction_type != "epsilon":
            raise SchedulerError(
                f"prediction_type '{cfg.prediction_type}' is not supported (epsilon)"
            )
        if cfg.num_train_timesteps < 2:
            raise SchedulerError(
                f"num_train_timesteps must be >= 2, found {cfg.num_train_timesteps}"
            )
        return cfg


def alphas_cumprod(cfg: SchedulerConfig = SchedulerConfig()) -> np.ndarray:
    """ᾱ_t = Π_{i<=t} (1 - β_i); `scaled_linear`: β = linspace(√β_start, √β_end, T)²."""
    t = cfg.num_train_timesteps
    if cfg.beta_schedule == "scaled_linear":
        betas = np.linspace(cfg.beta_start**0.5, cfg.beta_end**0.5, t, dtype=np.float64) ** 2
    else:
        betas = np.linspace(cfg.beta_start, cfg.beta_end, t, dtype=np.float64)
    return np.cumprod(1.0 - betas)


def plms_combine(ets: list[np.ndarray]) -> np.ndarray:
    """The linear multistep (Adams-Bashforth) combination of the newest noise predictions
    (`ets[-1]` newest): orders 1 to 4 as more history becomes available."""
    match len(ets):
        case 1:
            return ets[-1]
        case 2:
            return (3 * ets[-1] - ets[-2]) / 2
        case 3:
            return (23 * ets[-1] - 16 * ets[-2] + 5 * ets[-3]) / 12
        case _:
            return (55 * ets[-1] - 59 * ets[-2] + 37 * ets[-3] - 9 * ets[-4]) / 24


class Scheduler:
    """Shared parts: the ᾱ table, the timestep grid and the deterministic update from t to p."""

    name = "base"

    def __init__(self, num_steps: int, cfg: SchedulerConfig = SchedulerConfig()) -> None:
        if num_steps <= 0:
            raise SchedulerError(f"the number of steps must be >= 1, found {num_steps}")
        if num_steps > cfg.num_train_timesteps:
            raise SchedulerError(f"at most {cfg.num_train_timesteps} steps, found {num_steps}")
        self.cfg = cfg
        self.num_steps = num_steps
        self.alphas_cumprod = alphas_cumprod(cfg)
        self.final_alpha_cumprod = 1.0 if cfg.set_alpha_to_one else float(self.alphas_cumprod[0])
        self.stride = cfg.num_train_timesteps // num_steps
        # "leading" spacing: 0, stride, 2·stride, ... shifted by the offset
        self.base_timesteps = np.arange(num_steps, dtype=np.int64) * self.stride + cfg.steps_offset
        self.timesteps = self._timesteps()
        self.init_noise_sigma = 1.0

    def _timesteps(self) -> np.ndarray:
        return self.base_timesteps[::-1].copy()

    def alpha(self, t: int) -> float:
        """ᾱ_t, with the 'final' value for t < 0 (the step past the start of the table)."""
        return float(self.alphas_cumprod[t]) if t >= 0 else self.final_alpha_cumprod

    def ddim_update(self, sample: np.ndarray, eps: np.ndarray, t: int, p: int) -> np.ndarray:
        """x_p = √a_p·x̂₀ + √(1-a_p)·ε with x̂₀ = (x_t - √(1-a_t)·ε)/√a_t (eta 0)."""
        a_t, a_p = self.alpha(t), self.alpha(p)
        x0 = (sample.astype(np.float64) - np.sqrt(1 - a_t) * eps) / np.sqrt(a_t)
        return (np.sqrt(a_p) * x0 + np.sqrt(1 - a_p) * eps).astype(sample.dtype)

    def step(self, eps: np.ndarray, t: int, sample: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class DDIMScheduler(Scheduler):
    """Deterministic DDIM: every step uses only the newest noise prediction."""

    name = "ddim"

    def step(self, eps: np.ndarray, t: int, sample: np.ndarray) -> np.ndarray:
        return self.ddim_update(sample, eps.astype(np.float64), int(t), int(t) - self.stride)


class PNDMScheduler(Scheduler):
    """PNDM with PLMS steps only (SD 1.x's classic sampler). N steps take N+1 UNet calls: the
    second timestep repeats, and that call redoes the first step from the remembered sample with
    the mean of the two predictions (a Heun-like warm start) before the multistep formulas."""

    name = "pndm"

    def __init__(self, num_steps: int, cfg: SchedulerConfig = SchedulerConfig()) -> None:
        super().__init__(num_steps, cfg)
        self.ets: list[np.ndarray] = []
        self.counter = 0
        self.cur_sample: np.ndarray | None = None

    def _timesteps(self) -> np.ndarray:
        b = self.base_timesteps
        return np.concatenate([b[:-1], b[-2:-1], b[-1:]])[::-1].copy()

    def step(self, eps: np.ndarray, t: int, sample: np.ndarray) -> np.ndarray:
        t = int(t)
        e = eps.astype(np.float64)
        p = t - self.stride
        if self.counter == 1:  # the repeated timestep: redo the first step
            p, t = t, t + self.stride
        else:
            self.ets = [*self.ets[-3:], e]
        if self.counter == 0:
            self.cur_sample = sample
            combined = e
        elif self.counter == 1:
            assert self.cur_sample is not None
            combined = (e + self.ets[-1]) / 2
            sample, self.cur_sample = self.cur_sample, None
        else:
            combined = plms_combine(self.ets)
        self.counter += 1
        return self.pndm_update(sample, combined, t, p)

    def pndm_update(self, sample: np.ndarray, eps: np.ndarray, t: int, p: int) -> np.ndarray:
        """PNDM's transfer x_p = √(a_p/a_t)·x - (a_p - a_t)·ε / (a_t·√(1-a_p) + √(a_t(1-a_t)a_p));
        algebraically the DDIM update (the tests check that)."""
        a_t, a_p = self.alpha(t), self.alpha(p)
        denom = a_t * np.sqrt(1 - a_p) + np.sqrt(a_t * (1 - a_t) * a_p)
        out = np.sqrt(a_p / a_t) * sample.astype(np.float64) - (a_p - a_t) * eps / denom
        return out.astype(sample.dtype)


SCHEDULERS: dict[str, type[Scheduler]] = {
    "pndm": PNDMScheduler,
    "plms": PNDMScheduler,
    "ddim": DDIMScheduler,
}


def make_scheduler(
    name: str, num_steps: int, cfg: SchedulerConfig = SchedulerConfig()
) -> Scheduler:
    """A fresh scheduler by name: pndm (= plms) or ddim."""
    cls = SCHEDULERS.get(name.lower())
    if cls is None:
        raise SchedulerError(f"unknown scheduler '{name}' (choose from {', '.join(SCHEDULERS)})")
    return cls(num_steps, cfg)
