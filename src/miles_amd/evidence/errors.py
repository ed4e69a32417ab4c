"""Strict readers of a run's metrics: one normalised form from every source.

Every reader returns a :data:`~miles_amd.evidence.types.SeriesMap`: ``metric key -> tuple of
(step, value)`` with ``int`` steps and ``float`` values, sorted by step (stable, so a
duplicated step keeps the order it was read in). A metric with no points is absent, not an
empty series. Evidence that cannot be read raises a named error; nothing is dropped or
guessed:

- :class:`~miles_amd.evidence.tfrecord.EventFileError` for TensorBoard event files (framing,
  CRC, payload), naming file and byte offset;
- :class:`MetricsFormatError` for the line-oriented sources (CI-history JSONL, job log),
  naming file and line.

The modules, one job each: ``safe_open`` (what may be opened: regular files inside the run
dir, within a cap per kind), ``tfrecord`` (record framing and CRCs), ``tensorboard`` (event
files -> series), ``ci_history`` (miles' CI-history JSONL -> series), ``log_lines`` (the job
log streamed as blocks of whole lines), ``job_log`` (metric lines of the Ray job log ->
series), ``sentinels`` (known log signatures), ``series`` (the normalisation), ``merge``
(one series per metric across sources, conflicts named), ``load`` (a run directory ->
RunEvidence).

This package module only defines the shared line-format error; it imports nothing heavy, so
importing any reader costs only what that reader needs.
"""

from __future__ import annotations


class MetricsFormatError(ValueError):
    """A line-oriented metrics file (JSONL, job log) that cannot be read as written.

    ``line`` is 1-based and counts ``\\n``-separated lines, so it matches ``grep -n``.
    """

    def __init__(self, path: str, line: int, reason: str) -> None:
        self.path = path
        self.line = line
        self.reason = reason
        super().__init__(f"{path}:{line}: {reason}")
