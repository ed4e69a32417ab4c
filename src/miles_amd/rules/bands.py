"""Bands: the statistics a tolerance is derived with from the reference's spread.

Decides a rollout's spread (the series, a published min/max by Tippett's ``d2``, or a bounded
quantity by Bhatia-Davis; on the log scale too), a run mean's band and a run max's bound (edges
rounded outward to 4 significant digits), the paired effects and the reward's sd floor, so the
shipped files and ``baseline record`` derive bands alike. The formulas:
``docs/gate-and-statistics.md`` ("How tolerances are derived").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from functools import cache
from statistics import NormalDist
from typing import Any, Literal

from miles_amd.rules.model import Baseline, Params, Rule

SIGNIFICANT_DIGITS = 4


@dataclass(frozen=True)
class Band:
    """A closed interval; ``None`` on a side means unbounded on that side. NaN is in none."""

    low: float | None
    high: float | None

    def contains(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if self.low is not None and not value >= self.low:
            return False
        return not (self.high is not None and not value <= self.high)

    def describe(self) -> str:
        if self.low is None and self.high is None:
            return "any value"
        if self.low is None:
            return f"≤ {self.high:.4g}"
        if self.high is None:
            return f"≥ {self.low:.4g}"
        return f"[{self.low:.4g}, {self.high:.4g}]"


@dataclass(frozen=True)
class Spread:
    """Per-rollout spread of one metric in a reference run."""

    mean: float
    sd: float
    n: int  # rollouts the reference mean was taken over
    how: str  # one line: where ``sd`` came from


@dataclass(frozen=True)
class PairedEffect:
    """Mean per-rollout difference (run - reference) over the paired rollouts."""

    mean_diff: float
    se: float
    n: int
    sd_observed: float | None  # sample sd of the differences; None below 2 pairs
    sd_binomial_floor: float

    @property
    def z(self) -> float:
        """The effect in standard errors (``inf`` when the SE is 0 and the effect is not)."""
        if self.se > 0:
            return self.mean_diff / self.se
        return 0.0 if self.mean_diff == 0 else math.copysign(math.inf, self.mean_diff)


def t_quantile(p: float, dof: float) -> float:
    """Student's t quantile by the Cornish-Fisher expansion (dof >= 1; within 0.002 of the
    exact value at 19 dof, 0.01 at 5): scipy.stats' import would cost the gate 0.4 s."""
    if dof < 1:
        raise ValueError("t needs dof >= 1")
    z, v = NormalDist().inv_cdf(p), float(dof)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


@cache
def expected_range(n: int) -> float:
    """Tippett's ``d2(n)``, the expected range of ``n`` standard normals: twice their max."""
    if n < 2:
        raise ValueError(f"the range of {n} draws is undefined; need n >= 2")
    return 2.0 * expected_max(n)


@cache
def expected_max(n: int) -> float:
    """Expected maximum of ``n`` standard normals, ``∫ x·n·φ(x)·Φ(x)^(n-1) dx`` on [-12, 12]
    to 1e-13 (the integrand vanishes beyond for any n below 10**9)."""
    if n < 1:
        raise ValueError(f"the max of {n} draws is undefined; need n >= 1")
    if n == 1:
        return 0.0
    from scipy.integrate import quad  # not scipy.stats: its import costs the gate 0.4 s

    def density(x: float) -> float:
        cdf = 0.5 * math.erfc(-x / math.sqrt(2.0))
        return x * n * math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi) * cdf ** (n - 1)

    return float(quad(density, -12.0, 12.0, limit=200, epsabs=1e-14, epsrel=1e-13)[0])


def round_outward(value: float, *, up: bool, digits: int = SIGNIFICANT_DIGITS) -> float:
    """Round to ``digits`` significant digits, up (ceiling) or down (floor)."""
    if value == 0 or not math.isfinite(value):
        return value
    exact = Decimal(repr(value))
    quantum = Decimal(1).scaleb(exact.adjusted() - (digits - 1))
    return float(exact.quantize(quantum, rounding=ROUND_CEILING if up else ROUND_FLOOR))


def series_spread(values: Sequence[float]) -> Spread:
    """Spread from a published per-rollout series: its mean and sample sd (n - 1)."""
    n = len(values)
    if n < 2 or not all(math.isfinite(v) for v in values):
        raise ValueError("a spread needs at least 2 finite values")
    mean = math.fsum(values) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    return Spread(mean, sd, n, f"sample sd of the {n}-rollout series")


def range_spread(mean: float, low: float, high: float, n: int) -> Spread:
    """Spread from a published mean and min/max of ``n`` rollouts: ``sd = (max-min)/d2(n)``."""
    if not low <= mean <= high:
        raise ValueError(f"mean {mean} outside its published range [{low}, {high}]")
    d2 = expected_range(n)
    how = f"(max - min) / d2({n}) = ({high} - {low}) / {d2:.4f}"
    return Spread(mean, (high - low) / d2, n, how)


def bounded_spread(mean: float, lower: float, upper: float, *, groups: int, n: int) -> Spread:
    """Worst-case spread of a rollout mean of a per-sample quantity in ``[lower, upper]``:
    Bhatia-Davis' ``(upper - mean)(mean - lower)`` over ``groups`` independent prompt groups."""
    if not lower <= mean <= upper:
        raise ValueError(f"mean {mean} outside its bounds [{lower}, {upper}]")
    sd = math.sqrt((upper - mean) * (mean - lower) / groups)
    how = f"Bhatia-Davis bound sqrt(({upper} - m)(m - {lower}) / {groups} prompt groups)"
    return Spread(mean, sd, n, how)


def spread_of(baseline: Baseline, metric: str) -> Spread:
    """Per-rollout spread of ``metric`` in the reference run: its series first; else a
    summary's stated ``sd``, its min/max, or its bounds."""
    if metric in baseline.series:
        return series_spread(baseline.series[metric])
    summary = baseline.summaries.get(metric)
    if summary is None:
        raise KeyError(f"no series or summary for {metric}")
    mean, n = float(summary["mean"]), int(summary["n"])
    if "sd" in summary:
        return Spread(mean, float(summary["sd"]), n, str(summary["sd_source"]))
    if "min" in summary and "max" in summary:
        return range_spread(mean, float(summary["min"]), float(summary["max"]), n)
    if "bounds" in summary:
        lower, upper = (float(b) for b in summary["bounds"])
        groups = baseline.run_shape.prompts_per_rollout
        return bounded_spread(mean, lower, upper, groups=groups, n=n)
    raise KeyError(f"summary of {metric} has no sd, min/max or bounds")


def log_spread(baseline: Baseline, metric: str) -> Spread:
    """The reference's per-rollout spread of ``ln(metric)``: its series' logarithms, else a
    min/mean/max summary's ``ln(max/min)/d2(n)`` around ``ln(mean) - sd²/2`` (lognormal)."""
    if metric in baseline.series:
        values = baseline.series[metric]
        if min(values) <= 0:
            raise ValueError(f"a non-positive reference value of {metric} has no logarithm")
        return series_spread([math.log(v) for v in values])
    summary = baseline.summaries.get(metric, {})
    if not {"min", "mean", "max", "n"} <= set(summary) or float(summary["min"]) <= 0:
        raise KeyError(f"no series and no positive min/mean/max summary of {metric}")
    n = int(summary["n"])
    sd = math.log(float(summary["max"]) / float(summary["min"])) / expected_range(n)
    mean = math.log(float(summary["mean"])) - sd * sd / 2
    return Spread(mean, sd, n, f"ln(max/min) / d2({n}) of the published summary")


@cache
def mean_variance(n: int, rho: float) -> float:
    """``Var(mean of n rollouts) / σ²`` of a stationary AR(1) series with lag-1 ``rho``."""
    if rho == 0.0:
        return 1.0 / n
    square = (1.0 / n) ** 2
    total = math.fsum([square] * n)
    for lag in range(1, n):
        r = rho**lag
        if r == 0.0:
            break
        total += 2 * r * math.fsum([square] * (n - lag))
    return total


def mean_half_width(
    spread: Spread, n_run: int, k: float, run_sd: float = 0.0, rho: float = 0.0
) -> float:
    """``k`` standard errors of the difference of a run's mean and the reference's."""
    var = spread.sd**2 * (mean_variance(n_run, rho) + mean_variance(spread.n, rho))
    return k * math.sqrt(var + 2.0 * (run_sd * spread.mean) ** 2)


def mean_band(
    spread: Spread,
    n_run: int,
    k: float,
    cover: Iterable[float] = (),
    run_sd: float = 0.0,
    rho: float = 0.0,
) -> Band:
    """Band for the mean of ``n_run`` rollouts, widened to cover every value in ``cover``."""
    if n_run < 1:
        raise ValueError(f"a mean of {n_run} rollouts is undefined")
    half = mean_half_width(spread, n_run, k, run_sd, rho)
    half = max([half, *(abs(c - spread.mean) for c in cover)])
    return Band(
        round_outward(spread.mean - half, up=False), round_outward(spread.mean + half, up=True)
    )


def max_reach(spread: Spread, n_run: int, k: float, run_sd: float = 0.0) -> float:
    """How far above the centre a run's max may lie: ``(E[max_n] + k)·sd + k·√2·run_sd·m``."""
    level = k * math.sqrt(2.0) * run_sd * abs(spread.mean)
    return (expected_max(n_run) + k) * spread.sd + level


def max_band(
    spread: Spread, n_run: int, k: float, cover: Iterable[float] = (), run_sd: float = 0.0
) -> Band:
    """Upper bound for the max of ``n_run`` rollouts, ``mean + max_reach``, raised to cover
    every value in ``cover`` (the other published run's max)."""
    high = max([spread.mean + max_reach(spread, n_run, k, run_sd), *cover])
    return Band(None, round_outward(high, up=True))


def _mean_sd(values: Sequence[float]) -> tuple[float, float | None]:
    """(mean, sample variance; None below 2 values)."""
    n = len(values)
    mean = math.fsum(values) / n
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1) if n >= 2 else None
    return mean, var


def paired_effect(
    run: Sequence[float], reference: Sequence[float], *, samples_per_rollout: int
) -> PairedEffect:
    """Paired comparison of per-rollout fractions (element ``i`` of each: rollout ``i``, the
    same prompts); the SE the larger of the observed spread and the binomial floor."""
    if len(run) != len(reference) or not run:
        raise ValueError("paired series must be non-empty and of equal length")
    n = len(run)
    mean_diff, observed_var = _mean_sd([r - b for r, b in zip(run, reference, strict=True)])
    p_run, p_ref = math.fsum(run) / n, math.fsum(reference) / n
    floor_var = max((p_run * (1 - p_run) + p_ref * (1 - p_ref)) / samples_per_rollout, 0.0)
    var = floor_var if observed_var is None else max(observed_var, floor_var)
    return PairedEffect(
        mean_diff=mean_diff,
        se=math.sqrt(var / n),
        n=n,
        sd_observed=None if observed_var is None else math.sqrt(observed_var),
        sd_binomial_floor=math.sqrt(floor_var),
    )


def prompt_variance(reference: Sequence[float], samples: int, groups: int) -> float:
    """The prompt-difficulty variance ``v_p`` of a reward series (method of moments, >= 0):
    ``(s² - m(1-m)/samples)·samples/(samples/groups - 1)``."""
    m, s2 = _mean_sd(reference)
    assert s2 is not None
    return max(0.0, (s2 - m * (1 - m) / samples) * samples / (samples // groups - 1))


def _per_rollout_binomial(reference: Sequence[float], samples: int, groups: int) -> float:
    """``q / samples`` with ``q = E[p(1-p)] = m(1-m) - v_p`` of the reference series."""
    m_ref = math.fsum(reference) / len(reference)
    return max(m_ref * (1 - m_ref) - prompt_variance(reference, samples, groups), 0.0) / samples


def paired_drop(
    run: Sequence[float],
    reference: Sequence[float],
    *,
    samples_per_rollout: int,
    groups: int,
    run_sd: float,
    pool: float | None,
) -> PairedEffect:
    """One-sided paired effect of a reward fraction with its exact binomial SE
    (:func:`paired_drop_variance`); ``run`` pairs with the first values of ``reference``
    (the whole reference series); with ``pool`` the level is averaged with the other run's.
    The observed spread is reported, not used: a collapse would inflate it and hide itself."""
    n = len(run)
    if n == 0 or n > len(reference):
        raise ValueError("paired series must be non-empty and no longer than the reference")
    level = math.fsum(reference[:n]) / n
    if pool is not None:
        level += (pool - math.fsum(reference) / len(reference)) / 2
    var = paired_drop_variance(
        reference,
        n,
        samples_per_rollout=samples_per_rollout,
        groups=groups,
        run_sd=run_sd,
        pool=pool,
    )
    _, observed = _mean_sd([r - b for r, b in zip(run, reference[:n], strict=True)])
    per = _per_rollout_binomial(reference, samples_per_rollout, groups)
    return PairedEffect(
        mean_diff=math.fsum(run) / n - level,
        se=math.sqrt(var),
        n=n,
        sd_observed=None if observed is None else math.sqrt(observed),
        sd_binomial_floor=math.sqrt(2 * per),
    )


def paired_drop_variance(
    reference: Sequence[float],
    n: int,
    *,
    samples_per_rollout: int,
    groups: int,
    run_sd: float,
    pool: float | None,
) -> float:
    """The variance of :func:`paired_drop`'s difference over the first ``n`` paired
    rollouts: ``2q/(samples·n) + 2·run_sd²``, or with ``pool`` ``q/samples·(2/n -
    1/(2·n_ref)) + 1.5·run_sd²``."""
    per = _per_rollout_binomial(reference, samples_per_rollout, groups)
    if pool is None:
        return 2 * per / n + 2 * run_sd**2
    return per * (2 / n - 1 / (2 * len(reference))) + 1.5 * run_sd**2


def single_token_fraction(samples_per_rollout: int, max_response_tokens: int) -> float:
    """Smallest non-zero per-token rate one token makes in a rollout: one flagged token in a
    longest response, ``1 / (samples_per_rollout · max_response_tokens)``."""
    return 1.0 / (samples_per_rollout * max_response_tokens)


def derivation_text(
    method: str,
    origin: str,
    n_ref: int,
    k: float,
    cover: str,
    run_sd: float = 0.0,
    rho: float = 0.0,
) -> str:
    """The derivation sentence of a band of ``method``; ``origin`` says where centre and sd
    came from, ``cover`` is the covered values as text."""
    if method == "mean_band":
        if run_sd or rho:
            formula = (
                f"center ± k·sqrt(sd²·(V(N) + V({n_ref})) + 2·(run_sd·center)²) with k = {k:g}, "
                f"run_sd = {run_sd:g} (a run-level effect) and V(n) the variance of a mean of "
                f"n rollouts with lag-1 autocorrelation rho = {rho:g}"
            )
        else:
            formula = f"center ± k·sd·sqrt(1/N + 1/{n_ref}) with k = {k:g}"
        return (
            f"{origin}; band = {formula}, widened to cover {cover}; edges rounded outward to 4 "
            "significant digits; rescaled for N rollouts by miles_amd.rules.bands.mean_band"
        )
    level = f" + k·√2·run_sd·center with run_sd = {run_sd:g}" if run_sd else ""
    return (
        f"{origin}; upper bound = center + (E[max of N standard normals] + k)·sd{level} with "
        f"k = {k:g} (E = {expected_max(n_ref):.4f} for N = {n_ref}), raised to cover {cover}; "
        "no lower bound; rounded up to 4 significant digits; rescaled for N rollouts by "
        "miles_amd.rules.bands.max_band"
    )


def binomial_sd_floor(mean: float, samples_per_rollout: int, n_run: int, z: float) -> float:
    """Smallest plausible sample sd of ``n_run`` rollout fractions of a working 0/1 reward:
    ``sqrt(m(1-m)/samples)·sqrt(χ²_{n_run-1}(Φ(-z)) / (n_run-1))``, the chi-square quantile
    by Wilson-Hilferty (clamped at 0: conservative); 0 below 2 rollouts; rounded down."""
    if n_run < 2:
        return 0.0
    dof = n_run - 1
    c = 2.0 / (9.0 * dof)
    quantile = dof * max(0.0, 1.0 - c - z * math.sqrt(c)) ** 3
    binomial_sd = math.sqrt(mean * (1.0 - mean) / samples_per_rollout)
    return round_outward(binomial_sd * math.sqrt(quantile / dof), up=False)


@dataclass(frozen=True)
class Derive:
    """How a rule's band is computed from the baseline's evidence."""

    method: Literal["mean_band", "max_band"]
    k: float
    cover: tuple[float, ...] = ()
    run_sd: float = 0.0  # relative sd of a run-level effect
    rho: float = 0.0  # lag-1 autocorrelation of the per-rollout values (mean_band only)


@dataclass(frozen=True)
class BandParams(Params):
    band: Band
    derive: Derive

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> BandParams:
        d = raw["derive"]  # the schema holds its keys to Derive's
        return cls(Band(**raw["band"]), Derive(**{**d, "cover": tuple(d.get("cover", ()))}))

    def to_json(self) -> dict[str, Any]:
        derive = {k: v for k, v in asdict(self.derive).items() if v or k in ("k", "cover")}
        return {"band": asdict(self.band), "derive": {**derive, "cover": list(self.derive.cover)}}


def band_for(rule: Rule, baseline: Baseline, n_rollouts: int, z: float | None = None) -> Band:
    """The band of a band rule for a run of ``n_rollouts`` (the written one at
    ``run_shape.rollouts``; the loader checked they agree); with ``z``, a mean band's bound at
    a look: ``z`` standard errors, widened to cover the ``cover`` values as the written one."""
    assert rule.metric is not None
    d = BandParams.of(rule).derive
    spread = spread_of(baseline, rule.metric)
    if d.method == "mean_band":
        return mean_band(spread, n_rollouts, d.k if z is None else z, d.cover, d.run_sd, d.rho)
    return max_band(spread, n_rollouts, d.k, d.cover, d.run_sd)
