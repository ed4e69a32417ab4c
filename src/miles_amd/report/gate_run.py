"""Gate one run directory end to end: read it, judge it, write its report.

The one sequence both ``miles-amd gate`` and the driver (after a run) use; it decides
nothing itself: reading is ``metrics.run_dir``, judging ``gate``, writing ``report``.
"""

from __future__ import annotations

from pathlib import Path

from miles_amd.baseline.model import Baseline
from miles_amd.evidence.load import load_run
from miles_amd.judge.gate import Verdict, judge
from miles_amd.report.report import ReportFiles, write_report


def gate_run_dir(
    run_dir: Path,
    baseline: Baseline,
    *,
    expected_rollouts: int | None = None,
    report_dir: Path | None = None,
) -> tuple[Verdict, ReportFiles]:
    """Judge ``run_dir`` against ``baseline``; the report goes to ``report_dir`` or
    ``<run_dir>/report``. Raises OSError when the report cannot be written."""
    evidence = load_run(run_dir)
    verdict = judge(evidence, baseline, expected_rollouts=expected_rollouts)
    files = write_report(verdict, evidence, baseline, report_dir or run_dir / "report")
    return verdict, files
