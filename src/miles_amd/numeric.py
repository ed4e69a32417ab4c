"""Means and spreads that do not raise for finite floats, however large: the exact
computation first, redone on scaled values only on ``OverflowError`` (``inf`` exactly when the
true result is). A run dir is untrusted, so the gate, the history and the plots compute here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


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
