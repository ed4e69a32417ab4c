"""Metric series from miles' CI-history records (``ci_history/*.jsonl``), read strictly:
each line ``{"metric": str, "series": [[step, value], ...]}`` by ``miles_amd.strict_json``,
a metric once per file, a step with two values across files an error, at most
:data:`MAX_RECORD_FILES` files and :data:`MAX_POINTS` points. The format and each rule's
reason: ``docs/cli.md`` ("How the gate reads a run dir").
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from pathlib import Path

from miles_amd import strict_json
from miles_amd.evidence.types import (
    Columns,
    MetricsFormatError,
    Point,
    SeriesMap,
    columns_to_series,
    new_columns,
)
from miles_amd.files import RECORD_FILE, read_regular, regular_files

RECORD_SUFFIXES = (".jsonl", ".ndjson")
# miles writes one file per process (2 in the recipe's runs) of 5 keys: 5,000 points a
# 1000-rollout run
MAX_RECORD_FILES = 64
MAX_POINTS = 1_000_000  # all files together; ~150 bytes each once parsed
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_EXPECTED_POINT = (
    'expected [step, value]: an integer step and a number or "NaN"/"Infinity"/"-Infinity"'
)


def find_record_files(
    directory: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
) -> list[Path]:
    """The record files directly in ``directory``, sorted by name (``RefusedFile`` for one
    that is not a regular file inside ``root``, default ``directory``)."""
    return regular_files(
        directory,
        lambda name: name.endswith(RECORD_SUFFIXES),
        recursive=False,
        root=root,
        max_files=MAX_RECORD_FILES,
    )


def read_ci_history_dir(
    path: str | os.PathLike[str],
    *,
    live: bool = False,
    root: str | os.PathLike[str] | None = None,
) -> SeriesMap:
    """The merged series of every record file in ``path`` (none: an empty map); ``live``
    leaves out an unterminated last line. :class:`MetricsFormatError`, ``OSError``."""
    within = path if root is None else root
    points: defaultdict[str, Columns] = defaultdict(new_columns)
    origins: dict[str, dict[int, tuple[float, str, int]]] = {}  # metric -> step -> first place
    budget = MAX_POINTS
    for file in find_record_files(path, root=within):
        records = read_record_file(file, live=live, root=within, max_points=budget)
        budget -= sum(len(file_points) for _, file_points in records.values())
        for metric, (line, file_points) in records.items():
            steps, values = points[metric]
            seen = origins.setdefault(metric, {})
            in_this_file: set[int] = set()
            for step, value in file_points:
                first = seen.get(step)
                if first is None:
                    seen[step] = (value, str(file), line)
                elif not (first[0] == value or (first[0] != first[0] and value != value)):
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
                steps.append(step)
                values.append(value)
    return columns_to_series(points)


def read_record_file(
    path: str | os.PathLike[str],
    *,
    live: bool = False,
    root: str | os.PathLike[str] | None = None,
    max_points: int = MAX_POINTS,
) -> dict[str, tuple[int, list[Point]]]:
    """``metric -> (line number, points)`` of one record file, points in file order; a line
    whose brackets allow more than ``max_points`` points is refused before it is parsed."""
    name = os.fspath(path)
    data = read_regular(name, RECORD_FILE, root=root)
    metrics: dict[str, tuple[int, list[Point]]] = {}
    lines = data.split(b"\n")
    if live:
        lines.pop()  # unterminated: the line in flight ("" when the file ends with a newline)
    for number, raw in enumerate(lines, start=1):
        if raw.count(b"[") - 1 > max_points:  # counted before it is parsed
            raise MetricsFormatError(
                name,
                number,
                f"more points than the {MAX_POINTS:,} a ci_history/ may hold (a 1000-rollout "
                "run records 5,000); this is not a record miles wrote",
            )
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise MetricsFormatError(name, number, "not UTF-8 text (corrupt record file)") from None
        if not line.strip():
            continue
        metric, points = _parse_line(line, name, number)
        max_points -= len(points)
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
