"""Gate one run directory end to end: read it, judge it, write its report.

The one sequence both ``miles-amd gate`` and the driver (after a run) use; it decides
nothing itself: reading is ``miles_amd.evidence.load``, judging ``miles_amd.judge.gate``,
writing ``miles_amd.report.report``; the report dir defaults to ``RunDir.report``.
"""

from __future__ import annotations

from pathlib import Path

from miles_amd.evidence.load import load_run
from miles_amd.evidence.types import RunEvidence
from miles_amd.judge.gate import Verdict, judge
from miles_amd.report.report import ReportFiles, write_report
from miles_amd.rules.model import Baseline
from miles_amd.run_dir import RunDir


def gate_run_dir(
    run_dir: Path,
    baseline: Baseline,
    *,
    expected_rollouts: int | None = None,
    report_dir: Path | None = None,
    require_env: bool = False,
) -> tuple[Verdict, ReportFiles]:
    """Judge ``run_dir`` against ``baseline``; the report goes to ``report_dir`` or
    ``<run_dir>/report``. ``require_env`` fails a run without env.json (the hardware path:
    ``--require-env``). Raises OSError when the report cannot be written."""
    verdict, _, files = judge_run_dir(
        run_dir,
        baseline,
        expected_rollouts=expected_rollouts,
        report_dir=report_dir,
        require_env=require_env,
    )
    return verdict, files


def judge_run_dir(
    run_dir: Path,
    baseline: Baseline,
    *,
    expected_rollouts: int | None = None,
    report_dir: Path | None = None,
    require_env: bool = False,
) -> tuple[Verdict, RunEvidence, ReportFiles]:
    """:func:`gate_run_dir` that also returns the evidence read (the history keeps its series)."""
    evidence = load_run(run_dir)
    verdict = judge(
        evidence, baseline, expected_rollouts=expected_rollouts, require_env=require_env
    )
    out_dir = report_dir if report_dir is not None else RunDir(Path(run_dir)).report
    return verdict, evidence, write_report(verdict, evidence, baseline, out_dir)
