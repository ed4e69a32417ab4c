"""Proposed statistics for issue 19: tests whose error rates hold with run effects and autocorrelation.

Pure functions on plain lists (what a rule kind calls), not yet rule kinds: they wait for the
rule package (``miles_amd.rules``) to land, then each becomes one kind there (fields,
validation, check, expected sentence, plot hint). ``benchmarks/bench_calibration.py``
measures them beside today's gate on the same simulated runs. Each states the derivation
of its tolerance:

- :func:`mean_bound` (logprob gap, KL): the run's mean against the reference's with the
  variance of the difference of two run means, ``sd²·φ·(1/N + 1/n_ref) + 2·(run·m)²``:
  ``sd`` the reference's per-rollout sd, ``φ = (1+ρ)/(1-ρ)`` the AR(1) variance inflation of
  a mean, ``run`` the declared relative run-level sd (``miles_amd.testing.honest.Noise``),
  ``m`` the reference mean; fails beyond ``z`` such SEs. One-sided upward for the KL (a
  smaller train/rollout mismatch is no regression).
- :func:`max_bound`: the run's max at most ``m + (E[max_N] + z)·sd + z·sqrt(sd²·φ/n_ref +
  2·(run·m)²)``: the within-run max of today's bound plus the level difference of two runs.
  ``log=True`` applies it to the logarithms (a right-skewed metric such as the KL).
- :func:`suffix_step_z` (logprob gap, one-sided rising): the largest standardized rise of the
  mean of the last ``N - c`` rollouts over the first ``c``, for ``c`` in the splits the
  maintainers fear (mid-run and the last third), with the reference's sd and ``φ``; a run
  level cancels, so run effects cost nothing. Tolerance: Bonferroni over the splits,
  ``Φ⁻¹(1 - α/looks)``.
- :func:`paired_drop_z` (reward, one-sided): the mean paired difference run - reference on
  the same prompts, the reference pooled with the other published run's mean (same
  prompts), with the exact binomial standard error of 64 samples a rollout: per rollout
  ``q/64`` with ``q = E[p(1-p)] = m(1-m) - v_p`` (``v_p`` the prompt-difficulty variance
  from the reference series, ``(s² - m(1-m)/64)·64/7``) plus the declared run effect;
  not the observed spread, so a partial collapse cannot inflate its own error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

from miles_amd.baseline.bands import expected_max


def inflation(rho: float) -> float:
    """``(1 + ρ)/(1 - ρ)``: how much AR(1) lag-1 correlation ``ρ`` inflates a mean's variance."""
    return (1.0 + rho) / (1.0 - rho)


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = math.fsum(values) / n
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def mean_z(
    run: Sequence[float],
    reference: Sequence[float],
    *,
    run_sd: float,
    rho: float,
    log: bool = False,
) -> float:
    """The run mean's distance from the reference mean in SEs of their difference.

    ``log``: of the logarithms (a right-skewed metric; ``run_sd`` is then on the log scale).
    """
    if log:
        run, reference = [math.log(v) for v in run], [math.log(v) for v in reference]
        m, sd = _mean_sd(reference)
        var = sd * sd * inflation(rho) * (1 / len(run) + 1 / len(reference)) + 2 * run_sd**2
        return (math.fsum(run) / len(run) - m) / math.sqrt(var)
    m, sd = _mean_sd(reference)
    phi = inflation(rho)
    var = sd * sd * phi * (1 / len(run) + 1 / len(reference)) + 2 * (run_sd * m) ** 2
    return (math.fsum(run) / len(run) - m) / math.sqrt(var)


def max_bound(
    reference: Sequence[float], n_run: int, *, run_sd: float, rho: float, z: float, log: bool
) -> float:
    """The upper bound for a run's max (``log``: on the logarithms, returned exponentiated)."""
    values = [math.log(v) for v in reference] if log else list(reference)
    m, sd = _mean_sd(values)
    level_var = sd * sd * inflation(rho) / len(values) + 2 * run_sd**2 * (1 if log else m * m)
    high = m + (expected_max(n_run) + z) * sd + z * math.sqrt(level_var)
    return math.exp(high) if log else high


def suffix_step_z(
    run: Sequence[float], reference: Sequence[float], *, run_sd: float, rho: float
) -> float:
    """The largest standardized rise of a suffix's mean (starts N//2 and N - N//3).

    The level the suffix is compared with is the inverse-variance weighted mean of the run's
    head (variance ``φ·sd²/c``) and the reference mean (``φ·sd²/n_ref + 2·(run·m)²``).
    """
    n = len(run)
    m, sd = _mean_sd(reference)
    phi = inflation(rho)
    v_ref = phi * sd * sd / len(reference) + 2 * (run_sd * m) ** 2
    best = -math.inf
    for c in sorted({n // 2, n - n // 3}):
        if c < 2 or n - c < 2:
            continue
        head = math.fsum(run[:c]) / c
        tail = math.fsum(run[c:]) / (n - c)
        v_head = phi * sd * sd / c
        v_level = 1.0 / (1.0 / v_head + 1.0 / v_ref)
        level = v_level * (head / v_head + m / v_ref)
        best = max(best, (tail - level) / math.sqrt(phi * sd * sd / (n - c) + v_level))
    return best if math.isfinite(best) else 0.0


def scan_threshold(alpha: float, looks: int = 2) -> float:
    """Bonferroni: the one-sided normal quantile at ``alpha / looks``."""
    return NormalDist().inv_cdf(1.0 - alpha / looks)


def prompt_variance(reference: Sequence[float], samples: int, groups: int) -> float:
    """The prompt-difficulty variance ``v_p`` of a reward series (method of moments, >= 0)."""
    m, sd = _mean_sd(reference)
    per_group = samples // groups
    return max(0.0, (sd * sd - m * (1 - m) / samples) * samples / (per_group - 1))


def paired_drop_z(
    run: Sequence[float],
    reference: Sequence[float],
    *,
    other_mean: float | None,
    samples: int,
    groups: int,
    run_sd: float,
) -> float:
    """The paired reward difference in SEs (negative: a drop); see the module doc."""
    n = min(len(run), len(reference))
    if n == 0:
        return 0.0
    m_ref = math.fsum(reference) / len(reference)
    q = max(m_ref * (1 - m_ref) - prompt_variance(reference, samples, groups), 1e-12)
    per = q / samples
    ref_part = math.fsum(reference[:n]) / n
    var = per / n + per / n + 2 * run_sd**2
    if other_mean is not None:
        # the reference level is the average of the two published runs on these prompts
        ref_part = ref_part + (other_mean - m_ref) / 2
        var = per / n + per / (4 * n) + per / (4 * len(reference)) + 1.5 * run_sd**2
    return (math.fsum(run[:n]) / n - ref_part) / math.sqrt(var)
