"""miles' CI-history JSONL read strictly: markers, merging across files, named errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from miles_amd.evidence.ci_history import read_ci_history_dir
from miles_amd.evidence.types import MetricsFormatError
from miles_amd.testing.miles_writer import ci_history_text


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_reads_the_files_miles_writes_with_both_non_finite_spellings(tmp_path: Path) -> None:
    # The recipe's form: strict JSON with string markers (miles_amd.testing.miles_writer, as miles).
    (tmp_path / "11-aa.jsonl").write_text(
        ci_history_text({"train/grad_norm": [(0, 0.5), (1, math.nan), (2, math.inf)]})
    )
    # A plain json.dumps (CiHistoryBackend without markers): bare NaN / -Infinity tokens.
    (tmp_path / "12-bb.ndjson").write_text(
        json.dumps({"metric": "rollout/raw_reward", "series": [[0, -math.inf], [1, 0.5625]]}) + "\n"
    )
    (tmp_path / "13-cc.jsonl.tmp").write_text("{half a snapshot")  # a write in flight
    series = read_ci_history_dir(tmp_path)
    assert series["rollout/raw_reward"] == ((0, -math.inf), (1, 0.5625))
    grad = series["train/grad_norm"]
    assert grad[0] == (0, 0.5) and math.isnan(grad[1][1]) and grad[2] == (2, math.inf)
    assert all(type(step) is int and type(value) is float for step, value in grad)


def test_files_merge_one_observation_in_two_files_kept_once_a_repeat_in_one_kept(
    tmp_path: Path,
) -> None:
    write_lines(tmp_path / "1-a.jsonl", ['{"metric": "m", "series": [[0, 1.0], [1, "NaN"]]}'])
    write_lines(tmp_path / "2-b.jsonl", ['{"metric": "m", "series": [[1, "NaN"], [2, 3]]}'])
    series = read_ci_history_dir(tmp_path)["m"]
    assert [step for step, _ in series] == [0, 1, 2]
    assert series[2] == (2, 3.0) and type(series[2][1]) is float
    write_lines(tmp_path / "1-a.jsonl", ['{"metric": "m", "series": [[0, 1.0], [0, 1.0]]}'])
    write_lines(tmp_path / "2-b.jsonl", ['{"metric": "m", "series": [[0, 1.0]]}'])
    assert read_ci_history_dir(tmp_path) == {"m": ((0, 1.0), (0, 1.0))}  # kept for the gate


def test_different_values_at_one_step_across_files_name_both(tmp_path: Path) -> None:
    write_lines(
        tmp_path / "1-a.jsonl",
        ['{"metric": "x", "series": []}', '{"metric": "m", "series": [[4, 1.0]]}'],
    )
    second = write_lines(tmp_path / "2-b.jsonl", ['{"metric": "m", "series": [[4, 1.5]]}'])
    with pytest.raises(MetricsFormatError) as caught:
        read_ci_history_dir(tmp_path)
    error = caught.value
    assert (error.path, error.line) == (str(second), 1)
    assert "'m' at step 4 is 1.5 here but 1.0 in" in error.reason
    assert f"{tmp_path / '1-a.jsonl'}:2" in error.reason


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"metric": "m", "series": [[0, 1.0]', "invalid JSON"),
        ('{"metric": "m", "series": [[0, NaN]], "series": [[0, 1.0]]}', "duplicate key 'series'"),
        ('{"metric": "m", "series": [[99999999999999999999, 1.0]]}', "does not fit 64 bits"),
        ('["m", [[0, 1.0]]]', "expected an object"),
        ('{"series": [[0, 1.0]]}', '"metric" must be a non-empty string'),
        ('{"metric": "", "series": []}', '"metric" must be a non-empty string'),
        ('{"metric": "m", "series": {"0": 1.0}}', "\"series\" of 'm' must be a list"),
        ('{"metric": "m", "series": [[0, 1.0, 2.0]]}', "point 0 of 'm'"),
        ('{"metric": "m", "series": [[null, 1.0]]}', "point 0 of 'm' is \\[None, 1.0\\]"),
        ('{"metric": "m", "series": [[1.0, 1.0]]}', "point 0 of 'm'"),
        ('{"metric": "m", "series": [[true, 1.0]]}', "point 0 of 'm'"),
        ('{"metric": "m", "series": [[0, 1.0], [1, "nan"]]}', "point 1 of 'm'"),
        ('{"metric": "m", "series": [[0, false]]}', "point 0 of 'm'"),
        ('{"metric": "m", "series": [[0, null]]}', "point 0 of 'm'"),
        ('{"metric": "m", "series": [[0, 1e999999]]}', r"\$\.series\[0\]\[1\]: non-finite"),
        ('{"metric": "m", "series": [[4, 1.0], [4, 2.0]]}', r"at step 4 is 2\.0 here but 1\.0"),
        ('{"metric": "ok", "series": [[1, 1]]}', "metric 'ok' already appeared at line 1"),
    ],
)
def test_malformed_lines_are_named_with_file_and_line(
    tmp_path: Path, line: str, reason: str
) -> None:
    path = write_lines(tmp_path / "1-a.jsonl", ['{"metric": "ok", "series": [[0, 1]]}', "", line])
    with pytest.raises(MetricsFormatError, match=reason) as caught:
        read_ci_history_dir(tmp_path)
    assert (caught.value.path, caught.value.line) == (str(path), 3)
    assert str(caught.value).startswith(f"{path}:3: ")


def test_an_unterminated_last_line_is_an_error_unless_live(tmp_path: Path) -> None:
    (tmp_path / "1-a.jsonl").write_text('{"metric": "m", "series": [[0, 1]]}\n{"metric": "m2", "se')
    with pytest.raises(MetricsFormatError, match="invalid JSON"):
        read_ci_history_dir(tmp_path)
    assert read_ci_history_dir(tmp_path, live=True) == {"m": ((0, 1.0),)}


def test_bytes_that_are_not_utf8_are_named(tmp_path: Path) -> None:
    (tmp_path / "1-a.jsonl").write_bytes(b'{"metric": "m", "series": []}\n{"metric": "\xff"}\n')
    with pytest.raises(MetricsFormatError, match="not UTF-8") as caught:
        read_ci_history_dir(tmp_path)
    assert caught.value.line == 2


def test_an_empty_directory_gives_an_empty_map_and_a_missing_one_fails(tmp_path: Path) -> None:
    assert read_ci_history_dir(tmp_path) == {}
    with pytest.raises(FileNotFoundError):
        read_ci_history_dir(tmp_path / "absent")
