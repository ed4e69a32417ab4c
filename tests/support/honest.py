"""An honest noise model: the reference is simulated too, with run effects and autocorrelation.

Benchmark support (``benchmarks/bench_calibration.py``; issue 19). ``tests.support
.simulate`` draws healthy runs around the published reference as if the reference were the
truth; this module draws the reference itself, the other published run its bands cover, and
the runs judged against them, all from one model, so the reference's sampling error enters
the figures. It decides how a replicate is drawn; it judges nothing and records nothing (the
benchmark records each simulated reference with the real ``baseline record`` code and judges
with the real gate).

A **replicate** is one prompt sequence shared by every run in it (``--rollout-shuffle``,
default seed): per rollout 8 prompt difficulties ``p ~ Beta(a, b)`` (the fit of
``simulate.fit``: mean and spread of the published reward series). On it: a simulated patched
reference, a simulated stock reference (each one is the other's ``cover`` run), and ``k`` test
runs of each variant. Every run has, on top of ``simulate``'s per-rollout model:

- a **run-level random effect**: the logprob gap and the KL multiplied by ``exp(u)``,
  ``u ~ N(0, run_logprob)`` / ``N(0, run_kl)``; every prompt's success probability shifted by
  ``N(0, run_reward)`` (:class:`Noise` says how each size was chosen from the published data);
- **lag-1 autocorrelation** ``rho``: the log-scale innovations of the logprob gap, the KL and
  the grad norm are AR(1) with that lag-1 correlation and unchanged marginal spread. The
  reward has none: each rollout draws fresh prompts;
- optionally a **skewed KL** (``kl_shape="skewed"``): ``c + LogNormal``, the shift ``c`` and
  the lognormal fitted to the published KL min / mean / max of 20 rollouts (Blom's order
  statistic positions), a shape the lognormal model does not have (the published min sits
  close to the mean, the max far above it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from miles_amd.rules.bands import spread_of
from miles_amd.rules.model import Baseline
from tests.support.simulate import (
    GROUPS,
    KL,
    LOGPROB,
    PER_GROUP,
    SAMPLES,
    SPIKE_THRESHOLD,
    NoiseModel,
    lognormal_params,
    metrics,
)


@dataclass(frozen=True)
class Noise:
    """The sizes of the effects the fitted per-rollout model lacks.

    Chosen from the published data (the two runs 4it2x89i / jvvnhop9 on one prompt sequence,
    jvvnhop9's per-rollout series, its KL summary); ``benchmarks/bench_calibration.py``'s
    sensitivity table shows the figures with none and with twice these:

    - ``run_logprob = 0.03``: the two runs' logprob-gap means (0.0171, 0.016975) differ by
      0.7%, less than their sampling error alone (sd 0.0017 / sqrt(10) = 3.2% of the mean),
      so the point estimate of a run effect is 0; its one-sided 90% upper bound from that
      one difference (``d²/2 / χ²_1(0.10) - (sd_a² + sd_b²)/40``) is 3.5%; 3% is taken.
    - ``run_kl = 0.06``: one run, a summary only, so not estimable from data; the KL of two
      nearby distributions is about half the mean squared logprob difference, so it scales
      with the square of the gap's scale: a relative run effect of 3% on the gap is 6% on
      the KL (the sensitivity table's doubled column, 12%, covers the issue's 10%).
    - ``run_reward = 0.005`` (on every prompt's success probability): the two runs' reward
      means on the same prompts differ by 0.009 (0.57 published to 2 decimals), half the
      binomial sampling sd of that difference alone (0.017): point estimate 0; chosen as the
      stock mean's rounding (±0.005). Runs start from one model and move little in 20 steps
      at lr 1e-5, so a larger reward effect would need a cause the recipe does not have.
    - ``rho = 0.3``: jvvnhop9's logprob series has lag-1 autocorrelation -0.007 (bias
      ``-(1+4ρ)/n`` corrected: +0.04), standard error 1/sqrt(20) = 0.22; the one-sided 90%
      upper bound is 0.32, rounded to 0.3.
    """

    run_logprob: float = 0.03
    run_kl: float = 0.06
    run_reward: float = 0.005
    rho: float = 0.3
    kl_shape: str = "lognormal"  # or "skewed"

    def scaled(self, factor: float) -> Noise:
        """The same model with every run effect multiplied by ``factor``."""
        return Noise(
            self.run_logprob * factor,
            self.run_kl * factor,
            self.run_reward * factor,
            self.rho,
            self.kl_shape,
        )


CHOSEN = Noise()

_BLOM_20 = NormalDist().inv_cdf((20 - 0.375) / (20 + 0.25))  # E[max of 20 normals] ~ 1.867


def skewed_kl(low: float, mean: float, high: float) -> tuple[float, float, float]:
    """(c, mu, sigma) of ``c + LogNormal(mu, sigma)`` whose 20-rollout min/mean/max are these.

    Blom's positions: min ~ c + e^(mu - 1.867 sigma), max ~ c + e^(mu + 1.867 sigma),
    mean = c + e^(mu + sigma²/2); so ``(max-c)/(min-c) = e^(3.734 sigma)`` and
    ``(mean-c)² / ((max-c)(min-c)) = e^(sigma²)``; ``c`` by bisection on [0, min).
    """

    def gap(c: float) -> float:
        sigma = math.log((high - c) / (low - c)) / (2 * _BLOM_20)
        return math.log((mean - c) ** 2 / ((high - c) * (low - c))) - sigma**2

    lo, hi = 0.0, low * (1 - 1e-9)
    if gap(lo) > 0:
        raise ValueError("the published range is no more skewed than a lognormal's")
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    c = (lo + hi) / 2
    sigma = math.log((high - c) / (low - c)) / (2 * _BLOM_20)
    mu = math.log(math.sqrt((high - c) * (low - c)))
    return c, mu, sigma


@dataclass(frozen=True)
class Fault:
    """A regression applied to a simulated run (the default: a healthy run)."""

    name: str = "healthy"
    late_reward_factor: float = 1.0  # reward success probabilities x this in the last third
    reward_shift: float = 0.0  # every prompt's success probability moved by this
    step_from_mid: float = 1.0  # logprob gap x this from rollout N//2 on
    kl_scale: float = 1.0
    spike_rate: float = 0.0


HEALTHY = Fault()

FEARED: tuple[Fault, ...] = (
    Fault("late_collapse", late_reward_factor=0.5),
    Fault("step", step_from_mid=1.25),
    Fault("drop08", reward_shift=-0.08),
    Fault("drop05", reward_shift=-0.05),
    Fault("kl2", kl_scale=2.0),
    Fault("spike05", spike_rate=0.05),
    Fault("spike10", spike_rate=0.10),
)


def _ar1(rng: np.random.Generator, shape: tuple[int, int], rho: float) -> np.ndarray:
    """Standard normal series along the last axis with lag-1 correlation ``rho``."""
    eps = rng.standard_normal(shape)
    if rho == 0.0:
        return eps
    out = np.empty(shape)
    out[:, 0] = eps[:, 0]
    scale = math.sqrt(1.0 - rho * rho)
    for t in range(1, shape[1]):
        out[:, t] = rho * out[:, t - 1] + scale * eps[:, t]
    return out


@dataclass(frozen=True)
class HonestModel:
    """Draws replicates; see the module doc."""

    base: NoiseModel  # simulate.fit of the patched baseline
    logprob: dict[str, tuple[float, float]]  # variant -> lognormal (mu, sigma) of the gap
    kl_skewed: tuple[float, float, float]
    noise: Noise = CHOSEN

    def prompts(self, rng: np.random.Generator, rollouts: int) -> np.ndarray:
        """One prompt sequence: success probabilities (rollouts, 8)."""
        return rng.beta(self.base.prompt_a, self.base.prompt_b, size=(rollouts, GROUPS))

    def runs(
        self,
        prompts: np.ndarray,
        count: int,
        variant: str,
        rng: np.random.Generator,
        fault: Fault = HEALTHY,
    ) -> dict[str, np.ndarray]:
        """``count`` runs of ``variant`` on ``prompts``: metric -> array (count, rollouts)."""
        noise = self.noise
        n = prompts.shape[0]
        shape = (count, n)
        p = prompts[None, :, :] + rng.normal(0.0, noise.run_reward, (count, 1, 1))
        p = p + fault.reward_shift
        if fault.late_reward_factor != 1.0:
            late = n - n // 3
            p[:, late:, :] *= fault.late_reward_factor
        reward = rng.binomial(PER_GROUP, np.clip(p, 0.0, 1.0)).sum(axis=2) / SAMPLES

        mu, sigma = self.logprob[variant]
        run = rng.normal(-(noise.run_logprob**2) / 2, noise.run_logprob, (count, 1))
        logprob = np.exp(mu + sigma * _ar1(rng, shape, noise.rho) + run)
        if fault.step_from_mid != 1.0:
            logprob[:, n // 2 :] *= fault.step_from_mid
        if fault.spike_rate:
            spikes = rng.random(shape) < fault.spike_rate
            logprob = np.where(spikes, SPIKE_THRESHOLD + rng.exponential(0.1, shape), logprob)

        run_kl = rng.normal(-(noise.run_kl**2) / 2, noise.run_kl, (count, 1))
        if noise.kl_shape == "skewed":
            c, kmu, ksigma = self.kl_skewed
            kl = (c + np.exp(kmu + ksigma * _ar1(rng, shape, noise.rho))) * np.exp(run_kl)
        else:
            kmu, ksigma = self.base.kl
            kl = np.exp(kmu + ksigma * _ar1(rng, shape, noise.rho) + run_kl)
        kl = kl * fault.kl_scale

        length, truncated = self.base.lengths(rng, shape)
        grad = np.exp(math.log(0.2) + 0.3 * _ar1(rng, shape, noise.rho))
        return metrics(logprob, reward, kl, length, truncated, grad)


def honest_model(patched: Baseline, stock: Baseline, noise: Noise = CHOSEN) -> HonestModel:
    """The honest model of both variants, fitted to the shipped baselines' published data."""
    from tests.support.simulate import fit

    base = fit(patched)
    gaps = {}
    for name, baseline in (("patched", patched), ("stock", stock)):
        spread = spread_of(baseline, LOGPROB)
        gaps[name] = lognormal_params(spread.mean, spread.sd)
    kl = patched.summaries[KL]
    skew = skewed_kl(float(kl["min"]), float(kl["mean"]), float(kl["max"]))
    return HonestModel(base=base, logprob=gaps, kl_skewed=skew, noise=noise)
