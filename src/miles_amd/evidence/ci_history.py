"""Metric series from miles' CI-history records (``ci_history/*.jsonl``).

Decides what the records say, strictly:

- only the directory's top level is read, ``*.jsonl`` and ``*.ndjson`` (``*.tmp`` files are
  writes in flight and are not);
- each non-blank line is an object with a non-empty string ``metric`` and a list ``series``
  of ``[step, value]`` pairs, step an integer, value a number or one of ``"NaN"``,
  ``"Infinity"``, ``"-Infinity"`` (other keys are allowed and ignored); a line is read by
  ``miles_amd.strict_json`` (a duplicate key, which would hide a NaN behind a second
  ``"series"``, is refused); a step of ``null`` is an error (such a point cannot be placed);
- a metric appears at most once per file; points of one metric from several files are
  merged: the same step with different values (NaN equals NaN) is an error naming both
  places, the same (step, value) in two files is one observation recorded by two processes
  and is kept once, a step repeated within one file is kept twice so the gate can name the
  duplicate.

Format facts: miles' ``CiHistoryBackend`` (``miles/utils/tracking_utils/ci_history.py``)
keeps, per process, one file ``<pid>-<uuid>.<ext>`` in ``$MILES_CI_GATE_RECORD_DIR``, one
JSON object a line: ``{"metric": "<key>", "series": [[step, value], ...]}``, rewritten whole
through ``<file>.tmp`` + ``os.replace`` on each log call, so a reader sees whole snapshots.
The extension is ``.jsonl`` in the recipe's runs and ``.ndjson`` in some miles versions.
Non-finite values appear as the strings above or, from a plain ``json.dumps``, as the bare
tokens ``NaN``/``Infinity``/``-Infinity``; both are read as the values they mark (the gate
names a non-finite gated value as a failure). The backend records ``step=None`` when a
caller passed no step.

Does not decide: whether an empty directory is a problem (``load`` does) or which source
wins (``merge``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from miles_amd import strict_json
from miles_amd.evidence.errors import MetricsFormatError
from miles_amd.evidence.safe_open import RECORD_FILE, read_regular, regular_files
from miles_amd.evidence.series import normalise_map
from miles_amd.evidence.types import Point, SeriesMap

RECORD_SUFFIXES = (".jsonl", ".ndjson")
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_EXPECTED_POINT = (
    'expected [step, value]: an integer step and a number or "NaN"/"Infinity"/"-Infinity"'
)


def find_record_files(
    directory: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
) -> list[Path]:
    """The record files directly in ``directory``, sorted by name; one that is not a regular
    file inside ``root`` (default ``directory``) is a ``RefusedFile``."""
    return regular_files(directory, _is_record_file, recursive=False, root=root)


def _is_record_file(name: str) -> bool:
    return name.endswith(RECORD_SUFFIXES)


def read_ci_history_dir(
    path: str | os.PathLike[str],
    *,
    live: bool = False,
    root: str | os.PathLike[str] | None = None,
) -> SeriesMap:
    """The merged series of every record file in ``path``.

    ``live`` leaves out an unterminated last line (an appending writer's line in flight).
    Raises :class:`MetricsFormatError` naming file and line, ``FileNotFoundError`` or
    ``NotADirectoryError`` for a bad ``path``, ``RefusedFile`` for a record file that is not
    a regular file inside ``root`` (default ``path``) or is over its cap. No record files
    give an empty map.
    """
    directory = Path(path)
    if not directory.exists():
        raise FileNotFoundError(f"{directory}: no such CI-history directory")
    if not directory.is_dir():
        raise NotADirectoryError(f"{directory}: expected a CI-history directory, found a file")
    within = directory if root is None else root
    points: dict[str, list[Point]] = {}
    origins: dict[str, dict[int, tuple[float, str, int]]] = {}  # metric -> step -> first place
    for file in find_record_files(directory, root=within):
        for metric, (line, file_points) in read_record_file(file, live=live, root=within).items():
            merged = points.setdefault(metric, [])
            seen = origins.setdefault(metric, {})
            in_this_file: set[int] = set()
            for step, value in file_points:
                first = seen.get(step)
                if first is None:
                    seen[step] = (value, str(file), line)
                elif not _same(first[0], value):
                    raise MetricsFormatError(
                        str(file),
                        line,
                        f"{metric!r} at step {step} is {value!r} here but {first[0]!r} in "
                        f"{first[1]}:{first[2]} (records of two different runs in one "
                        "ci_history/? keep one run per directory)",
                    )
                elif step not in in_this_file:
                    in_this_file.add(step)
                    continue  # first recorded by another file: the same observation, kept once
                in_this_file.add(step)
                merged.append((step, value))
    return normalise_map(points)


def read_record_file(
    path: str | os.PathLike[str],
    *,
    live: bool = False,
    root: str | os.PathLike[str] | None = None,
) -> dict[str, tuple[int, list[Point]]]:
    """``metric -> (line number, points)`` of one record file, points in file order."""
    name = os.fspath(path)
    data = read_regular(name, RECORD_FILE, root=root)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        bad_line = data.count(b"\n", 0, error.start) + 1
        raise MetricsFormatError(name, bad_line, "not UTF-8 text (corrupt record file)") from None
    lines = text.split("\n")
    if live and not text.endswith("\n"):
        lines.pop()  # the unterminated line a writer is still appending
    metrics: dict[str, tuple[int, list[Point]]] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        metric, points = _parse_line(line, name, number)
        if metric in metrics:
            raise MetricsFormatError(
                name, number, f"metric {metric!r} already appeared at line {metrics[metric][0]}"
            )
        metrics[metric] = (number, points)
    return metrics


def _parse_line(line: str, path: str, number: int) -> tuple[str, list[Point]]:
    try:
        record = strict_json.loads(line, non_finite=True)
    except strict_json.StrictJsonError as error:
        raise MetricsFormatError(path, number, f"{error}; truncated or corrupt line") from None
    if not isinstance(record, dict):
        raise MetricsFormatError(path, number, 'expected an object {"metric": ..., "series": ...}')
    metric = record.get("metric")
    series = record.get("series")
    if not isinstance(metric, str) or not metric:
        raise MetricsFormatError(path, number, f'"metric" must be a non-empty string: {metric!r}')
    if not isinstance(series, list):
        raise MetricsFormatError(path, number, f'"series" of {metric!r} must be a list')
    points: list[Point] = []
    for index, point in enumerate(series):
        parsed = _point(point)
        if parsed is None:
            raise MetricsFormatError(
                path, number, f"point {index} of {metric!r} is {point!r}: {_EXPECTED_POINT}"
            )
        points.append(parsed)
    return metric, points


def _point(point: object) -> Point | None:
    if not (isinstance(point, list) and len(point) == 2):
        return None
    step, value = point
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    if isinstance(value, str):
        number = _NON_FINITE.get(value)
        return None if number is None else (step, number)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return (step, float(value))
    except OverflowError:
        return None


def _same(a: float, b: float) -> bool:
    return a == b or (a != a and b != b)
