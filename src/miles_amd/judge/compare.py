"""A/B of two runs on the same prompt sequence: paired differences, spike counts, power.

The statistics of ``miles-amd compare``, pure, no pass/fail: per metric both runs logged the
paired ``Δ = mean(B_i - A_i)`` (spiking rollouts left out), its SE (a reward's floored by its
binomial noise), 95% t interval, ``d_z``, two-sided p Holm-adjusted over the metrics, and the
shift 80% power detects; spike counts with a one-sided Fisher's exact test and its power;
warnings for a run compared with itself or rollout counts that differ. Pairing assumes
``--rollout-shuffle`` with the default seed. Formulas: ``docs/cli.md`` ("Compare").
"""

from __future__ import annotations

import math
import os
from collections import Counter
from dataclasses import dataclass, replace

from miles_amd import numeric
from miles_amd.evidence.types import RunEvidence, Series
from miles_amd.rules import bands
from miles_amd.rules.kinds import ThresholdParams
from miles_amd.rules.model import Baseline

ALPHA = 0.05
SPIKE_RATES = (0.05, 0.10)
SPIKE_POWER = 0.95
MAX_SEARCH_ROLLOUTS = 1000

_T975_SMALL = {1: 12.706, 2: 4.303}


def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile (``rules.bands.t_quantile``; exact table for 1 and 2 dof at 0.975,
    where the expansion is poor)."""
    if dof in _T975_SMALL and abs(p - 0.975) < 1e-9:
        return _T975_SMALL[dof]
    return bands.t_quantile(p, dof)


def t_two_sided_p(t: float, dof: int) -> float:
    """Two-sided p of Student's t with ``dof`` degrees of freedom; 1 for NaN."""
    if math.isnan(t):
        return 1.0
    from scipy.stats import t as student_t  # lazily: the gate does not pay its import

    return float(2.0 * student_t.sf(abs(t), dof))


def fisher_fewer(a: int, n_a: int, b: int, n_b: int) -> float:
    """One-sided p of Fisher's exact test that B (``b`` of ``n_b``) spikes less than A: the
    hypergeometric probability that B has ``b`` or fewer of the ``a + b`` spikes."""
    total, k = n_a + n_b, a + b
    denominator = math.comb(total, k)
    ways = sum(math.comb(n_b, x) * math.comb(n_a, k - x) for x in range(max(0, k - n_a), b + 1))
    return min(1.0, ways / denominator)


def spike_power(rate: float, n_a: int, n_b: int, alpha: float = ALPHA) -> float:
    """P(one-sided Fisher p <= ``alpha``) when A spikes at ``rate`` a rollout and B never."""
    from scipy.stats import binom

    return math.fsum(
        float(binom.pmf(x, n_a, rate))
        for x in range(n_a + 1)
        if fisher_fewer(x, n_a, 0, n_b) <= alpha
    )


def rollouts_for_power(rate: float, power: float = SPIKE_POWER) -> int | None:
    """The fewest rollouts per run (equal counts) for ``power``; None beyond the search."""
    n = 2
    while n <= MAX_SEARCH_ROLLOUTS:
        if spike_power(rate, n, n) >= power:
            return n
        n += 1 if n < 100 else 10
    return None


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order (monotone, at most 1)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [1.0] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def rate_ruled_out(n: int) -> float:
    """Per-rollout spike rate a clean run of ``n`` rollouts rules out at 95%: ``1 - 0.05^(1/n)``."""
    return 1.0 - 0.05 ** (1.0 / n)


@dataclass(frozen=True)
class MetricDiff:
    """The paired difference B - A of one metric."""

    metric: str
    n: int
    mean_a: float
    mean_b: float
    diff: float
    se: float
    ci_low: float
    ci_high: float
    d_z: float | None  # None when the differences have no spread
    detectable: float  # the smallest |Δ| detected with 80% power at 5% two-sided
    binomial_floor: bool  # the SE is the reward's binomial floor, not the observed spread
    steps: tuple[int, ...]
    p_value: float = 1.0  # two-sided, this metric alone
    p_holm: float = 1.0  # Holm-adjusted over the metrics compared

    @property
    def relative(self) -> float | None:
        return self.diff / self.mean_a if self.mean_a else None

    @property
    def significant(self) -> bool:
        """A difference after Holm's correction over the metrics compared."""
        return self.p_holm <= ALPHA

    @property
    def undecided(self) -> bool:
        """Not significant, and the CI still holds a shift as large as the detectable one."""
        return (
            not self.significant
            and self.detectable > 0  # equal series: no spread, nothing left to decide
            and (self.ci_high >= self.detectable or self.ci_low <= -self.detectable)
        )


@dataclass(frozen=True)
class Spikes:
    metric: str
    threshold: float
    count_a: int
    n_a: int
    count_b: int
    n_b: int
    p_value: float  # one-sided: B spikes less often than A

    def power(self, rate: float) -> float:
        """This test's power at these counts when A spikes at ``rate`` and B never."""
        return spike_power(rate, self.n_a, self.n_b)


@dataclass(frozen=True)
class Comparison:
    run_a: str
    run_b: str
    baseline_name: str
    diffs: tuple[MetricDiff, ...]
    spikes: tuple[Spikes, ...]
    unpaired: tuple[str, ...]  # gated metrics not logged by both runs
    warnings: tuple[str, ...] = ()  # why the comparison may not mean what it seems


def comparison_warnings(a: RunEvidence, b: RunEvidence) -> tuple[str, ...]:
    """A run compared with itself (the same dir, or the same job with the same series: every
    Δ is 0 by construction), and rollout counts that differ (paired on the common ones)."""
    warnings = []
    same_dir = os.path.abspath(a.run_dir) == os.path.abspath(b.run_dir)
    job_a = a.job.job_id if a.job is not None else None
    job_b = b.job.job_id if b.job is not None else None
    if same_dir:
        warnings.append(
            f"A and B are the same run dir ({a.run_dir}): every difference is 0 by "
            "construction; pass the other arm's run dir"
        )
    elif job_a is not None and job_a == job_b and dict(a.series) == dict(b.series):
        warnings.append(
            f"A and B hold the same run (job {job_a}, the same series): every difference is "
            "0 by construction; pass the other arm's run dir"
        )
    n_a, n_b = (
        max((len({s for s, _ in series}) for series in run.series.values()), default=0)
        for run in (a, b)
    )  # the rollouts a run logged: the most distinct steps of any metric
    if n_a != n_b:
        warnings.append(
            f"A has {n_a} rollouts and B {n_b}: paired on the rollouts both logged "
            f"({min(n_a, n_b)} at most); the rest of the longer run is not compared"
        )
    return tuple(warnings)


def paired_diff(metric: str, a: Series, b: Series, samples: int | None) -> MetricDiff | None:
    """The paired difference of ``metric``; ``samples`` set for a 0/1 reward fraction."""
    va, vb = (
        {s: v for s, v in series if counts[s] == 1 and math.isfinite(v)}
        for series in (a, b)
        for counts in [Counter(step for step, _ in series)]
    )
    steps = sorted(set(va) & set(vb))
    if not steps:
        return None
    xs, ys = [va[s] for s in steps], [vb[s] for s in steps]
    n = len(steps)
    diffs = [y - x for x, y in zip(xs, ys, strict=True)]
    mean_diff = numeric.mean(diffs)
    sd = numeric.stdev(diffs)
    floor = False
    se = sd / math.sqrt(n)
    if samples is not None:
        effect = bands.paired_effect(ys, xs, samples_per_rollout=samples)
        floor = effect.se > se
        se = effect.se
    t = t_quantile(0.975, max(n - 1, 1))
    detectable = (t + t_quantile(0.80, max(n - 1, 1))) * se
    if se > 0:
        p_value = t_two_sided_p(mean_diff / se, max(n - 1, 1))
    else:
        p_value = 1.0 if mean_diff == 0 else 0.0
    return MetricDiff(
        metric=metric,
        n=n,
        mean_a=numeric.mean(xs),
        mean_b=numeric.mean(ys),
        diff=mean_diff,
        se=se,
        ci_low=mean_diff - t * se,
        ci_high=mean_diff + t * se,
        d_z=mean_diff / sd if sd > 0 else None,
        detectable=detectable,
        binomial_floor=floor,
        steps=tuple(steps),
        p_value=p_value,
        p_holm=p_value,
    )


def compare(a: RunEvidence, b: RunEvidence, baseline: Baseline) -> Comparison:
    """Compare run B with run A on every metric the baseline's rules name; see the module doc."""
    metrics = list(dict.fromkeys(r.metric for r in baseline.rules if r.metric is not None))
    grids = {r.metric for r in baseline.rules if r.kind == "multiple_of"}
    thresholds = {
        r.metric: ThresholdParams.of(r).threshold for r in baseline.rules if r.kind == "all_below"
    }
    samples = baseline.run_shape.samples_per_rollout
    diffs, unpaired = [], []
    for metric in metrics:
        sa, sb = a.series.get(metric, ()), b.series.get(metric, ())
        limit = thresholds.get(metric)
        if limit is not None:
            spiked = {s for s, v in (*sa, *sb) if not v <= limit}
            sa = tuple(p for p in sa if p[0] not in spiked)
            sb = tuple(p for p in sb if p[0] not in spiked)
        found = paired_diff(metric, sa, sb, samples if metric in grids else None)
        if found is None:
            unpaired.append(metric)
        else:
            diffs.append(found)
    spikes = []
    for rule in baseline.rules:
        if rule.kind != "all_below" or rule.metric is None:
            continue
        threshold = ThresholdParams.of(rule).threshold
        sa, sb = a.series.get(rule.metric, ()), b.series.get(rule.metric, ())
        if not sa or not sb:
            continue
        count_a = sum(not v <= threshold for _, v in sa)  # NaN counts as a spike
        count_b = sum(not v <= threshold for _, v in sb)
        p = fisher_fewer(count_a, len(sa), count_b, len(sb))
        spikes.append(Spikes(rule.metric, threshold, count_a, len(sa), count_b, len(sb), p))
    adjusted = holm([d.p_value for d in diffs])
    diffs = [replace(d, p_holm=p) for d, p in zip(diffs, adjusted, strict=True)]
    return Comparison(
        run_a=a.run_dir,
        run_b=b.run_dir,
        baseline_name=baseline.name,
        diffs=tuple(diffs),
        spikes=tuple(spikes),
        unpaired=tuple(unpaired),
        warnings=comparison_warnings(a, b),
    )
