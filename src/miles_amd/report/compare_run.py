"""Compare two run directories end to end: read both, compare them, write the files, once.

The one sequence ``miles-amd compare`` and ``train --variants`` (its A/B step) use; it
decides nothing itself: reading is ``miles_amd.evidence.load``, the statistics
``miles_amd.judge.compare``, the files ``miles_amd.report.compare_report``; the files go to
``out_dir`` or B's ``RunDir.compare_report``. A run dir without any metric cannot be
compared: :class:`NoMetricsError` names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from miles_amd.evidence.load import load_run
from miles_amd.judge.compare import Comparison, compare
from miles_amd.report.compare_report import CompareFiles, write_compare
from miles_amd.rules.model import Baseline
from miles_amd.run_dir import RunDir


class NoMetricsError(ValueError):
    """A run dir to compare holds no metric (``run_dir`` is the one)."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(f"{run_dir}: no metric in it (tensorboard/, ci_history/, job.log)")
        self.run_dir = run_dir


@dataclass(frozen=True)
class ComparedRuns:
    comparison: Comparison
    files: CompareFiles


def compare_run_dirs(
    a_dir: Path, b_dir: Path, baseline: Baseline, *, out_dir: Path | None = None
) -> ComparedRuns:
    """A/B of ``a_dir`` and ``b_dir`` (Δ = B - A) with ``baseline``'s metrics and spike
    threshold; ``NoMetricsError`` for a run dir without metrics, OSError when the files
    cannot be written."""
    a, b = load_run(a_dir), load_run(b_dir)
    for run_dir, evidence in ((a_dir, a), (b_dir, b)):
        if not evidence.series:
            raise NoMetricsError(run_dir)
    comparison = compare(a, b, baseline)
    target = out_dir if out_dir is not None else RunDir(b_dir).compare_report
    return ComparedRuns(comparison, write_compare(comparison, a, b, target))
