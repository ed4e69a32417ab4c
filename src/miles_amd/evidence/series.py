"""The normalised form every reader returns: ``metric -> ((step, value), ...)``.

Decides: the shape and order of a series. Steps are ``int``, values ``float``; points are
sorted by step with a stable sort, so points of one step keep the order they were read in
(file order, then position in the file). Duplicated steps are kept: whether a duplicate is
an error is the gate's call, and it can only make it if the reader did not hide it. A metric
without points is left out, so "no data" has one representation: the key is absent.

Does not decide: which source wins (``merge``) or whether a series is good enough (``gate``).

Speed fact: a reader decoding 150 metrics interleaved would leave each metric's objects
scattered over the heap, and every later pass over scattered points pays a cache miss per
object (about 4x slower than over freshly built ones). So the big readers collect a metric as
:data:`Columns`, the values as float64s in an ``array`` (no float object survives the read),
and :func:`series_from_columns` builds the point tuples and floats in one go, adjacent in
memory.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping
from operator import itemgetter

from miles_amd.evidence.types import Point, Series, SeriesMap

_BY_STEP = itemgetter(0)


def normalise_series(points: Iterable[Point]) -> Series:
    """``points`` sorted by step into a tuple; stable, so equal steps keep their order.

    The readers build the points with ``int`` steps and ``float`` values; this function
    only orders them (an already sorted series costs one linear pass of the sort).
    """
    return tuple(sorted(points, key=_BY_STEP))


def normalise_map(points_by_metric: Mapping[str, Iterable[Point]]) -> SeriesMap:
    """Every metric's points normalised; metrics without points are dropped from the map."""
    normalised = {metric: normalise_series(points) for metric, points in points_by_metric.items()}
    return {metric: series for metric, series in sorted(normalised.items()) if series}


Columns = tuple[list[int], array]  # (steps, values as array("d")) of one metric, read order


def new_columns() -> Columns:
    """Empty columns for a metric: steps in a list, values as float64s in an ``array``."""
    return ([], array("d"))


def series_from_columns(steps: list[int], values: array) -> Series:
    """The series of parallel ``steps`` and ``values`` (read order), sorted by step, stable."""
    ordered = sorted(steps)
    if steps != ordered:
        order = sorted(range(len(steps)), key=steps.__getitem__)
        values = array("d", [values[index] for index in order])
        steps = ordered
    return tuple(zip(steps, values, strict=True))


def columns_to_series(columns_by_metric: Mapping[str, Columns]) -> SeriesMap:
    """:func:`series_from_columns` for every metric; metrics without points are left out."""
    return {
        metric: series_from_columns(*columns)
        for metric, columns in sorted(columns_by_metric.items())
        if columns[0]
    }
