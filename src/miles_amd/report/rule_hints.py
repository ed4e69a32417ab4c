"""What each rule kind draws on its metric's panel of ``metrics.png``: a band, a bound, a line.

Decides the hint of a kind (keyed by kind name, ``miles_amd.rules.kinds``) from the
figures of its check (``Check.numbers``): a mean band (an interval beside the series, where
the mean is, with the run's mean on it: the band bounds the mean, not the points), a max
bound, a spike threshold (a line when the data reach near it, else a note, so the data are
not squeezed into a strip), a ±atol strip, a Theil-Sen trend line, a step's two halves, a
geometric mean's band. A hint returns True to ask for a log y axis.
A kind without a hint draws nothing, and so does a hint whose check carries no figures for
it (a check decided by a non-finite value fits no trend). The panel itself is
``miles_amd.report.plot``'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from miles_amd.report.figure_layout import LEGEND_SIZE
from miles_amd.rules.check import Check
from miles_amd.rules.model import KindName

THRESHOLD_NEAR = 1.5  # a spike threshold is drawn as a line when within 1.5x the run's max

# (matplotlib axes, the rule's check, the run's finite values) -> log y axis wanted
Hint = Callable[[Any, Check, list[float]], bool]


def threshold(ax: Any, check: Check, finite: list[float]) -> bool:
    """The spike threshold as a line when the data reach near it; else a note at the top.

    A threshold far above every value (0.15 over a healthy 0.015..0.021) would squeeze the
    data into a strip on a linear axis and hide their spread on a log one, so it is named
    instead (a legend entry), with how far above the run's max it lies.
    """
    limit = check.numbers.get("threshold")
    if limit is None:  # judged on something else (a non-finite value): nothing to draw
        return False
    top = max(finite, default=limit)
    if top <= 0 or limit <= THRESHOLD_NEAR * top:
        label = f"spike threshold {limit:g}"
        ax.axhline(limit, color="darkred", linewidth=1, label=label, gid="threshold")
        return False
    note = f"spike threshold {limit:g}: off scale, {limit / top:.1f}x this run's max"
    ax.plot([], [], color="darkred", linewidth=1, label=note, gid="threshold")
    return False


def mean_band(ax: Any, check: Check, finite: list[float], what: str = "mean") -> bool:
    """The band bounds the run's mean, not its points: drawn where the mean is, as an
    interval beside the series (right of its last step) with the run's mean as a diamond on
    it, so a passing run's points outside the band read as what they are."""
    low, high = check.numbers.get("low"), check.numbers.get("high")
    x = ax.dataLim.x1 + 1.5 if ax.has_data() else 0.0  # right of the series (and other bands)
    if low is not None and high is not None:
        label = f"band for the {what} ({check.name})"
        ax.fill_between(
            [x - 0.35, x + 0.35],
            low,
            high,
            color="tab:green",
            alpha=0.3,
            label=label,
            gid=f"band:{check.name}",
        )
    value = check.numbers.get("value")
    if value is not None and math.isfinite(value):
        colour = "tab:red" if check.failed else "tab:green"
        ax.plot([x], [value], marker="D", color=colour, linestyle="none", label=f"run {what}")
    if low is not None and high is not None:
        ax.annotate(
            what, (x, high), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
            fontsize=LEGEND_SIZE, color="tab:green", gid=f"band-label:{check.name}",
        )  # fmt: skip
    return False


def geometric_band(ax: Any, check: Check, finite: list[float]) -> bool:
    """``log_mean_within``: the geometric mean's band for this run's pooled spread."""
    return mean_band(ax, check, finite, what="geometric mean")


def max_bound(ax: Any, check: Check, finite: list[float]) -> bool:
    high = check.numbers.get("high")
    if high is not None:
        ax.axhline(
            high, color="tab:orange", linestyle="--", linewidth=1, label="max bound", gid="max"
        )
    return False


def near_zero(ax: Any, check: Check, finite: list[float]) -> bool:
    atol = check.numbers.get("atol")
    if atol is None:
        return False
    ax.axhspan(-atol, atol, color="tab:green", alpha=0.3, label=f"|value| ≤ {atol:g}")
    return False


def trend(ax: Any, check: Check, finite: list[float]) -> bool:
    numbers = check.numbers
    if not {"first_step", "last_step", "slope", "intercept", "z"} <= numbers.keys():
        return False  # no trend was fitted (a non-finite value decided the check)
    first, last = numbers["first_step"], numbers["last_step"]
    slope, intercept = numbers["slope"], numbers["intercept"]
    colour = "tab:red" if check.failed else "tab:purple"
    ax.plot(
        [first, last],
        [intercept + slope * first, intercept + slope * last],
        color=colour,
        linestyle="-.",
        linewidth=1,
        label=f"Theil-Sen trend (Z {check.numbers['z']:+.1f})",
        gid="trend",
    )
    return False


def step(ax: Any, check: Check, finite: list[float]) -> bool:
    """``step_rise``: the two halves' geometric means as segments (red when it failed)."""
    numbers = check.numbers
    if "split_step" not in numbers:  # too few values to split
        return False
    first, split, last = numbers["first_step"], numbers["split_step"], numbers["last_step"]
    colour = "tab:red" if check.failed else "tab:brown"
    ax.plot([first, split], [numbers["head"]] * 2, color=colour, linewidth=1.5, gid="step")
    ax.plot(
        [split, last],
        [numbers["tail"]] * 2,
        color=colour,
        linewidth=1.5,
        label=f"halves' geometric means (rise {numbers['z']:+.1f} SE)",
    )
    return False


HINTS: Mapping[KindName, Hint] = {
    "all_below": threshold,
    "mean_within": mean_band,
    "max_within": max_bound,
    "near_zero": near_zero,
    "no_rising_trend": trend,
    "step_rise": step,
    "log_mean_within": geometric_band,
}
