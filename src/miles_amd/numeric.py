"""Means and spreads that do not raise for finite floats, however large.

- ``math.fsum`` raises ``OverflowError`` when finite values sum beyond the float range
  (``[1e308, 1e308]``), ``statistics.stdev`` when its exact result does not fit a float, and
  ``(a - b) ** 2`` when the square does not. A run dir is untrusted input, so the gate's
  checks, the history and the plots compute their means and spreads here
  (``tests/unit/test_untrusted_input.py``: finite values near the float limit are judged,
  not crashed).
- The usual exact computation runs first (ordinary results are unchanged to the last bit);
  only when it overflows is the same quantity computed on values scaled down, which is
  ``inf`` exactly when the true result is beyond the float range. A caller that must judge
  the result checks ``math.isfinite`` and names the failure.

Caveat: not every sum in the package comes here: ``baseline/record.py``, ``rules/bands.py``
and the kinds ``log_mean_within``, ``no_rising_trend`` and ``step_rise`` call ``math.fsum``
directly. A pure leaf.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["mean", "position", "stdev"]


def mean(values: Sequence[float]) -> float:
    """The mean of ``values`` (non-empty): ``fsum / n``, or ``fsum(v / n)`` if that overflows."""
    n = len(values)
    try:
        return math.fsum(values) / n
    except OverflowError:
        return math.fsum(v / n for v in values)


def stdev(values: Sequence[float]) -> float:
    """The sample standard deviation (0.0 below two values); ``inf`` only when it is."""
    if len(values) < 2:
        return 0.0
    try:
        return statistics.stdev(values)
    except OverflowError:
        scale = max(abs(v) for v in values)
        return statistics.stdev([v / scale for v in values]) * scale


def position(value: float, low: float, high: float) -> float:
    """Where ``value`` lies between ``low`` and ``high`` (0..1; 0.5 when they are equal),
    without forming ``high - low`` (which overflows for ``-1e308..1e308``)."""
    if high == low:
        return 0.5
    return (value / 2 - low / 2) / (high / 2 - low / 2)
