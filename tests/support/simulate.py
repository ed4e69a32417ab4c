"""A noise model of a healthy gpt-oss-20b LoRA GRPO run, fitted to the published evidence.

Test and benchmark support: it draws simulated runs' per-rollout values and injects
regressions; it judges nothing (the real ``miles_amd.judge.gate`` does) and the gate never
imports it. What it fits, from which published numbers: ``baselines/README.md`` ("How often the
gate is wrong"). In short: the reward is 8 prompt groups x 8 samples of a 0/1 reward, each
prompt's ``p ~ Beta(a, b)`` with ``a + b`` from the series' sd by the method of moments, and
rollouts 0..19 see the published run's prompts (difficulties drawn from the posterior given
that rollout's published reward, so a simulated run pairs like a real one); the logprob gap
and the KL lognormal with the published mean and spread; a prompt's truncation probability
``Beta`` with the published mean (a truncated sample is 4096 tokens, the others normal around
the length that gives the published mean); clipfrac 0; grad norm lognormal around 0.2.
Regressions: a steady logprob-gap drift of ``±drift_sd`` per-rollout sds across the run (the
mean unchanged) and a constant reward (the published mean rounded to k/64).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from miles_amd.evidence.types import JobRecord, RunEvidence
from miles_amd.rules.bands import spread_of
from miles_amd.rules.model import Baseline

LOGPROB = "train/train_rollout_logprob_abs_diff"
REWARD = "rollout/raw_reward"
KL = "train/train_rollout_kl"
RESPONSE_LEN = "rollout/response_len/mean"
TRUNCATED = "rollout/truncated_ratio"
CLIPFRAC = "train/pg_clipfrac"
GRAD_NORM = "train/grad_norm"

GROUPS = 8  # prompts per rollout
PER_GROUP = 8  # samples per prompt
SAMPLES = GROUPS * PER_GROUP
MAX_TOKENS = 4096
SPIKE_THRESHOLD = 0.15
POSTERIOR_DRAWS = 40_000  # proposals per reference rollout (1% to 6% are kept)


@dataclass(frozen=True)
class Regression:
    """What is wrong with a simulated run; the default is a healthy run."""

    name: str = "healthy"
    drift_sd: float = 0.0
    constant_reward: bool = False


HEALTHY = Regression()


def lognormal_params(mean: float, sd: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and sd."""
    sigma2 = float(np.log1p((sd / mean) ** 2))
    return float(np.log(mean) - sigma2 / 2), float(np.sqrt(sigma2))


@dataclass(frozen=True)
class NoiseModel:
    """The fitted healthy run; see the module doc."""

    reward_counts: tuple[int, ...]  # the reference's per-rollout reward x 64
    prompt_a: float
    prompt_b: float
    logprob: tuple[float, float]  # lognormal (mu, sigma)
    kl: tuple[float, float]
    truncated_mean: float
    untruncated_len: float
    seed: int = 12

    @property
    def reward_mean(self) -> float:
        return self.prompt_a / (self.prompt_a + self.prompt_b)

    @cached_property
    def posterior_prompts(self) -> tuple[np.ndarray, ...]:
        """Per reference rollout, prompt-difficulty vectors (k, 8) consistent with its reward."""
        rng = np.random.default_rng(self.seed)
        pools = []
        for count in self.reward_counts:
            p = rng.beta(self.prompt_a, self.prompt_b, size=(POSTERIOR_DRAWS, GROUPS))
            k = rng.binomial(PER_GROUP, p).sum(axis=1)
            pools.append(p[k == count])
        return tuple(pools)

    def simulate(
        self, runs: int, rollouts: int, rng: np.random.Generator, regression: Regression = HEALTHY
    ) -> dict[str, np.ndarray]:
        """``runs`` simulated runs of ``rollouts`` rollouts: metric -> array (runs, rollouts)."""
        shape = (runs, rollouts)
        prompts = rng.beta(self.prompt_a, self.prompt_b, size=(runs, rollouts, GROUPS))
        for i, pool in enumerate(self.posterior_prompts[:rollouts]):
            prompts[:, i, :] = pool[rng.integers(0, len(pool), size=runs)]
        reward = rng.binomial(PER_GROUP, np.clip(prompts, 0.0, 1.0)).sum(axis=2) / SAMPLES
        if regression.constant_reward:
            reward = np.full(shape, round(self.reward_mean * SAMPLES) / SAMPLES)
        mu, sigma = self.logprob
        logprob = rng.lognormal(mu, sigma, size=shape)
        if regression.drift_sd:
            sd = float(np.exp(mu + sigma**2 / 2) * np.sqrt(np.expm1(sigma**2)))
            ramp = np.linspace(-1.0, 1.0, rollouts) if rollouts > 1 else np.zeros(1)
            logprob = logprob + regression.drift_sd * sd * ramp
        kl = rng.lognormal(*self.kl, size=shape)
        length, truncated = self.lengths(rng, shape)
        grad = rng.lognormal(np.log(0.2), 0.3, size=shape)
        return metrics(logprob, reward, kl, length, truncated, grad)

    def lengths(
        self, rng: np.random.Generator, shape: tuple[int, int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """(mean response length, truncated ratio), each ``shape`` (runs, rollouts): per
        prompt group a truncation probability ``t ~ Beta`` with the published mean and the
        reward's concentration; a truncated sample is 4096 tokens, the others normal."""
        concentration = self.prompt_a + self.prompt_b
        t = rng.beta(
            self.truncated_mean * concentration,
            (1 - self.truncated_mean) * concentration,
            size=(*shape, GROUPS, 1),
        )
        truncated = rng.random((*shape, GROUPS, PER_GROUP)) < t
        lengths = np.clip(rng.normal(self.untruncated_len, 700.0, truncated.shape), 1, 4095)
        lengths = np.where(truncated, MAX_TOKENS, np.round(lengths))
        return lengths.mean(axis=(2, 3)), truncated.mean(axis=(2, 3))


def metrics(
    logprob: np.ndarray,
    reward: np.ndarray,
    kl: np.ndarray,
    length: np.ndarray,
    truncated: np.ndarray,
    grad_norm: np.ndarray,
) -> dict[str, np.ndarray]:
    """A simulated run's metrics by name (clipfrac 0: one optimizer step a rollout)."""
    return {
        LOGPROB: logprob,
        REWARD: reward,
        KL: kl,
        RESPONSE_LEN: length,
        TRUNCATED: truncated,
        CLIPFRAC: np.zeros(logprob.shape),
        GRAD_NORM: grad_norm,
    }


def fit(patched: Baseline) -> NoiseModel:
    """Fit the model to the patched baseline's series and summaries (see the module doc)."""
    rewards = np.asarray(patched.series[REWARD])
    m, s2 = float(rewards.mean()), float(rewards.var(ddof=1))
    var_p = (s2 - m * (1 - m) / SAMPLES) * SAMPLES / (PER_GROUP - 1)
    concentration = m * (1 - m) / var_p - 1
    logprob = spread_of(patched, LOGPROB)
    kl = spread_of(patched, KL)
    truncated = float(patched.summaries[TRUNCATED]["mean"])
    length = float(patched.summaries[RESPONSE_LEN]["mean"])
    return NoiseModel(
        reward_counts=tuple(round(float(r) * SAMPLES) for r in rewards),
        prompt_a=m * concentration,
        prompt_b=(1 - m) * concentration,
        logprob=lognormal_params(logprob.mean, logprob.sd),
        kl=lognormal_params(kl.mean, kl.sd),
        truncated_mean=truncated,
        untruncated_len=(length - truncated * MAX_TOKENS) / (1 - truncated),
    )


def evidence(values: dict[str, np.ndarray], run: int, name: str = "sim") -> RunEvidence:
    """Run ``run`` of :meth:`NoiseModel.simulate`'s output as the evidence the gate reads."""
    series = {
        metric: tuple((i, float(v)) for i, v in enumerate(array[run]))
        for metric, array in values.items()
    }
    return RunEvidence(
        run_dir=f"{name}/{run}",
        series=series,
        sources=dict.fromkeys(series, "tensorboard"),
        job=JobRecord(job_id=f"{name}-{run}", status="SUCCEEDED"),
    )


@dataclass(frozen=True)
class Outcome:
    """How often simulated runs failed the gate, and which checks failed them."""

    runs: int
    failed: int
    by_check: dict[str, int]

    @property
    def rate(self) -> float:
        return self.failed / self.runs


def gate_outcome(
    model: NoiseModel,
    baseline: Baseline,
    *,
    runs: int,
    rollouts: int,
    seed: int,
    regression: Regression = HEALTHY,
) -> Outcome:
    """Simulate ``runs`` runs (fixed ``seed``) and judge each with the real gate."""
    from miles_amd.judge.gate import judge

    values = model.simulate(runs, rollouts, np.random.default_rng(seed), regression)
    failed, by_check = 0, dict[str, int]()
    for run in range(runs):
        verdict = judge(evidence(values, run), baseline, expected_rollouts=rollouts)
        if verdict.verdict != "pass":
            failed += 1
        for check in verdict.failures:
            by_check[check.name] = by_check.get(check.name, 0) + 1
    return Outcome(runs, failed, by_check)
