"""A run directory read into one :class:`~miles_amd.evidence.types.RunEvidence`: a source or
record that fails to read is a :class:`~miles_amd.evidence.types.SourceProblem` naming file and
offset or line (the others still count); an empty metric source, or none, is a problem too; a
run dir holding a file ``miles_amd.files`` refuses is not read at all (the gate exits 2). One
series per metric: the first of :data:`PREFERENCE` carrying it; another source's value agreeing
with none at that step beyond float32 noise is a conflict. ``docs/cli.md`` explains.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable, Mapping
from itertools import chain
from pathlib import Path
from typing import Any

from miles_amd.evidence.ci_history import find_record_files, read_ci_history_dir
from miles_amd.evidence.job_log import MetricLines, line_blocks
from miles_amd.evidence.sentinels import SentinelScan
from miles_amd.evidence.tensorboard import EventFileError, find_event_files, read_tensorboard_dir
from miles_amd.evidence.types import (
    CanaryRecord,
    Conflict,
    EnvRecord,
    JobRecord,
    MetricsFormatError,
    PlanRecord,
    RecordName,
    RunEvidence,
    SentinelHit,
    Series,
    SeriesMap,
    SourceName,
    SourceProblem,
)
from miles_amd.files import (
    CANARY_JSON,
    ENV_JSON,
    JOB_JSON,
    JOB_LOG,
    PLAN_JSON,
    Limit,
    RefusedFile,
    open_regular,
    read_regular,
)
from miles_amd.records.job import json_object
from miles_amd.run_dir import RunDir

REFUSED = "refused (untrusted input): "


class _EmptySource(Exception):
    pass


def load_run(run_dir: str | os.PathLike[str], *, live: bool = False) -> RunEvidence:
    """Everything in ``run_dir``, read strictly; ``FileNotFoundError`` if it does not exist."""
    root = Path(run_dir)
    if not root.exists():
        raise FileNotFoundError(
            f"run directory {root} does not exist; pass the directory a run wrote "
            "(tensorboard/, ci_history/, job.log, job.json)"
        )
    if not root.is_dir():
        raise NotADirectoryError(f"run directory {root} is a file; pass the run's directory")
    layout = RunDir(root)
    problems: list[SourceProblem] = []
    hits: list[SentinelHit] = []

    def read_log(path: Path) -> SeriesMap:
        # a bad metric line stops the metric parse (raised after the pass), not the sentinel
        # scan: a broken log's fatal signatures still count
        metrics, scan = MetricLines(str(path)), SentinelScan()
        error: MetricsFormatError | None = None
        handle, size = open_regular(path, JOB_LOG, root=root)
        with handle:
            for first_line, text in line_blocks(handle, size, live=live):
                scan.feed(first_line, text)
                if error is None:
                    try:
                        metrics.feed(first_line, text)
                    except MetricsFormatError as failed:
                        error = failed
        hits.extend(scan.hits())
        if error is not None:
            raise error
        if read := metrics.series():
            return read
        raise _EmptySource("no metric lines (step/rollout/perf <n>: {...}) in the log")

    def metric_dir(read: Any, find: Any, no_files: str, no_points: str) -> Any:
        def read_dir(path: Path) -> SeriesMap:
            if series := read(path, live=live, root=root):
                return series
            raise _EmptySource(no_points if find(path, root=root) else no_files)

        return read_dir

    per_source: dict[SourceName, SeriesMap] = {}
    readers: tuple[tuple[SourceName, Path, Callable[[Path], SeriesMap]], ...] = (
        (
            "tensorboard",
            layout.tensorboard,
            metric_dir(
                read_tensorboard_dir,
                find_event_files,
                "no event files (is TENSORBOARD_DIR set and --use-tensorboard on?)",
                "the event files hold no scalar summaries",
            ),
        ),
        (
            "ci_history",
            layout.ci_history,
            metric_dir(
                read_ci_history_dir,
                find_record_files,
                "no *.jsonl records (was MILES_CI_GATE_RECORD_DIR set in the job's env?)",
                "the records hold no points",
            ),
        ),
        ("job_log", layout.job_log, read_log),
    )
    present = [(s, p, r) for s, p, r in readers if os.path.lexists(p)]
    for source, path, read in present:
        try:
            per_source[source] = read(path)
        except RefusedFile as error:
            problems.append(SourceProblem(source, error.path, REFUSED + error.reason))
        except EventFileError as error:
            problems.append(
                SourceProblem(source, error.path, f"offset {error.offset}: {error.reason}")
            )
        except MetricsFormatError as error:
            problems.append(SourceProblem(source, error.path, f"line {error.line}: {error.reason}"))
        except _EmptySource as empty:
            if not live:
                problems.append(SourceProblem(source, str(path), str(empty)))
        except OSError as error:
            problems.append(SourceProblem(source, str(path), f"unreadable: {error}"))
    if not present and not live:
        detail = "no metric source (tensorboard/, ci_history/ or job.log) in the run directory"
        problems.append(SourceProblem("run_dir", str(root), detail))
    series, sources, conflicts = merge_sources(per_source)
    records: dict[str, Any] = {}
    specs: tuple[tuple[RecordName, Path, Limit, Any], ...] = (
        ("job_json", layout.job_json, JOB_JSON, JobRecord),
        ("env_json", layout.env_json, ENV_JSON, EnvRecord),
        ("plan_json", layout.plan_json, PLAN_JSON, PlanRecord),
        ("canary_json", layout.canary_json, CANARY_JSON, CanaryRecord),
    )
    for record_name, path, limit, record in specs:
        if not os.path.lexists(path):
            continue
        try:
            data = json_object(read_regular(path, limit, root=root))
            records[record_name] = record.from_dict(data)
        except RefusedFile as error:
            problems.append(SourceProblem(record_name, error.path, REFUSED + error.reason))
        except (OSError, ValueError) as error:
            problems.append(SourceProblem(record_name, str(path), str(error)))
    refused = [os.path.relpath(p.path, root) for p in problems if p.detail.startswith(REFUSED)]
    if refused:  # nothing from the run dir is used: the gate exits 2 naming the files
        reason = f"not read: {', '.join(refused)} refused as untrusted input (reasons listed next)"
        summary = SourceProblem("run_dir", str(root), reason)
        return RunEvidence(run_dir=str(root), series={}, sources={}, problems=(summary, *problems))
    return RunEvidence(
        run_dir=str(root),
        series=series,
        sources=sources,
        problems=tuple(problems),
        conflicts=conflicts,
        job=records.get("job_json"),
        env=records.get("env_json"),
        plan=records.get("plan_json"),
        canary=records.get("canary_json"),
        sentinels=tuple(hits),
    )


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
    """Fast and sufficient (False: look closer): same steps, bit-equal finite float32s."""
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
    return memoryview(struct.pack(f"<{2 * len(series)}d", *chain.from_iterable(series))).cast("d")
