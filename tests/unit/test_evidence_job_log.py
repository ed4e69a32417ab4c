"""Metric lines of the Ray job log, parsed safely (never evaluated).

Each log is the ``job.log`` of a run dir of its own, read by ``load_run`` as the gate reads
it: a metric line that cannot be read is a ``job_log`` problem naming its line.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from miles_amd.evidence.job_log import parse_metric_dict
from miles_amd.evidence.load import load_run
from miles_amd.evidence.types import RunEvidence, SeriesMap, SourceProblem
from miles_amd.testing.miles_writer import ActorPids, metric_log_lines

PREFIX = "(MegatronTrainRayActor pid=4242) [2026-11-20 10:03:50.007 ] log_utils.py:542 - "


def load_log(run: Path, lines: list[str], *, end: str = "\n", live: bool = False) -> RunEvidence:
    """``lines`` as the ``job.log`` of the run dir ``run``, read by ``load_run``."""
    run.mkdir()
    (run / "job.log").write_text("\n".join(lines) + end, encoding="utf-8")
    return load_run(run, live=live)


def log_series(run: Path, lines: list[str]) -> SeriesMap:
    evidence = load_log(run, lines)
    assert evidence.problems == (), evidence.problems
    return evidence.series


def log_problem(run: Path, lines: list[str], *, end: str = "\n") -> SourceProblem:
    (problem,) = load_log(run, lines, end=end).problems
    assert (problem.source, problem.path) == ("job_log", str(run / "job.log"))
    return problem


def test_reads_the_lines_miles_prints_including_non_finite_values(tmp_path: Path) -> None:
    pids = ActorPids.around(1000)
    lines = ["Starting Ray job", "(SGLangEngine pid=9) [2026-11-20 10:00:00 TP0] Decode batch."]
    for k in range(3):
        metrics = {
            "train/train_rollout_logprob_abs_diff": 0.0208 - k / 1000,
            "train/grad_norm": math.nan if k == 1 else 0.1,
            "rollout/raw_reward": 0.5,
            "perf/rollout_time": math.inf if k == 2 else 95.5,
            "rollout/truncated_ratio": -math.inf if k == 0 else 0.4,
        }
        lines += metric_log_lines(k, metrics, pids, 1.78e9 + k)
    series = log_series(tmp_path / "run", lines)

    diffs = series["train/train_rollout_logprob_abs_diff"]
    assert diffs == tuple((k, 0.0208 - k / 1000) for k in range(3))
    assert series["train/step"] == ((0, 0.0), (1, 1.0), (2, 2.0))
    assert math.isnan(series["train/grad_norm"][1][1])
    assert series["perf/rollout_time"][2] == (2, math.inf)
    assert series["rollout/truncated_ratio"][0] == (0, -math.inf)
    assert all(type(s) is int and type(v) is float for p in series.values() for s, v in p)


def test_ray_colours_repeat_markers_and_numpy_reprs(tmp_path: Path) -> None:
    lines = [
        "\x1b[36m(MegatronTrainRayActor pid=4242)\x1b[0m [2026-11-20 10:03:50.007 ] "
        "log_utils.py:542 - step 0: {'train/loss': 0.5, 'train/step': 0} "
        "[repeated 2x across cluster]",
        PREFIX + "rollout 0: {'rollout/a': np.float64(0.25), 'rollout/b': np.float32(nan), "
        "'rollout/c': np.int64(-3), 'rollout/d': True, 'rollout/e': -inf}",
    ]
    series = log_series(tmp_path / "run", lines)
    assert series["train/loss"] == ((0, 0.5),)
    assert series["rollout/a"] == ((0, 0.25),) and math.isnan(series["rollout/b"][0][1])
    assert series["rollout/c"] == ((0, -3.0),) and series["rollout/d"] == ((0, 1.0),)
    assert series["rollout/e"] == ((0, -math.inf),)


def test_non_scalar_literals_are_skipped_not_errors(tmp_path: Path) -> None:
    line = (
        PREFIX + "perf 4: {'perf/t': 1.5, 'perf/name': 'x', 'perf/none': None, 'perf/l': [1, nan]}"
    )
    assert log_series(tmp_path / "run", [line]) == {"perf/t": ((4, 1.5),)}


def test_lines_that_are_not_metric_lines_are_ignored(tmp_path: Path) -> None:
    lines = [
        PREFIX + "step 3: saving checkpoint",
        PREFIX + "eval 3: {'eval/x': 1.0}",
        "step 3: {'train/loss': 1.0}",  # not miles' logger format
        "print from a user: - step 3: {'train/loss': 1.0}",
        PREFIX + "step 3: {'train/loss': 2.0}",
    ]
    assert log_series(tmp_path / "run", lines) == {"train/loss": ((3, 2.0),)}


@pytest.mark.parametrize(
    ("dict_text", "reason"),
    [
        ("{'train/loss': 0.1, 'train/pg", "not a complete dict literal"),
        ("{'train/loss': __import__('os').system('touch PWNED')}", "is not a literal"),
        ("{'train/loss': tensor(0.5, device='cuda:0')}", "is not a literal"),
        ("{'train/loss': 1 + 2}", "is not a literal"),
        ("{'train/loss': 0.1, **extra}", "not a string literal"),
        ("{1: 0.5}", "not a string literal"),
        ("{'train/loss': [1, foo()]}", "is not a literal"),
        ("{'train/loss': 10 ** 400}", "is not a literal"),
        ("{'train/loss': " + "9" * 400 + "}", "does not fit a float"),
    ],
)
def test_unreadable_metric_lines_name_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dict_text: str, reason: str
) -> None:
    monkeypatch.chdir(tmp_path)
    lines = [
        "Ray job started",
        PREFIX + "step 0: {'train/loss': 0.2}",
        PREFIX + "step 1: " + dict_text,
    ]
    problem = log_problem(tmp_path / "run", lines)
    assert problem.detail.startswith("line 3: unreadable metric line: ")
    assert reason in problem.detail
    assert not (tmp_path / "PWNED").exists()


def test_an_unterminated_last_line_is_the_write_in_flight_when_live(tmp_path: Path) -> None:
    lines = [PREFIX + "step 0: {'train/loss': 0.2}", PREFIX + "step 1: {'train/loss': 0.3, 'tr"]
    problem = log_problem(tmp_path / "done", lines, end="")
    assert problem.detail.startswith("line 2: ") and "not a complete dict literal" in problem.detail
    live = load_log(tmp_path / "live", lines, end="", live=True)
    assert (live.problems, live.series) == ((), {"train/loss": ((0, 0.2),)})


def test_one_value_printed_twice_is_one_point_and_two_values_are_an_error(tmp_path: Path) -> None:
    same = [PREFIX + "rollout 2: {'rollout/r': 0.5}", PREFIX + "perf 2: {'rollout/r': 0.5, 'p': 1}"]
    assert log_series(tmp_path / "a", same) == {"p": ((2, 1.0),), "rollout/r": ((2, 0.5),)}
    differ = [PREFIX + "step 2: {'train/x': 0.5}", "noise", PREFIX + "step 2: {'train/x': 0.75}"]
    problem = log_problem(tmp_path / "b", differ)
    assert problem.detail.startswith("line 3: ")
    assert "'train/x' at step 2 is 0.75 here but 0.5 at line 1" in problem.detail


def test_a_line_repeated_thousands_of_times_is_one_point_and_a_late_change_is_caught(
    tmp_path: Path,
) -> None:
    """A hostile log of one metric line over and over (each repeat is checked against the
    step's first values, not against every earlier line: 20,000 repeats read in 0.1 s, where
    5,000 took 3.4 s when each repeat scanned all earlier ones)."""
    line = PREFIX + "step 3: {'train/x': 0.5, 'train/y': 1.0}"
    assert log_series(tmp_path / "a", [line] * 20_000) == {
        "train/x": ((3, 0.5),),
        "train/y": ((3, 1.0),),
    }
    changed = [line] * 20_000 + [PREFIX + "step 3: {'train/y': 2.0}"]
    problem = log_problem(tmp_path / "b", changed)
    assert "'train/y' at step 3 is 2.0 here but 1.0 at line 1" in problem.detail


def test_a_log_without_metric_lines_gives_no_series_and_says_so(tmp_path: Path) -> None:
    problem = log_problem(tmp_path / "run", ["hello", "world"])
    assert problem.detail.startswith("no metric lines")
    assert load_run(tmp_path / "run").series == {}


finite_or_not = st.floats(allow_nan=True, allow_infinity=True)
keys = st.text(min_size=1, max_size=12)


def fits_float(value: float | int) -> bool:
    try:
        float(value)
    except OverflowError:
        return False
    return True


@given(st.dictionaries(keys, finite_or_not | st.integers(), max_size=8))
def test_any_number_dict_repr_reads_back_exactly(values: dict[str, float | int]) -> None:
    """Every reader path (regex, ast) reads what Python printed, bit for bit; an int
    no float can hold is an error, never inf."""
    if any(not fits_float(v) for v in values.values()):
        with pytest.raises(ValueError, match="does not fit a float"):
            parse_metric_dict(repr(values))
        return
    parsed = parse_metric_dict(repr(values))
    assert list(parsed) == list(values)
    for key, value in values.items():
        got, expected = parsed[key], float(value)
        assert type(got) is float
        assert (math.isnan(got) and math.isnan(expected)) or (
            got == expected and math.copysign(1, got) == math.copysign(1, expected)
        )


@given(st.dictionaries(keys, st.floats(width=32) | st.integers(-(2**40), 2**40), max_size=6))
def test_numpy_scalar_reprs_read_back(values: dict[str, float]) -> None:
    numpy_values = {
        key: np.float32(v) if isinstance(v, float) else np.int64(v) for key, v in values.items()
    }
    parsed = parse_metric_dict(repr(numpy_values))
    for key, value in numpy_values.items():
        expected = float(value)
        assert float(parsed[key]) == expected or (math.isnan(expected) and math.isnan(parsed[key]))
