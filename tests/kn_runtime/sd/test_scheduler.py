"""The schedulers against closed forms (the ᾱ table, Adams-Bashforth exactness on polynomials,
PNDM's transfer = the DDIM update) and against trajectories computed with diffusers'
PNDMScheduler(skip_prk_steps=True) / DDIMScheduler (float64 stepping, SD 1.x config)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kn_runtime.sd.scheduler import (
    DDIMScheduler,
    PNDMScheduler,
    SchedulerConfig,
    SchedulerError,
    alphas_cumprod,
    make_scheduler,
    plms_combine,
)


def test_alphas_cumprod_closed_form() -> None:
    acp = alphas_cumprod()
    lo, hi = math.sqrt(0.00085), math.sqrt(0.012)
    betas = [(lo + i * (hi - lo) / 999) ** 2 for i in range(1000)]
    assert betas[0] == pytest.approx(0.00085, rel=1e-12) and betas[-1] == pytest.approx(
        0.012, rel=1e-12
    )
    for t in (0, 1, 2, 250, 500, 999):
        assert acp[t] == pytest.approx(math.prod(1 - b for b in betas[: t + 1]), rel=1e-12)
    assert acp[0] == pytest.approx(0.99915, rel=1e-12)
    # diffusers' float32 table: ᾱ_1, ᾱ_500, ᾱ_999
    np.testing.assert_allclose(
        acp[[1, 500, 999]],
        [0.9982960224151611, 0.27633246779441833, 0.00466009508818388],
        rtol=2e-6,
    )
    assert np.all(np.diff(acp) < 0)


def test_linear_schedule() -> None:
    acp = alphas_cumprod(SchedulerConfig(beta_schedule="linear", beta_start=1e-4, beta_end=0.02))
    assert acp[0] == pytest.approx(1 - 1e-4) and acp[1] == pytest.approx(
        (1 - 1e-4) * (1 - (1e-4 + 0.0199 / 999))
    )


def test_timesteps() -> None:
    pndm = PNDMScheduler(50).timesteps.tolist()
    assert pndm[:4] == [981, 961, 961, 941] and pndm[-2:] == [21, 1] and len(pndm) == 51
    assert DDIMScheduler(50).timesteps.tolist() == list(range(981, 0, -20))
    assert PNDMScheduler(3).timesteps.tolist() == [667, 334, 334, 1]
    assert PNDMScheduler(1).timesteps.tolist() == [1]
    assert DDIMScheduler(10).timesteps.tolist() == [901, 801, 701, 601, 501, 401, 301, 201, 101, 1]


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_plms_is_exact_on_polynomials(order: int) -> None:
    """Adams-Bashforth of order k: from f(0), f(-1), ... (newest first) it gives ∫₀¹ f exactly for
    every polynomial f of degree < k."""
    for degree in range(order):
        ets = [np.array(float(s) ** degree) for s in range(-order + 1, 1)]  # oldest ... newest
        assert float(plms_combine(ets)) == pytest.approx(1 / (degree + 1), abs=1e-12)


def test_plms_coefficients_by_hand() -> None:
    e1, e2, e3, e4 = (np.array(v) for v in (1.0, 10.0, 100.0, 1000.0))  # e1 newest
    assert float(plms_combine([e2, e1])) == pytest.approx((3 - 10) / 2)
    assert float(plms_combine([e3, e2, e1])) == pytest.approx((23 - 160 + 500) / 12)
    assert float(plms_combine([e4, e3, e2, e1])) == pytest.approx((55 - 590 + 3700 - 9000) / 24)


@pytest.mark.parametrize(("t", "p"), [(981, 961), (501, 481), (21, 1), (1, -19)])
def test_pndm_transfer_equals_ddim_update(t: int, p: int) -> None:
    s = PNDMScheduler(50)
    rng = np.random.default_rng(t)
    x, e = rng.standard_normal(8), rng.standard_normal(8)
    a_t = s.alphas_cumprod[t]
    a_p = s.alphas_cumprod[p] if p >= 0 else s.alphas_cumprod[0]  # set_alpha_to_one=False
    x0 = (x - np.sqrt(1 - a_t) * e) / np.sqrt(a_t)
    np.testing.assert_allclose(
        s.pndm_update(x, e, t, p), np.sqrt(a_p) * x0 + np.sqrt(1 - a_p) * e, rtol=1e-12
    )
    np.testing.assert_allclose(
        s.ddim_update(x, e, t, p), np.sqrt(a_p) * x0 + np.sqrt(1 - a_p) * e, rtol=1e-12
    )


# fmt: off
# diffusers 0.42.1, 10 steps, x = [1, -0.5], e_i = [sin(i + 1), cos(i / 2)] at call i
DIFFUSERS_PNDM = [[1.091593108374, -1.430208083987], [1.070482040316, -1.392105497583], [1.709567927691, -2.242935442631],
                  [2.931084445517, -3.061946477652], [3.997548537716, -3.781573784881], [4.809894714721, -4.42089510377],
                  [5.421000938929, -4.969793156019], [5.995054767665, -5.437373705345], [6.611957467842, -5.833825768875],
                  [7.289801724466, -6.183893225835], [7.301295800292, -6.192750941634]]
DIFFUSERS_DDIM = [[1.091593108374, -1.430208083987], [1.169288936384, -2.5899897919], [1.573712716489, -3.845473733818],
                  [2.329905746589, -5.069166646922], [3.173257251091, -6.162826959704], [3.81574303558, -7.067682137978],
                  [4.163539076136, -7.763364794849], [4.323595556933, -8.257389150818], [4.445911679959, -8.531640704912],
                  [4.454418204777, -8.532729528135]]


@pytest.mark.parametrize(("name", "expected"), [("pndm", DIFFUSERS_PNDM), ("ddim", DIFFUSERS_DDIM)])
def test_trajectory_matches_diffusers(name: str, expected: list[list[float]]) -> None:
    s = make_scheduler(name, 10)
    x = np.array([1.0, -0.5])
    got = []
    for i, t in enumerate(s.timesteps):
        x = s.step(np.array([np.sin(i + 1.0), np.cos(0.5 * i)]), int(t), x)
        got.append(x)
    # diffusers' ᾱ table is float32, ours float64: agreement to ~1e-6
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-5)


def test_pndm_second_step_restarts_from_the_first_sample() -> None:
    """The repeated timestep redoes step 1 from x_T with the mean of both predictions."""
    s = PNDMScheduler(10)
    x = np.array([0.3])
    e1, e2 = np.array([0.2]), np.array([-0.4])
    s.step(e1, 901, x)
    x2 = s.step(e2, 801, np.array([123.0]))  # the sample passed in is ignored
    np.testing.assert_allclose(x2, s.ddim_update(x, (e1 + e2) / 2, 901, 801), rtol=1e-12)


def test_sample_dtype_is_kept() -> None:
    s = DDIMScheduler(4)
    out = s.step(np.ones(3), int(s.timesteps[0]), np.ones(3, np.float32))
    assert out.dtype == np.float32


@pytest.mark.parametrize("steps", [0, -3, 1001])
def test_bad_step_counts(steps: int) -> None:
    with pytest.raises(SchedulerError, match="steps"):
        PNDMScheduler(steps)


def test_bad_config_and_name() -> None:
    with pytest.raises(SchedulerError, match="prediction_type"):
        SchedulerConfig.from_dict({"prediction_type": "v_prediction"})
    with pytest.raises(SchedulerError, match="beta_schedule"):
        SchedulerConfig.from_dict({"beta_schedule": "squaredcos_cap_v2"})
    with pytest.raises(SchedulerError, match="unknown scheduler"):
        make_scheduler("euler", 10)
    assert SchedulerConfig.from_dict({"beta_end": 0.02, "clip_sample": False}).beta_end == 0.02
