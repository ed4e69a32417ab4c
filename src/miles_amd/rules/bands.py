"""Bands: how a tolerance is derived from the reference spread, and the band kinds' check.

Decides the statistics every band of a baseline file is computed with, so the shipped files
and a later ``baseline record`` produce bands the same way, and how ``mean_within`` /
``max_within`` (``miles_amd.rules.kinds``) judge a run by them:

- a rollout's spread (:func:`spread_of`): the series, a published min/max (Tippett's ``d2``)
  or a bounded quantity (Bhatia-Davis);
- a run mean's band (:func:`mean_band`): ``center ± k·sqrt(sd²·(V(n_run) + V(n_ref)) +
  2·(run_sd·center)²)``, ``V`` from lag-1 ``rho``, widened to cover the other published
  run's mean; a run max's upper bound (:func:`max_band`), growing with the rollouts;
- band edges rounded outward (``tests/unit/test_baselines.py``);
- the paired effect (:func:`paired_effect`, :func:`paired_drop`), its SE floored by binomial
  noise;
- the loader re-derives a written band (:func:`validate_band`); a ``cover`` value may stretch
  it to at most :data:`COVER_MAX_WIDENING` times the derived reach (issue 19); at a look
  (``miles_amd.rules.looks``) a mean band is ``z`` SE of the mean of the first rollouts
  (:func:`look_band`); a max bound is the whole run's at every look.

Pure: no file is read, no run judged beyond one check. The formulas and where ``run_sd`` and
``rho`` come from: ``docs/gate-and-statistics.md`` ("How tolerances are derived").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from functools import cache
from typing import Any, Literal

from miles_amd import numeric
from miles_amd.evidence.types import Series
from miles_amd.rules.check import Check, Problem, RuleContext, fmt, passed, rule_check, steps_text
from miles_amd.rules.kind import KindSpec
from miles_amd.rules.model import Baseline, Params, Rule
from miles_amd.rules.spending import upper_tail

SIGNIFICANT_DIGITS = 4


@dataclass(frozen=True)
class Band:
    """A closed interval; ``None`` on a side means unbounded on that side."""

    low: float | None
    high: float | None

    def contains(self, value: float) -> bool:
        """True iff ``value`` lies in the band. NaN is in no band."""
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
    """Student's t quantile at ``p`` with ``dof`` (>= 1, fractional allowed) degrees of freedom,
    by the Cornish-Fisher expansion around the normal quantile (within 0.002 of the exact
    value at 19 dof, 0.01 at 5; the one expansion the step rule and ``compare`` use)."""
    if dof < 1:
        raise ValueError("t needs dof >= 1")
    from statistics import NormalDist

    z, v = NormalDist().inv_cdf(p), float(dof)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


@cache
def expected_range(n: int) -> float:
    """Tippett's ``d2(n)``: the expected range of ``n`` standard normal draws (d2(20)≈3.735),
    twice their expected max by symmetry."""
    if n < 2:
        raise ValueError(f"the range of {n} draws is undefined; need n >= 2")
    return 2.0 * expected_max(n)


@cache
def expected_max(n: int) -> float:
    """Expected maximum of ``n`` standard normal draws (0 for n=1, ≈1.8675 for n=20):
    ``∫ x·n·φ(x)·Φ(x)^(n-1) dx`` by ``scipy.integrate.quad`` on [-12, 12] (the integrand
    vanishes beyond for any n below 10**9), to 1e-13, far below the 4 significant digits
    bands are rounded to."""
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
    return Spread(
        mean, (high - low) / d2, n, f"(max - min) / d2({n}) = ({high} - {low}) / {d2:.4f}"
    )


def bounded_spread(mean: float, lower: float, upper: float, *, groups: int, n: int) -> Spread:
    """Worst-case spread of a rollout mean of a per-sample quantity bounded in ``[lower, upper]``.

    Bhatia-Davis bounds the per-sample variance by ``(upper - mean)(mean - lower)``; a rollout
    mean over ``groups`` independent prompt groups (samples of one prompt may be fully
    correlated) has at most that variance divided by ``groups``.
    """
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


def ar1_variance(weights: Sequence[float], rho: float) -> float:
    """``Var(Σ w_i·x_i) / σ²`` for a stationary AR(1) series with lag-1 correlation ``rho``."""
    n = len(weights)
    total = math.fsum(w * w for w in weights)
    for lag in range(1, n):
        r = rho**lag
        if r == 0.0:
            break
        total += 2 * r * math.fsum(weights[i] * weights[i + lag] for i in range(n - lag))
    return total


@cache
def mean_variance(n: int, rho: float) -> float:
    """``Var(mean of n rollouts) / σ²`` with lag-1 autocorrelation ``rho`` (``1/n`` at 0)."""
    if rho == 0.0:
        return 1.0 / n
    return ar1_variance([1.0 / n] * n, rho)


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
    """Band for the mean of ``n_run`` rollouts (see the module doc).

    The half width grows, if needed, to cover every value in ``cover``.
    """
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
    """Upper bound for the max of ``n_run`` rollouts: ``mean + max_reach``.

    Raised, if needed, to cover every value in ``cover`` (the other published run's max).
    """
    high = spread.mean + max_reach(spread, n_run, k, run_sd)
    high = max([high, *cover])
    return Band(None, round_outward(high, up=True))


def paired_effect(
    run: Sequence[float], reference: Sequence[float], *, samples_per_rollout: int
) -> PairedEffect:
    """Paired comparison of per-rollout fractions (same prompts at the same rollout index).

    ``run`` and ``reference`` are aligned: element ``i`` of each belongs to rollout ``i``.
    """
    if len(run) != len(reference) or not run:
        raise ValueError("paired series must be non-empty and of equal length")
    n = len(run)
    diffs = [r - b for r, b in zip(run, reference, strict=True)]
    mean_diff = math.fsum(diffs) / n
    p_run = math.fsum(run) / n
    p_ref = math.fsum(reference) / n
    floor_var = (p_run * (1 - p_run) + p_ref * (1 - p_ref)) / samples_per_rollout
    floor_var = max(floor_var, 0.0)
    observed_var = None
    if n >= 2:
        observed_var = math.fsum((d - mean_diff) ** 2 for d in diffs) / (n - 1)
    var = floor_var if observed_var is None else max(observed_var, floor_var)
    return PairedEffect(
        mean_diff=mean_diff,
        se=math.sqrt(var / n),
        n=n,
        sd_observed=None if observed_var is None else math.sqrt(observed_var),
        sd_binomial_floor=math.sqrt(floor_var),
    )


def prompt_variance(reference: Sequence[float], samples: int, groups: int) -> float:
    """The prompt-difficulty variance ``v_p`` of a reward series (method of moments, >= 0).

    A rollout's reward is ``groups`` prompts of ``samples/groups`` 0/1 samples each; its
    variance is ``v_p/groups + (m(1-m) - v_p)/samples``, so ``v_p = (s² - m(1-m)/samples)·
    samples/(samples/groups - 1)``.
    """
    n = len(reference)
    m = math.fsum(reference) / n
    s2 = math.fsum((v - m) ** 2 for v in reference) / (n - 1)
    per_group = samples // groups
    return max(0.0, (s2 - m * (1 - m) / samples) * samples / (per_group - 1))


def paired_drop(
    run: Sequence[float],
    reference: Sequence[float],
    *,
    samples_per_rollout: int,
    groups: int,
    run_sd: float,
    pool: float | None,
) -> PairedEffect:
    """One-sided paired effect of a reward fraction with its exact binomial SE.

    ``run`` holds the run's values at the rollouts ``reference`` (the full reference series)
    has, from rollout 0. Given the prompts, a rollout's reward varies by ``q/samples`` with
    ``q = E[p(1-p)] = m(1-m) - v_p`` (:func:`prompt_variance` of the reference): the
    difference of the run's and the reference's mean over ``n`` paired rollouts varies by
    ``2q/(samples·n) + 2·run_sd²``. With ``pool`` (the other published run's mean on the
    same prompts) the reference level is the average of the two runs (plus the reference's
    paired rollouts' difference to its whole mean): :func:`paired_drop_variance`,
    ``1.5·q/(samples·n) + 1.5·run_sd²`` over the whole reference. The observed spread of the
    differences is reported, not
    used: a collapse of a few rollouts would inflate it and hide itself.
    """
    n = len(run)
    if n == 0 or n > len(reference):
        raise ValueError("paired series must be non-empty and no longer than the reference")
    n_ref = len(reference)
    m_ref = math.fsum(reference) / n_ref
    per = _per_rollout_binomial(reference, samples_per_rollout, groups)
    level = math.fsum(reference[:n]) / n
    if pool is not None:
        level += (pool - m_ref) / 2
    var = paired_drop_variance(
        reference,
        n,
        samples_per_rollout=samples_per_rollout,
        groups=groups,
        run_sd=run_sd,
        pool=pool,
    )
    diffs = [r - b for r, b in zip(run, reference[:n], strict=True)]
    mean_diff = math.fsum(run) / n - level
    observed = None
    if n >= 2:
        centre = math.fsum(diffs) / n
        observed = math.sqrt(math.fsum((d - centre) ** 2 for d in diffs) / (n - 1))
    return PairedEffect(
        mean_diff=mean_diff,
        se=math.sqrt(var),
        n=n,
        sd_observed=observed,
        sd_binomial_floor=math.sqrt(2 * per),
    )


def _per_rollout_binomial(reference: Sequence[float], samples: int, groups: int) -> float:
    """``q / samples`` with ``q = E[p(1-p)] = m(1-m) - v_p`` of the reference series."""
    m_ref = math.fsum(reference) / len(reference)
    q = max(m_ref * (1 - m_ref) - prompt_variance(reference, samples, groups), 0.0)
    return q / samples


def paired_drop_variance(
    reference: Sequence[float],
    n: int,
    *,
    samples_per_rollout: int,
    groups: int,
    run_sd: float,
    pool: float | None,
) -> float:
    """The variance of :func:`paired_drop`'s difference over the first ``n`` paired rollouts:
    ``2q/(samples·n) + 2·run_sd²``, or with ``pool`` ``q/samples·(2/n - 1/(2·n_ref)) +
    1.5·run_sd²`` (the level is the first ``n`` reference rollouts' mean plus half the other
    run's difference to the whole reference, ``(pool - m_ref)/2``; the prompts cancel in
    both differences, and the reference's first ``n`` rollouts are in ``m_ref`` too:
    ``2/n + 1/(2·n_ref) - 1/n_ref``; ``1.5/n`` when ``n = n_ref``)."""
    per = _per_rollout_binomial(reference, samples_per_rollout, groups)
    if pool is None:
        return 2 * per / n + 2 * run_sd**2
    return per * (2 / n - 1 / (2 * len(reference))) + 1.5 * run_sd**2


def single_token_fraction(samples_per_rollout: int, max_response_tokens: int) -> float:
    """Smallest non-zero per-token fraction one token can produce in a rollout.

    A per-token rate (like ``train/pg_clipfrac``) is a per-sample mean over response tokens,
    averaged over samples; one flagged token in a longest response gives
    ``1 / (samples_per_rollout · max_response_tokens)``.
    """
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
    """The derivation sentence of a band of ``method`` (``mean_band``/``max_band``).

    ``origin`` says where centre and sd came from; ``cover`` is the covered values as text.
    """
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


def chi2_lower_quantile(dof: int, z: float) -> float:
    """The ``Φ(-z)`` quantile of chi-square with ``dof`` degrees of freedom (Wilson-Hilferty).

    ``dof·(1 - 2/(9·dof) - z·sqrt(2/(9·dof)))³``, clamped at 0: within a few percent of the
    exact quantile for ``dof >= 4`` and ``z <= 4``; a floor taken from it is conservative
    where it is 0 (few rollouts).
    """
    if dof < 1:
        raise ValueError(f"chi-square needs dof >= 1, got {dof}")
    c = 2.0 / (9.0 * dof)
    return dof * max(0.0, 1.0 - c - z * math.sqrt(c)) ** 3


def binomial_sd_floor(mean: float, samples_per_rollout: int, n_run: int, z: float) -> float:
    """Smallest plausible sample sd of ``n_run`` rollout fractions of a working 0/1 reward.

    A rollout's reward is a fraction of ``samples_per_rollout`` Bernoulli draws; even if
    every prompt were equally hard it varies with sd ``sqrt(m(1-m)/samples)`` (prompt
    difficulty only adds spread). The sample sd of ``n_run`` such values falls below
    ``sqrt(m(1-m)/samples)·sqrt(χ²_{n_run-1}(Φ(-z)) / (n_run-1))`` with probability
    ``Φ(-z)``. 0 below 2 rollouts (a spread is undefined). Rounded down to 4 significant
    digits, so rounding never tightens the floor.
    """
    if n_run < 2:
        return 0.0
    binomial_sd = math.sqrt(mean * (1.0 - mean) / samples_per_rollout)
    factor = math.sqrt(chi2_lower_quantile(n_run - 1, z) / (n_run - 1))
    return round_outward(binomial_sd * factor, up=False)


COVER_MAX_WIDENING = 2.0


@dataclass(frozen=True)
class Derive:
    """How a rule's band is computed from the baseline's evidence (``miles_amd.rules.bands``)."""

    method: Literal["mean_band", "max_band"]
    k: float
    cover: tuple[float, ...] = ()
    run_sd: float = 0.0  # relative sd of a run-level effect (this module)
    rho: float = 0.0  # lag-1 autocorrelation of the per-rollout values (mean_band only)


@dataclass(frozen=True)
class BandParams(Params):
    band: Band
    derive: Derive

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> BandParams:
        band, derive = raw["band"], raw["derive"]
        return cls(
            Band(band["low"], band["high"]),
            Derive(
                derive["method"],
                derive["k"],
                tuple(derive.get("cover", ())),
                derive.get("run_sd", 0.0),
                derive.get("rho", 0.0),
            ),
        )

    def to_json(self) -> dict[str, Any]:
        d = self.derive
        derive: dict[str, Any] = {"method": d.method, "k": d.k, "cover": list(d.cover)}
        derive.update({k: v for k, v in (("run_sd", d.run_sd), ("rho", d.rho)) if v})
        return {"band": {"low": self.band.low, "high": self.band.high}, "derive": derive}


def band_for(rule: Rule, baseline: Baseline, n_rollouts: int) -> Band:
    """The band of a band rule for a run of ``n_rollouts``.

    For ``n_rollouts == run_shape.rollouts`` this is the band written in the file (the
    loader checked they agree); other counts rescale it with the same method.
    """
    assert rule.metric is not None
    derive = BandParams.of(rule).derive
    spread = spread_of(baseline, rule.metric)
    if derive.method == "mean_band":
        return mean_band(spread, n_rollouts, derive.k, derive.cover, derive.run_sd, derive.rho)
    return max_band(spread, n_rollouts, derive.k, derive.cover, derive.run_sd)


def look_band(rule: Rule, baseline: Baseline, n_rollouts: int, z: float) -> Band:
    """A mean band's bound at a look (``miles_amd.rules.looks``): ``z`` standard errors of a
    mean of ``n_rollouts``, widened to cover the ``cover`` values as the written band is."""
    assert rule.metric is not None
    derive = BandParams.of(rule).derive
    spread = spread_of(baseline, rule.metric)
    return mean_band(spread, n_rollouts, z, derive.cover, derive.run_sd, derive.rho)


def mean_information(rule: Rule, baseline: Baseline, k: int, n: int) -> float:
    """The information of a mean of ``k`` rollouts against the reference: 1 / its variance."""
    assert rule.metric is not None
    derive = BandParams.of(rule).derive
    spread = spread_of(baseline, rule.metric)
    return 1.0 / mean_half_width(spread, k, 1.0, derive.run_sd, derive.rho) ** 2


def mean_nominal(rule: Rule, baseline: Baseline, n: int) -> tuple[float, int]:
    """The band's fixed-sample rate: ``k`` standard errors on each of two sides."""
    return upper_tail(BandParams.of(rule).derive.k), 2


def check_band(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    name, stat = ("mean", numeric.mean) if rule.kind == "mean_within" else ("max", max)
    n_band = ctx.rollouts if ctx.look is None else ctx.look
    if name == "mean" and ctx.limit is not None:
        band = look_band(rule, ctx.baseline, n_band, ctx.limit)
    else:  # a max bound is the whole run's at every look: what exceeds it now fails the run
        band, n_band = band_for(rule, ctx.baseline, ctx.rollouts), ctx.rollouts
    values = [v for _, v in series]
    bad = [s for s, v in series if not math.isfinite(v)]
    value = math.nan if bad else stat(values)
    ok = band.contains(value)
    detail = f"{name} {fmt(value)} of {len(values)} values; band for {n_band} rollouts"
    failing: tuple[int, ...] = tuple(bad)
    if bad:
        detail = f"{name} undefined: non-finite at {steps_text(bad)}"
    elif not ok:
        detail = f"{name} {fmt(value)} outside {band.describe()} ({len(values)} values)"
        if name == "max":
            failing = tuple(s for s, v in series if not band.contains(v))
    numbers = {"value": value}
    numbers.update({k: v for k, v in (("low", band.low), ("high", band.high)) if v is not None})
    return rule_check(
        rule, passed(ok), value, band.describe(), detail, failing_steps=failing, numbers=numbers
    )


def expected_band(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    return band_for(rule, baseline, rollouts).describe()


def reference_spread(rule: Rule, baseline: Baseline) -> str:
    assert rule.metric is not None
    derive = BandParams.of(rule).derive
    spread = spread_of(baseline, rule.metric)
    cover = ", ".join(f"{c:.6g}" for c in derive.cover)
    text = (
        f"mean {spread.mean:.6g}, sd {spread.sd:.6g}, n {spread.n} ({spread.how}); "
        f"k {derive.k:.6g}, cover [{cover}]"
    )
    if derive.run_sd or derive.rho:
        text += f", run_sd {derive.run_sd:.6g}, rho {derive.rho:.6g}"
    top = baseline.reference_max(rule.metric) if rule.kind == "max_within" else None
    return text + (f", max {top:.6g}" if top is not None else "")


def validate_band(rule: Rule, baseline: Baseline, method: str) -> Problem | None:
    """The kind's method, the written band is the derived one, no ``cover`` stretches it."""
    assert rule.metric is not None
    params = BandParams.of(rule)
    if params.derive.method != method:
        return (
            ".derive.method",
            f"{rule.kind} takes method {method}, not {params.derive.method}",
            f"set it to {method}",
        )
    try:
        spread = spread_of(baseline, rule.metric)
        derived = band_for(rule, baseline, baseline.run_shape.rollouts)
    except (KeyError, ValueError) as exc:
        return (
            ".metric",
            f"cannot derive the band of {rule.metric}: {exc}",
            ("add a series, or a summary with sd, min/max or bounds"),
        )
    for cover in params.derive.cover:
        limit = _cover_limit(rule.kind, spread, baseline.run_shape.rollouts, params.derive)
        if abs(cover - spread.mean) > limit:
            return (
                ".derive.cover",
                (
                    f"cover {cover:g} is {abs(cover - spread.mean):.4g} from the centre "
                    f"{spread.mean:.6g}, beyond {COVER_MAX_WIDENING:g}x the derived reach "
                    f"{limit / COVER_MAX_WIDENING:.4g}"
                ),
                "cover only another run of the same recipe, or drop the value",
            )
    written = params.band
    if not _same(derived.low, written.low) or not _same(derived.high, written.high):
        return (
            ".band",
            f"band {{low: {written.low}, high: {written.high}}} is not the derived one",
            (
                f"set it to {{low: {derived.low}, high: {derived.high}}} "
                "(this module) or change derive"
            ),
        )
    return None


def rederive_band(rule: Rule, draft: Baseline, rollouts: int) -> dict[str, Any]:
    """``baseline record``: the band derived from the recorded run for ``rollouts``."""
    params = BandParams.of(rule)
    band = band_for(rule, draft, rollouts)
    return BandParams(band, params.derive).to_json()


def _cover_limit(kind: str, spread: Spread, n: int, derive: Derive) -> float:
    """How far from the centre a cover value may lie: COVER_MAX_WIDENING x the derived reach."""
    if kind == "mean_within":
        reach = mean_half_width(spread, n, derive.k, derive.run_sd, derive.rho)
    else:
        reach = max_reach(spread, n, derive.k, derive.run_sd)
    return COVER_MAX_WIDENING * reach


def mean_band_covers(baseline: Baseline, metric: str) -> set[float]:
    """The ``cover`` values of the ``mean_within`` rules on ``metric``: the other published
    runs' means a kind may pool its reference level with (``pool``)."""
    return {
        c
        for r in baseline.rules
        if r.kind == "mean_within" and r.metric == metric
        for c in r.params.get("derive", {}).get("cover", ())
    }


def pool_problem(pool: float, baseline: Baseline, metric: str) -> Problem | None:
    """A ``pool`` that is no cover value of a ``mean_within`` rule on ``metric``, or None."""
    covers = mean_band_covers(baseline, metric)
    if any(math.isclose(pool, c, rel_tol=1e-12) for c in covers):
        return None
    return (
        ".pool",
        f"pool {pool:g} is no cover value of a mean_within rule on {metric} "
        f"(covers: {sorted(covers)})",
        "pool only the other published run the mean band covers, or drop pool",
    )


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


def band_spec(name: str, method: str) -> KindSpec:
    """The declaration of a band kind whose tolerance ``<method>`` derives: the band
    kinds differ only in that method (``mean_band``, ``max_band``)."""

    def validate(rule: Rule, baseline: Baseline) -> Problem | None:
        return validate_band(rule, baseline, method)

    spending = method == "mean_band"
    return KindSpec(
        name=name,
        params=BandParams,
        check=check_band,
        expected=expected_band,
        reference=reference_spread,
        validate=validate,
        needs_spread=True,
        rederive=rederive_band,
        looks="spending" if spending else "at_once",
        information=mean_information if spending else None,
        nominal=mean_nominal if spending else None,
    )
