"""One series per metric across sources; disagreements beyond float32 noise are conflicts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from miles_amd.evidence.merge import merge_sources, values_agree
from miles_amd.evidence.types import Conflict, SeriesMap


def f32(value: float) -> float:
    """What TensorBoard's float32 ``simple_value`` gives back (inf beyond float32's range)."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))


def test_tensorboard_is_preferred_then_ci_history_then_the_job_log() -> None:
    series, sources, conflicts = merge_sources(
        {
            "job_log": {"a": ((0, 0.1),), "b": ((0, 2.0),), "c": ((0, 3.0),)},
            "ci_history": {"a": ((0, 0.1),), "b": ((0, 2.0),)},
            "tensorboard": {"a": ((0, f32(0.1)),)},
        }
    )
    assert series == {"a": ((0, f32(0.1)),), "b": ((0, 2.0),), "c": ((0, 3.0),)}
    assert sources == {"a": "tensorboard", "b": "ci_history", "c": "job_log"}
    assert conflicts == ()


def test_a_disagreement_is_a_conflict_naming_every_source_at_that_step() -> None:
    _, _, conflicts = merge_sources(
        {
            "tensorboard": {"m": ((0, 1.0), (1, 2.0), (2, 3.0))},
            "ci_history": {"m": ((0, 1.0), (1, 2.0), (2, 3.0))},
            "job_log": {"m": ((0, 1.0), (1, 2.5), (2, 3.0))},
        }
    )
    assert conflicts == (Conflict("m", 1, {"tensorboard": 2.0, "ci_history": 2.0, "job_log": 2.5}),)


def test_steps_the_preferred_source_lacks_are_not_filled_but_still_compared() -> None:
    series, sources, conflicts = merge_sources(
        {
            "tensorboard": {"m": ((0, 1.0), (2, 3.0))},  # lost step 1
            "ci_history": {"m": ((0, 1.0), (1, 2.0), (2, 3.0))},
            "job_log": {"m": ((0, 1.0), (1, 9.0), (2, 3.0))},
        }
    )
    assert series["m"] == ((0, 1.0), (2, 3.0)) and sources["m"] == "tensorboard"
    assert conflicts == (Conflict("m", 1, {"ci_history": 2.0, "job_log": 9.0}),)


def test_a_duplicate_within_one_source_is_not_a_conflict() -> None:
    _, _, conflicts = merge_sources(
        {
            "tensorboard": {"m": ((0, 1.0), (1, 2.0), (1, 7.0))},
            "job_log": {"m": ((0, 1.0), (1, 7.0))},
        }
    )
    assert conflicts == ()


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


def test_unknown_sources_are_rejected() -> None:
    per_source: dict[str, SeriesMap] = {"wandb": {"m": ((0, 1.0),)}}
    with pytest.raises(ValueError, match="unknown metric sources"):
        merge_sources(per_source)  # type: ignore[arg-type]
