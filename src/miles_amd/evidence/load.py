"""A run directory read into one :class:`~miles_amd.evidence.types.RunEvidence`.

- What was read and what could not be, from the optional parts of a run dir:
  ``tensorboard/``, ``ci_history/*.jsonl``, ``job.log``, ``job.json``, ``env.json``,
  ``plan.json``, ``canary.json``.
- A source that fails to read is a :class:`~miles_amd.evidence.types.SourceProblem` naming
  file and offset or line; the other sources still count, and a failed source is not an
  empty series. A present metric source that holds nothing, or no metric source at all, is
  a problem too: a gate must not pass on evidence it did not see.
- The JSON files are read into their records (``miles_amd.records``); a bad field is a
  problem naming it; a missing record is ``None`` (the gate decides what absence means).
- ``job.log`` is read once, streamed (``log_lines``): each block feeds both the metric-line
  parser (``job_log``) and the sentinel scan (``sentinels``).
- ``live=True`` is the watcher's view of a run being written: writes in flight are left out
  and empty sources are not problems yet (a CRC mismatch still is).

Caveats:

- A run dir holding a file ``safe_open`` refuses (a link, a FIFO, a device, a file over its
  cap) is not read at all: its evidence is only the problems, so the gate exits 2 naming it.
- Does not decide whether the run passes (``gate``) or what a log signature is.

Explained in ``docs/cli.md`` ("How the gate reads a run dir").
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from miles_amd.evidence.ci_history import find_record_files, read_ci_history_dir
from miles_amd.evidence.errors import MetricsFormatError
from miles_amd.evidence.job_log import MetricLines
from miles_amd.evidence.log_lines import line_blocks
from miles_amd.evidence.merge import merge_sources
from miles_amd.evidence.safe_open import (
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
from miles_amd.evidence.sentinels import SentinelScan
from miles_amd.evidence.tensorboard import find_event_files, read_tensorboard_dir
from miles_amd.evidence.tfrecord import EventFileError
from miles_amd.evidence.types import (
    CanaryRecord,
    EnvRecord,
    JobRecord,
    PlanRecord,
    RecordName,
    RunEvidence,
    SentinelHit,
    SeriesMap,
    SourceName,
    SourceProblem,
)
from miles_amd.records.job import json_object
from miles_amd.run_dir import RunDir

REFUSED = "refused (untrusted input): "
ProblemSource = SourceName | RecordName
R = TypeVar("R")


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
    log = _LogPass()
    per_source = _read_metric_sources(layout, live, problems, log)
    series, sources, conflicts = merge_sources(per_source)
    job = _read_record(layout.job_json, JOB_JSON, "job_json", JobRecord.from_dict, problems, root)
    env = _read_record(layout.env_json, ENV_JSON, "env_json", EnvRecord.from_dict, problems, root)
    plan = _read_record(
        layout.plan_json, PLAN_JSON, "plan_json", PlanRecord.from_dict, problems, root
    )
    canary = _read_record(
        layout.canary_json, CANARY_JSON, "canary_json", CanaryRecord.from_dict, problems, root
    )
    sentinels = log.hits
    if any(problem.detail.startswith(REFUSED) for problem in problems):
        return _refused_run(root, problems)
    return RunEvidence(
        run_dir=str(root),
        series=series,
        sources=sources,
        problems=tuple(problems),
        conflicts=conflicts,
        job=job,
        env=env,
        plan=plan,
        canary=canary,
        sentinels=sentinels,
    )


def _refused_run(root: Path, problems: list[SourceProblem]) -> RunEvidence:
    """A run dir holding a refused file: nothing from it is used, only the problems.

    The gate then has nothing readable and exits 2 (unusable input) naming the files, and
    ``baseline record`` refuses it; the watcher sees no failure to trip on. A problem alone
    would not do: the gate fails (exit 1) on a bad source beside good ones.
    """
    names = [
        os.path.relpath(problem.path, root)
        for problem in problems
        if problem.detail.startswith(REFUSED)
    ]
    summary = SourceProblem(
        "run_dir",
        str(root),
        f"not read: {', '.join(names)} refused as untrusted input (reasons listed next)",
    )
    return RunEvidence(run_dir=str(root), series={}, sources={}, problems=(summary, *problems))


def _refusal(source: ProblemSource, error: RefusedFile) -> SourceProblem:
    return SourceProblem(source, error.path, REFUSED + error.reason)


def _read_metric_sources(
    layout: RunDir, live: bool, problems: list[SourceProblem], log: _LogPass
) -> dict[SourceName, SeriesMap]:
    """The series of every metric source present; what fails is appended to ``problems``."""
    per_source: dict[SourceName, SeriesMap] = {}
    present = 0
    readers: tuple[tuple[SourceName, Path, _Reader], ...] = (
        ("tensorboard", layout.tensorboard, _read_tensorboard),
        ("ci_history", layout.ci_history, _read_ci_history),
        ("job_log", layout.job_log, log.read),
    )
    for source, path, read in readers:
        if not os.path.lexists(path):
            continue
        present += 1
        try:
            per_source[source] = read(path, layout.root, live)
        except RefusedFile as error:
            problems.append(_refusal(source, error))
        except EventFileError as error:
            detail = f"offset {error.offset}: {error.reason}"
            problems.append(SourceProblem(source, error.path, detail))
        except MetricsFormatError as error:
            problems.append(SourceProblem(source, error.path, f"line {error.line}: {error.reason}"))
        except _EmptySource as empty:
            if not live:
                problems.append(SourceProblem(source, str(path), str(empty)))
        except OSError as error:
            problems.append(SourceProblem(source, str(path), f"unreadable: {error}"))
    if not present and not live:
        detail = "no metric source (tensorboard/, ci_history/ or job.log) in the run directory"
        problems.append(SourceProblem("run_dir", str(layout.root), detail))
    return per_source


class _EmptySource(Exception):
    """A present metric source that holds no points (a problem unless the run is live)."""


def _read_tensorboard(path: Path, root: Path, live: bool) -> SeriesMap:
    series = read_tensorboard_dir(path, live=live, root=root)
    if not series:
        if not find_event_files(path, root=root):
            raise _EmptySource("no event files (is TENSORBOARD_DIR set and --use-tensorboard on?)")
        raise _EmptySource("the event files hold no scalar summaries")
    return series


def _read_ci_history(path: Path, root: Path, live: bool) -> SeriesMap:
    series = read_ci_history_dir(path, live=live, root=root)
    if not series:
        if not find_record_files(path, root=root):
            raise _EmptySource(
                "no *.jsonl records (was MILES_CI_GATE_RECORD_DIR set in the job's env?)"
            )
        raise _EmptySource("the records hold no points")
    return series


class _LogPass:
    """``job.log`` in one streaming pass: its metric lines and its sentinel hits.

    A metric line that cannot be read stops the metric parse (the error is raised after the
    pass) but not the sentinel scan: a broken log's fatal signatures still count.
    """

    def __init__(self) -> None:
        self.hits: tuple[SentinelHit, ...] = ()

    def read(self, path: Path, root: Path, live: bool) -> SeriesMap:
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
        self.hits = scan.hits()
        if error is not None:
            raise error
        series = metrics.series()
        if not series:
            raise _EmptySource("no metric lines (step/rollout/perf <n>: {...}) in the log")
        return series


_Reader = Callable[[Path, Path, bool], SeriesMap]


def _read_record(
    path: Path,
    limit: Limit,
    source: RecordName,
    parse: Callable[[dict[str, object]], R],
    problems: list[SourceProblem],
    root: Path,
) -> R | None:
    """The record in ``path``; None if absent or unreadable (then a problem is added)."""
    if not os.path.lexists(path):
        return None
    try:
        return parse(json_object(read_regular(path, limit, root=root)))
    except RefusedFile as error:
        problems.append(_refusal(source, error))
    except (OSError, ValueError) as error:
        problems.append(SourceProblem(source, str(path), str(error)))
    return None
