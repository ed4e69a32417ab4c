"""The run-history store: one SQLite file of plain SQL, schema versioned, verdicts appended.

A ``meta.schema_version`` other than :data:`SCHEMA_VERSION` is refused, not migrated; an append
is one transaction; a row read back is untrusted: each column checked against its field's type,
a bad row skipped with a reason. A ``read_only`` store is neither created nor modified.
Explained in ``docs/gate-and-statistics.md`` ("How runs are stored").
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import astuple, dataclass, field, fields
from pathlib import Path
from typing import Any

from miles_amd import numeric, strict_json
from miles_amd.variants import AITER_VARIANTS

SCHEMA_VERSION = 4
_MARKERS = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}  # upstream's capture markers


class HistoryError(ValueError):
    """A history file that cannot be used; ``str()`` names the file and the fix."""


@dataclass(frozen=True)
class Summary:
    n: int
    mean: float
    sd: float | None
    min: float
    max: float


def summarize(values: Sequence[float]) -> Summary | None:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    sd = numeric.stdev(finite) if len(finite) >= 2 else None
    sd = sd if sd is None or math.isfinite(sd) else None  # beyond the float range: unknown
    return Summary(len(finite), numeric.mean(finite), sd, min(finite), max(finite))


@dataclass(frozen=True)
class Identity:
    recipe: str
    recipe_digest: str | None
    variant: str | None
    aiter_commit: str | None

    def label(self) -> str:
        commit = f"@{self.aiter_commit}" if self.aiter_commit else ""
        digest = f" {self.recipe_digest}" if self.recipe_digest else ""
        return f"{self.variant or 'variant-unrecorded'}{commit}{digest}"


@dataclass(frozen=True)
class RunRow:
    """The ``runs`` columns after ``run_id``, in table order."""

    created_at: str  # ISO-8601, UTC
    recipe: str
    recipe_digest: str | None  # of plan.json's recipe
    variant: str | None  # env.json's aiter_variant (else plan.json's); one of AITER_VARIANTS
    aiter_commit: str | None  # env.json's aiter fact
    baseline: str
    image: str | None
    commit_sha: str | None
    run_dir: str
    verdict: str
    reason: str
    rollouts: int
    failed_checks: tuple[str, ...]  # stored as a JSON list
    run_key: str | None = field(default=None, kw_only=True)  # entry.run_key: counted once
    # a red run: the rollouts after which it was decided, and by which check
    decided_at_rollout: int | None = field(default=None, kw_only=True)
    decided_by: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True)
class HistoryRecord(RunRow):
    series: Mapping[str, Sequence[tuple[int, float]]] = field(default_factory=dict)


@dataclass(frozen=True)
class StoredRun(RunRow):
    run_id: int
    summaries: Mapping[str, Summary]
    marked_untrusted: bool = False

    @property
    def trusted(self) -> bool:
        return self.verdict == "pass" and not self.marked_untrusted

    @property
    def identity(self) -> Identity:
        return Identity(self.recipe, self.recipe_digest, self.variant, self.aiter_commit)


@dataclass(frozen=True)
class HistoryRead:
    runs: list[StoredRun]
    skipped: list[str]


_RUN_FIELDS = fields(RunRow)
_RUN_COLUMNS = ", ".join(f.name for f in _RUN_FIELDS)
_SUMMARY_COLUMNS = "n, mean, sd, min, max"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at TEXT NOT NULL, recipe TEXT NOT NULL, recipe_digest TEXT, variant TEXT,
    aiter_commit TEXT, baseline TEXT NOT NULL, image TEXT, commit_sha TEXT,
    run_dir TEXT NOT NULL, verdict TEXT NOT NULL, reason TEXT NOT NULL,
    rollouts INTEGER NOT NULL, failed_checks TEXT NOT NULL, run_key TEXT,
    decided_at_rollout INTEGER, decided_by TEXT
);
CREATE TABLE IF NOT EXISTS summaries (
    run_id INTEGER NOT NULL REFERENCES runs(run_id),
    metric TEXT NOT NULL,
    n INTEGER NOT NULL, mean REAL NOT NULL, sd REAL, min REAL NOT NULL, max REAL NOT NULL,
    PRIMARY KEY (run_id, metric)
);
CREATE TABLE IF NOT EXISTS metric_values (
    run_id INTEGER NOT NULL REFERENCES runs(run_id),
    metric TEXT NOT NULL,
    step   INTEGER NOT NULL,
    value  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS nonfinite_values (
    run_id INTEGER NOT NULL REFERENCES runs(run_id),
    metric TEXT NOT NULL,
    step   INTEGER NOT NULL,
    marker TEXT NOT NULL CHECK (marker IN ('NaN', 'Infinity', '-Infinity'))
);
CREATE TABLE IF NOT EXISTS untrusted_marks (
    run_id INTEGER PRIMARY KEY REFERENCES runs(run_id),
    marked_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_identity_idx ON runs (recipe, variant, aiter_commit, created_at);
"""


def _from_row(row: Sequence[Any]) -> dict[str, Any]:
    found = {}
    for f, value in zip(_RUN_FIELDS, row, strict=True):
        if f.name == "failed_checks":
            value = strict_json.loads(value) if isinstance(value, str) else None
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"column {f.name} is not a JSON list of names")
            value = tuple(value)
        elif value is None and "None" in str(f.type):
            pass
        elif not isinstance(value, int if str(f.type).startswith("int") else str) or isinstance(
            value, bool
        ):
            raise ValueError(f"column {f.name} holds {type(value).__name__} {value!r:.60}")
        elif f.name == "variant" and value not in AITER_VARIANTS:
            known = ", ".join(AITER_VARIANTS)
            raise ValueError(f"column {f.name} holds {value!r:.60}, not one of {known}")
        found[f.name] = value
    return found


def _summary(metric: object, figures: Sequence[Any]) -> Summary:
    # mean is not checked against min/max (a float mean may lie an ulp outside them)
    n, mean, sd, low, high = figures
    numbers = (mean, low, high) if sd is None else (mean, sd, low, high)
    if (
        not (isinstance(metric, str) and isinstance(n, int) and n > 0)
        or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers)
        or (sd is not None and sd < 0)
    ):
        raise ValueError(f"summary of {metric!r:.60} is not n > 0, finite numbers and sd >= 0")
    return Summary(n, mean, sd, low, high)


class HistoryStore:
    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        self.path = Path(path)
        try:
            if read_only:
                uri = self.path.resolve().as_uri() + "?mode=ro"
                self._db = sqlite3.connect(uri, uri=True, timeout=30.0)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(self.path, timeout=30.0)
                self._db.execute("PRAGMA foreign_keys = ON")
            found = self._version()
            if found is None and not read_only:
                with self._db:
                    self._db.executescript(_SCHEMA)
                    self._db.execute(
                        "INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                        (str(SCHEMA_VERSION),),
                    )
                found = self._version()
        except (OSError, sqlite3.Error) as exc:
            raise HistoryError(f"{self.path}: cannot open the history ({exc})") from exc
        if found != str(SCHEMA_VERSION):
            self._db.close()
            raise HistoryError(
                f"{self.path}: not a miles-amd history (no schema in it); point --history "
                "at a file `miles-amd gate --history` wrote"
                if found is None
                else f"{self.path}: history schema version {found}, this miles-amd writes "
                f"{SCHEMA_VERSION}; use another file or a matching miles-amd"
            )

    def _version(self) -> str | None:
        sql = "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'"
        if not self._db.execute(sql).fetchone():
            return None
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        return None if row is None else str(row[0])

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def append(self, record: HistoryRecord) -> int:
        with self.appending(record) as run_id:
            return run_id

    @contextlib.contextmanager
    def appending(self, record: HistoryRecord) -> Iterator[int]:
        """Add one run in a transaction committed when the block ends; yields its ``run_id``."""
        with self._db:
            marks = ", ".join("?" * len(_RUN_FIELDS))
            values = (getattr(record, f.name) for f in _RUN_FIELDS)  # failed_checks as JSON:
            row = [json.dumps(list(v)) if isinstance(v, tuple) else v for v in values]
            cursor = self._db.execute(f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES ({marks})", row)
            run_id = int(cursor.lastrowid or 0)
            series = sorted(record.series.items())
            summaries = [(m, summarize([v for _, v in points])) for m, points in series]
            self._db.executemany(
                f"INSERT INTO summaries (run_id, metric, {_SUMMARY_COLUMNS}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(run_id, m, *astuple(summary)) for m, summary in summaries if summary],
            )
            points = [(run_id, m, s, v) for m, values in series for s, v in values]
            self._db.executemany(
                "INSERT INTO metric_values (run_id, metric, step, value) VALUES (?, ?, ?, ?)",
                [row for row in points if math.isfinite(row[3])],
            )
            self._db.executemany(
                "INSERT INTO nonfinite_values (run_id, metric, step, marker) VALUES (?, ?, ?, ?)",
                [(*row[:3], _MARKERS[str(row[3])]) for row in points if not math.isfinite(row[3])],
            )
            yield run_id

    def mark(self, run_id: int, *, untrusted: bool, now: str) -> bool:
        with self._db:
            if not self._db.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone():
                raise HistoryError(f"{self.path}: no run {run_id} in the history")
            if untrusted:
                sql = "INSERT OR IGNORE INTO untrusted_marks (run_id, marked_at) VALUES (?, ?)"
                cursor = self._db.execute(sql, (run_id, now))
            else:
                cursor = self._db.execute("DELETE FROM untrusted_marks WHERE run_id = ?", (run_id,))
        return cursor.rowcount > 0

    def runs(
        self, *, variant: str | None = None, baseline: str | None = None, limit: int | None = None
    ) -> list[StoredRun]:
        return self.read_runs(variant=variant, baseline=baseline, limit=limit).runs

    def read_runs(
        self, *, variant: str | None = None, baseline: str | None = None, limit: int | None = None
    ) -> HistoryRead:
        """Runs oldest first, optionally filtered, the newest ``limit``; a row that cannot be
        read is skipped and named (when even the ids cannot be read, each is tried alone)."""
        where, args = [], []
        for column, value in (("variant", variant), ("baseline", baseline)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        sql = "SELECT run_id FROM runs" + (f" WHERE {' AND '.join(where)}" if where else "")
        sql += " ORDER BY run_id DESC" + (f" LIMIT {int(limit)}" if limit else "")
        try:
            ids = sorted(int(row[0]) for row in self._db.execute(sql, args).fetchall())
        except sqlite3.DatabaseError:  # try each id alone
            try:
                top = self._db.execute("SELECT max(run_id) FROM runs").fetchone()[0]
            except sqlite3.DatabaseError as exc:
                raise HistoryError(f"{self.path}: the runs table cannot be read ({exc})") from exc
            ids = list(range(1, int(top or 0) + 1))
        runs: list[StoredRun] = []
        skipped: list[str] = []
        for run_id in ids:
            try:
                row = self._db.execute(
                    f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)
                ).fetchone()
                if row is None:
                    continue
                summaries = {
                    metric: _summary(metric, figures)
                    for metric, *figures in self._db.execute(
                        f"SELECT metric, {_SUMMARY_COLUMNS} FROM summaries WHERE run_id = ?",
                        (run_id,),
                    )
                }
                sql = "SELECT 1 FROM untrusted_marks WHERE run_id = ?"
                marked = self._db.execute(sql, (run_id,)).fetchone() is not None
                run = StoredRun(**_from_row(row), run_id=run_id, summaries=summaries,
                                marked_untrusted=marked)  # fmt: skip
            except (sqlite3.DatabaseError, ValueError, TypeError) as exc:
                reason = " ".join(str(exc).split())
                skipped.append(f"history: run {run_id} of {self.path} skipped: {reason}")
                continue
            if variant in (None, run.variant) and baseline in (None, run.baseline):
                runs.append(run)
        return HistoryRead(runs[-limit:] if limit else runs, skipped)

    def series(self, run_id: int) -> dict[str, list[tuple[int, float]]]:
        found: dict[str, list[tuple[int, float]]] = {}
        for metric, step, value, nonfinite in self._db.execute(
            "SELECT metric, step, value, t FROM ("
            " SELECT rowid AS n, 0 AS t, metric, step, value FROM metric_values WHERE run_id = ?"
            " UNION ALL"
            " SELECT rowid, 1, metric, step, CAST(marker AS TEXT) FROM nonfinite_values"
            " WHERE run_id = ?) ORDER BY metric, step, t, n",
            (run_id, run_id),
        ):
            number = _point(step, value, marker=bool(nonfinite))
            if not isinstance(metric, str) or number is None:
                raise ValueError(
                    f"run {run_id}: a stored point of {metric!r:.60} is not an integer step "
                    f"and a value ({step!r:.30}, {value!r:.30})"
                )
            found.setdefault(metric, []).append((step, number))
        return found


def _point(step: object, value: object, *, marker: bool) -> float | None:
    if not isinstance(step, int) or isinstance(step, bool):
        return None
    if marker:
        return float(value) if value in _MARKERS.values() else None  # type: ignore[arg-type]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
