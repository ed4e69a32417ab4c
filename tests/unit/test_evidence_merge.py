"""The normal form of a series (sorted by step, stable, duplicates kept, typed) and one series
per metric across sources, with the steps where they disagree named."""

from __future__ import annotations

import math
from array import array

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from miles_amd.evidence.merge import merge_sources, values_agree
from miles_amd.evidence.types import Conflict, columns_to_series, normalise_map


def f32(value: float) -> float:
    """What TensorBoard's float32 ``simple_value`` gives back (inf beyond float32's range)."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


points = st.lists(st.tuples(st.integers(-5, 5), st.floats(allow_nan=False)), max_size=30)


@given(points)
def test_both_normal_forms_sort_stably_keep_every_point_and_type_it(
    raw: list[tuple[int, float]],
) -> None:
    logged = [int(v) if v.is_integer() and abs(v) < 2**53 else v for _, v in raw]  # as JSON
    by_columns = columns_to_series({"m": ([s for s, _ in raw], array("d", logged))})
    by_points = normalise_map({"m": raw})
    assert by_columns == by_points
    series = by_points.get("m", ())
    assert sorted(series) == sorted(raw)  # a permutation: nothing dropped or added
    assert [s for s, _ in series] == sorted(s for s, _ in raw)
    for step in {s for s, _ in raw}:  # equal steps keep the order they were read in
        assert [v for s, v in series if s == step] == [v for s, v in raw if s == step]
    assert all(
        type(step) is int and type(value) is float for step, value in by_columns.get("m", ())
    )


def test_nan_survives_and_metrics_without_points_are_left_out() -> None:
    columns = columns_to_series({"b": ([1, 0], array("d", [math.nan, 1])), "a": ([], array("d"))})
    assert list(columns) == ["b"] and columns["b"][0] == (0, 1.0)
    assert math.isnan(columns["b"][1][1])
    assert normalise_map({"z": [(2, 1.0), (1, 2.0)], "y": []}) == {"z": ((1, 2.0), (2, 1.0))}


MERGES = {
    "preference: tensorboard, ci_history, job_log": (
        {
            "job_log": {"a": ((0, 0.1),), "b": ((0, 2.0),), "c": ((0, 3.0),)},
            "ci_history": {"a": ((0, 0.1),), "b": ((0, 2.0),)},
            "tensorboard": {"a": ((0, f32(0.1)),)},
        },
        {"a": ((0, f32(0.1)),), "b": ((0, 2.0),), "c": ((0, 3.0),)},
        {"a": "tensorboard", "b": "ci_history", "c": "job_log"},
        (),
    ),
    "a disagreement names every source at that step": (
        {
            "tensorboard": {"m": ((0, 1.0), (1, 2.0))},
            "ci_history": {"m": ((0, 1.0), (1, 2.0))},
            "job_log": {"m": ((0, 1.0), (1, 2.5))},
        },
        {"m": ((0, 1.0), (1, 2.0))},
        {"m": "tensorboard"},
        (Conflict("m", 1, {"tensorboard": 2.0, "ci_history": 2.0, "job_log": 2.5}),),
    ),
    "a step the preferred source lacks: not filled, still compared": (
        {
            "tensorboard": {"m": ((0, 1.0), (2, 3.0))},
            "ci_history": {"m": ((0, 1.0), (1, 2.0), (2, 3.0))},
            "job_log": {"m": ((0, 1.0), (1, 9.0), (2, 3.0))},
        },
        {"m": ((0, 1.0), (2, 3.0))},
        {"m": "tensorboard"},
        (Conflict("m", 1, {"ci_history": 2.0, "job_log": 9.0}),),
    ),
    "a duplicate within one source is no conflict": (
        {
            "tensorboard": {"m": ((0, 1.0), (1, 2.0), (1, 7.0))},
            "job_log": {"m": ((0, 1.0), (1, 7.0))},
        },
        {"m": ((0, 1.0), (1, 2.0), (1, 7.0))},
        {"m": "tensorboard"},
        (),
    ),
}


@pytest.mark.parametrize("case", MERGES, ids=list(MERGES))
def test_merging(case: str) -> None:
    per_source, series, sources, conflicts = MERGES[case]
    assert merge_sources(per_source) == (series, sources, conflicts)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("a", "b", "agree"),
    [
        (math.nan, math.nan, True),
        (math.inf, math.inf, True),
        (-math.inf, math.inf, False),
        (math.inf, 1e39, False),  # float32 overflow: TensorBoard says inf, the log a number
        (math.nan, 0.0, False),
        (0.0, -0.0, True),
        (f32(0.1), 0.1, True),
        (1.0, 1.0 + 2e-6, False),
        (0.0, 1e-40, True),  # below float32's normal range
        (0.0, 1e-30, False),
    ],
)
def test_float_noise_tolerance(a: float, b: float, agree: bool) -> None:
    assert values_agree(a, b) is agree and values_agree(b, a) is agree
    _, _, conflicts = merge_sources(
        {"tensorboard": {"m": ((0, 0.5), (1, a))}, "job_log": {"m": ((0, 0.5), (1, b))}}
    )
    assert (conflicts == ()) is agree


@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=20))
def test_float32_storage_of_a_logged_value_is_never_a_conflict(values: list[float]) -> None:
    logged = tuple(enumerate(values))
    stored = tuple((step, f32(value)) for step, value in logged)
    _, _, conflicts = merge_sources({"tensorboard": {"m": stored}, "job_log": {"m": logged}})
    overflowed = {s for s, v in logged if math.isfinite(v) and math.isinf(f32(v))}
    assert {c.step for c in conflicts} == overflowed


point_lists = st.lists(
    st.tuples(
        st.integers(0, 6),
        st.sampled_from([0.0, -0.0, 1.0, f32(0.1), 0.1, 0.1 + 1e-9, 2.0, math.nan, math.inf]),
    ),
    max_size=8,
)


@given(point_lists, point_lists)
def test_conflicts_are_exactly_the_steps_where_values_disagree(a: list, b: list) -> None:
    """The fast whole-series check never hides a disagreement the point rule would find."""
    preferred = tuple(sorted(a, key=lambda p: p[0]))
    other = tuple(sorted(b, key=lambda p: p[0]))
    _, _, conflicts = merge_sources({"tensorboard": {"m": preferred}, "job_log": {"m": other}})
    expected = set()
    for step in {s for s, _ in preferred} & {s for s, _ in other}:
        reference = [v for s, v in preferred if s == step]
        if any(not any(values_agree(r, v) for r in reference) for s, v in other if s == step):
            expected.add(step)
    assert {c.step for c in conflicts} == expected
