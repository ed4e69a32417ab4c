"""A judged run into a named history: opening the store first, appending, the drift it shows.

- :func:`open_history`: the store opens (created if new) before anything is judged or run;
  one that cannot is :class:`~miles_amd.app.errors.AppError` naming ``--history``.
- :func:`append`: the verdict goes into the store as judged, after its report set is in
  place (``miles_amd.app.gate``): a report that cannot be written is an error before the
  append, so a run is in the history only with its report. Returns the lines to print and
  report.md's "Drift across runs" section (the drift of the runs of its identity, read in
  the append's transaction). A store that cannot take the append is one line saying so, not
  an error: the verdict stands.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from miles_amd.app.errors import AppError

if TYPE_CHECKING:
    from miles_amd.evidence.types import RunEvidence
    from miles_amd.judge.gate import Verdict
    from miles_amd.rules.model import Baseline

__all__ = ["Appended", "append", "open_history"]


@dataclass(frozen=True)
class Appended:
    lines: tuple[str, ...]
    section: str  # markdown for report.md; "" when nothing was appended


def open_history(path: Path) -> Path:
    """Check the store at ``path`` opens (creating it if new); ``AppError`` if it cannot."""
    from miles_amd.history.store import HistoryError, HistoryStore

    try:
        HistoryStore(path).close()
    except HistoryError as exc:
        fix = "fix: pass another --history, or --no-history"
        raise AppError(f"--history {path}: {exc}; {fix}") from None
    return path


def _not_appended(path: Path, exc: BaseException) -> tuple[str]:
    reason = " ".join(str(exc).split())
    return (f"history: the verdict was NOT appended to {path} ({reason}); it stands as judged",)


def append(
    path: Path,
    verdict: Verdict,
    evidence: RunEvidence,
    baseline: Baseline,
    *,
    environ: Mapping[str, str],
) -> Appended:
    """Append the judged run to the history at ``path`` (module doc)."""
    from miles_amd.history.drift import drifts, trusted
    from miles_amd.history.entry import appending_verdict, history_record
    from miles_amd.history.render import drift_lines, drift_section

    record = history_record(verdict, evidence, baseline, environ=environ)
    try:
        with appending_verdict(path, record) as (run_id, same, k, skipped):
            pass  # committed here
    except (sqlite3.Error, OSError, ValueError) as exc:  # HistoryError is a ValueError
        return Appended(_not_appended(path, exc), "")
    found = drifts(same, k)
    count = len(trusted(same))
    lines = (f"history: appended as run {run_id} to {path}", *skipped)
    return Appended(
        (*lines, *drift_lines(found, k, count)),
        drift_section(found, k, count, run_id, str(path)),
    )
