"""One series per metric across sources (the first of :data:`PREFERENCE` carrying it), and
the steps where sources disagree beyond float32 noise (:func:`values_agree`). Whether a
conflict fails the run is the gate's call. ``docs/cli.md`` ("One series per metric").
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from itertools import chain

from miles_amd.evidence.types import Conflict, Series, SeriesMap, SourceName

PREFERENCE: tuple[SourceName, ...] = ("tensorboard", "ci_history", "job_log")
REL_TOL = 1e-6
ABS_TOL = 1e-37

_EXACT_STEP = 2**53  # integers below this are exact as float64


def values_agree(a: float, b: float) -> bool:
    """Whether two readings of one metric at one step agree up to float32 storage."""
    if a == b:
        return True
    if math.isfinite(a) and math.isfinite(b):
        return abs(a - b) <= max(REL_TOL * max(abs(a), abs(b)), ABS_TOL)
    return math.isnan(a) and math.isnan(b)


def merge_sources(
    per_source: Mapping[SourceName, SeriesMap],
) -> tuple[SeriesMap, dict[str, SourceName], tuple[Conflict, ...]]:
    """``(series, metric -> source used, conflicts by metric then step)`` of the sources
    that were read (a failed one is the caller's ``SourceProblem``, not an empty map)."""
    ordered = [(name, per_source[name]) for name in PREFERENCE if name in per_source]
    series: SeriesMap = {}
    chosen: dict[str, SourceName] = {}
    conflicts: list[Conflict] = []
    for metric in sorted({metric for _, series_map in ordered for metric in series_map}):
        carriers = [
            (name, series_map[metric]) for name, series_map in ordered if metric in series_map
        ]
        chosen[metric] = carriers[0][0]
        series[metric] = carriers[0][1]
        if len(carriers) > 1:
            conflicts.extend(_conflicts(metric, carriers))
    return series, chosen, tuple(conflicts)


def _conflicts(metric: str, carriers: list[tuple[SourceName, Series]]) -> list[Conflict]:
    """The steps where the carriers of one metric disagree (carriers in preference order)."""
    if all(_provably_agree(carriers[0][1], other) for _, other in carriers[1:]):
        return []
    by_step: dict[int, dict[str, list[float]]] = {}
    for name, points in carriers:
        for step, value in points:
            by_step.setdefault(step, {}).setdefault(name, []).append(value)
    found = []
    for step in sorted(by_step):
        values = by_step[step]
        if len(values) < 2:
            continue
        reference, *others = values.values()  # insertion order is preference order
        if any(
            not any(values_agree(expected, value) for expected in reference)
            for other in others
            for value in other
        ):
            found.append(Conflict(metric, step, {name: vs[0] for name, vs in values.items()}))
    return found


def _provably_agree(preferred: Series, other: Series) -> bool:
    """A fast sufficient test that two series agree (False: look closer): the same steps and
    bit-identical finite float32 roundings (``docs/cli.md``, memory facts)."""
    if preferred == other:
        return True
    count = len(preferred)
    if count != len(other) or not count:
        return False
    if not -_EXACT_STEP < preferred[0][0] <= preferred[-1][0] < _EXACT_STEP:
        return False
    try:
        mine = _packed(preferred)
        theirs = _packed(other)
        if mine[0::2] != theirs[0::2]:
            return False
        layout = f"<{count}f"
        if struct.pack(layout, *mine[1::2]) != struct.pack(layout, *theirs[1::2]):
            return False
    except OverflowError:  # a step or value beyond float range, or a value beyond float32's
        return False
    return math.isfinite(sum(mine[1::2]))


def _packed(series: Series) -> memoryview[float]:
    """``step0, value0, step1, value1, ...`` as contiguous float64s."""
    return memoryview(struct.pack(f"<{2 * len(series)}d", *chain.from_iterable(series))).cast("d")
