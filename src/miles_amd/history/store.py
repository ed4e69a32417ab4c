"""The run-history store: one SQLite file, schema versioned, every gate verdict appended.

Decides what is kept of a judged run and where: a row in ``runs`` (when, recipe, aiter
variant, baseline, image, commit, run dir, verdict, reason, rollouts, the failed checks),
its per-metric summary in ``summaries`` (n, mean, sd, min, max of the finite values) and its
finite per-rollout values in ``metric_values`` (the shape of upstream miles'
``tests/ci/metric_history`` store: non-finite values never enter it; the verdict records the
failure). ``meta.schema_version`` is :data:`SCHEMA_VERSION`; a file of another version is
refused, never migrated silently. Standard library only (``sqlite3``); appends are one
transaction each, so concurrent writers (SQLite's file lock, 30 s timeout) never leave half
a run.

Where: the file the CLI names (``--history PATH`` or ``$MILES_AMD_HISTORY``;
``miles_amd.cli.options.named_history``); there is no default file. A store opened
``read_only`` (listing) is never created, initialised or modified. It does not decide what a
drift is (``miles_amd.history.drift``) nor when to append (``miles-amd gate`` and
``train --gate``, when a history is named).
"""

from __future__ import annotations

import json
import math
import sqlite3
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id        INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at    TEXT NOT NULL,
    recipe        TEXT NOT NULL,
    variant       TEXT,
    baseline      TEXT NOT NULL,
    image         TEXT,
    commit_sha    TEXT,
    run_dir       TEXT NOT NULL,
    verdict       TEXT NOT NULL,
    reason        TEXT NOT NULL,
    rollouts      INTEGER NOT NULL,
    failed_checks TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS summaries (
    run_id INTEGER NOT NULL REFERENCES runs(run_id),
    metric TEXT NOT NULL,
    n      INTEGER NOT NULL,
    mean   REAL NOT NULL,
    sd     REAL,
    min    REAL NOT NULL,
    max    REAL NOT NULL,
    PRIMARY KEY (run_id, metric)
);
CREATE TABLE IF NOT EXISTS metric_values (
    run_id INTEGER NOT NULL REFERENCES runs(run_id),
    metric TEXT NOT NULL,
    step   INTEGER NOT NULL,
    value  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_identity_idx ON runs (recipe, variant, baseline, created_at);
"""


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
    """The summary of the finite ``values`` (None when there is none)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    sd = statistics.stdev(finite) if len(finite) >= 2 else None
    return Summary(len(finite), math.fsum(finite) / len(finite), sd, min(finite), max(finite))


@dataclass(frozen=True)
class HistoryRecord:
    """One judged run as the store keeps it."""

    created_at: str  # ISO-8601, UTC
    recipe: str
    variant: str | None
    baseline: str
    image: str | None
    commit_sha: str | None
    run_dir: str
    verdict: str
    reason: str
    rollouts: int
    failed_checks: tuple[str, ...]
    series: Mapping[str, Sequence[tuple[int, float]]] = field(default_factory=dict)


_RUN_COLUMNS = (
    "run_id",
    "created_at",
    "recipe",
    "variant",
    "baseline",
    "image",
    "commit_sha",
    "run_dir",
    "verdict",
    "reason",
    "rollouts",
)  # the leading columns of the runs table, in order; failed_checks (JSON) follows


@dataclass(frozen=True)
class StoredRun:
    """A run read back: its row and its per-metric summaries."""

    run_id: int
    created_at: str
    recipe: str
    variant: str | None
    baseline: str
    image: str | None
    commit_sha: str | None
    run_dir: str
    verdict: str
    reason: str
    rollouts: int
    failed_checks: tuple[str, ...]
    summaries: Mapping[str, Summary]


class HistoryStore:
    """The SQLite file at ``path``: created with its directory when absent, unless
    ``read_only`` (then it must exist and hold a history, and is opened read-only)."""

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
            if found is None and read_only:
                self._db.close()
                raise HistoryError(
                    f"{self.path}: not a miles-amd history (no schema in it); point --history "
                    "at a file `miles-amd gate --history` wrote"
                )
            if found is None:
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
                f"{self.path}: history schema version {found}, this miles-amd writes "
                f"{SCHEMA_VERSION}; use another file or a matching miles-amd"
            )

    def _version(self) -> str | None:
        has_meta = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'"
        ).fetchone()
        if not has_meta:
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
        """Add one run (one transaction); return its ``run_id``."""
        with self._db:
            cursor = self._db.execute(
                "INSERT INTO runs (created_at, recipe, variant, baseline, image, commit_sha, "
                "run_dir, verdict, reason, rollouts, failed_checks) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.created_at,
                    record.recipe,
                    record.variant,
                    record.baseline,
                    record.image,
                    record.commit_sha,
                    record.run_dir,
                    record.verdict,
                    record.reason,
                    record.rollouts,
                    json.dumps(list(record.failed_checks)),
                ),
            )
            run_id = int(cursor.lastrowid or 0)
            for metric, points in sorted(record.series.items()):
                summary = summarize([v for _, v in points])
                if summary is None:
                    continue
                self._db.execute(
                    "INSERT INTO summaries VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (run_id, metric, summary.n, summary.mean, summary.sd, summary.min, summary.max),
                )
                self._db.executemany(
                    "INSERT INTO metric_values VALUES (?, ?, ?, ?)",
                    [(run_id, metric, s, v) for s, v in points if math.isfinite(v)],
                )
        return run_id

    def runs(
        self, *, variant: str | None = None, baseline: str | None = None, limit: int | None = None
    ) -> list[StoredRun]:
        """Runs in the order they were appended (oldest first), optionally filtered; the
        newest ``limit`` when given."""
        where, args = [], []
        for column, value in (("variant", variant), ("baseline", baseline)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        sql = "SELECT * FROM runs" + (f" WHERE {' AND '.join(where)}" if where else "")
        sql += " ORDER BY run_id DESC" + (f" LIMIT {int(limit)}" if limit else "")
        rows = list(reversed(self._db.execute(sql, args).fetchall()))
        return [self._stored(row) for row in rows]

    def _stored(self, row: tuple) -> StoredRun:
        summaries = {
            metric: Summary(n, mean, sd, low, high)
            for metric, n, mean, sd, low, high in self._db.execute(
                "SELECT metric, n, mean, sd, min, max FROM summaries WHERE run_id = ?", (row[0],)
            )
        }
        head = dict(zip(_RUN_COLUMNS, row[: len(_RUN_COLUMNS)], strict=True))
        failed = tuple(json.loads(row[len(_RUN_COLUMNS)]))
        return StoredRun(**head, failed_checks=failed, summaries=summaries)

    def series(self, run_id: int) -> dict[str, list[tuple[int, float]]]:
        """The finite per-rollout values of one stored run, per metric, in step order."""
        found: dict[str, list[tuple[int, float]]] = {}
        for metric, step, value in self._db.execute(
            "SELECT metric, step, value FROM metric_values WHERE run_id = ? ORDER BY metric, step",
            (run_id,),
        ):
            found.setdefault(metric, []).append((step, value))
        return found
