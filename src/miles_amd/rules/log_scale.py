"""The reference's per-rollout spread on the log scale, for the kinds that judge logarithms.

Decides where the log-scale mean and sd of a positive metric come from (``step_rise``,
``log_mean_within``): the logarithms of its series, else a published min/mean/max summary
(``ln(max/min)/d2(n)`` around ``ln(mean) - sd²/2``, the lognormal relation of mean and log
mean). It judges nothing and reads no file.
"""

from __future__ import annotations

import math

from miles_amd.rules import bands
from miles_amd.rules.check import Problem
from miles_amd.rules.model import Baseline


def log_spread(baseline: Baseline, metric: str) -> bands.Spread:
    """The reference's per-rollout spread of ``ln(metric)``: its series', else its summary's."""
    if metric in baseline.series:
        values = baseline.series[metric]
        if min(values) <= 0:
            raise ValueError(f"a non-positive reference value of {metric} has no logarithm")
        return bands.series_spread([math.log(v) for v in values])
    summary = baseline.summaries.get(metric, {})
    if not {"min", "mean", "max", "n"} <= set(summary) or float(summary["min"]) <= 0:
        raise KeyError(f"no series and no positive min/mean/max summary of {metric}")
    n = int(summary["n"])
    sd = math.log(float(summary["max"]) / float(summary["min"])) / bands.expected_range(n)
    mean = math.log(float(summary["mean"])) - sd * sd / 2
    return bands.Spread(mean, sd, n, f"ln(max/min) / d2({n}) of the published summary")


def log_spread_problem(baseline: Baseline, metric: str) -> Problem | None:
    """The loader's refusal when the reference has no log-scale spread of ``metric``."""
    try:
        log_spread(baseline, metric)
    except (KeyError, ValueError) as exc:
        return (
            ".metric",
            f"cannot take the reference's log-scale spread of {metric}: {exc}",
            "add a positive series, or a summary with a positive min, mean and max",
        )
    return None
