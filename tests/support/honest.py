"""An honest noise model: the reference is simulated too, with run effects and autocorrelation.

Benchmark support (``benchmarks/bench_calibration.py``; issue 19). A replicate is one prompt
sequence (per rollout 8 difficulties from ``simulate.fit``'s ``Beta``) shared by a simulated
patched and stock reference (each the other's ``cover`` run) and ``k`` test runs of each
variant, so the reference's sampling error enters the figures. On top of ``simulate``'s
per-rollout model every run has a run-level random effect (the logprob gap and the KL times
``exp(u)``, every prompt's success probability shifted), lag-1 autocorrelation ``rho`` of the
log-scale gap, KL and grad norm (AR(1), marginal spread unchanged), and optionally a skewed KL
(``c + LogNormal`` fitted to the published min / mean / max by Blom's positions). It judges and
records nothing. The sizes and where they come from: ``baselines/README.md``'s table.
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
    """The sizes of the effects the per-rollout model lacks, each chosen from the published
    data (``baselines/README.md``); the benchmark's sensitivity table scales them."""

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
