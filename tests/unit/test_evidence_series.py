"""The normalised series form: sorted by step, stable, duplicates kept, typed."""

from __future__ import annotations

import math
from array import array

from hypothesis import given
from hypothesis import strategies as st

from miles_amd.evidence.series import (
    columns_to_series,
    normalise_map,
    normalise_series,
    series_from_columns,
)

points = st.lists(st.tuples(st.integers(-5, 5), st.floats(allow_nan=False)), max_size=30)


@given(points)
def test_normalising_sorts_stably_and_keeps_every_point(raw: list[tuple[int, float]]) -> None:
    series = normalise_series(raw)
    assert isinstance(series, tuple)
    assert sorted(series) == sorted(raw)  # a permutation: nothing dropped or added
    assert [s for s, _ in series] == sorted(s for s, _ in raw)
    for step in {s for s, _ in raw}:  # equal steps keep the order they were read in
        assert [v for s, v in series if s == step] == [v for s, v in raw if s == step]


def as_logged(value: float) -> int | float:
    """Integral values as ``int``, as a log line or JSON may give them."""
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


@given(points)
def test_the_columns_normalise_the_same_with_float_values(raw: list[tuple[int, float]]) -> None:
    steps = [step for step, _ in raw]
    values = array("d", [as_logged(value) for _, value in raw])
    series = series_from_columns(steps, values)
    assert series == normalise_series((step, float(value)) for step, value in raw)
    assert all(type(step) is int and type(value) is float for step, value in series)


def test_nan_survives_and_metrics_without_points_are_left_out() -> None:
    columns = columns_to_series({"b": ([1, 0], array("d", [math.nan, 1])), "a": ([], array("d"))})
    assert list(columns) == ["b"] and columns["b"][0] == (0, 1.0)
    assert math.isnan(columns["b"][1][1])
    assert normalise_map({"z": [(2, 1.0), (1, 2.0)], "y": []}) == {"z": ((1, 2.0), (2, 1.0))}
