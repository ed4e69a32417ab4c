"""Gate one run directory end to end: read it, judge it, write its report, once.

The one function that judges a run dir (:func:`judge_run_dir`), used by ``miles-amd gate``,
by the driver after ``train --gate`` and so, through the :class:`Judgment` it returns, by
the history's append: what is printed, written to the report, appended to the history and
returned as the exit code is this one verdict. It decides nothing itself: reading is
``miles_amd.evidence.load``, judging ``miles_amd.judge.gate``, writing
``miles_amd.report.report``; the report dir defaults to ``RunDir.report``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from miles_amd.evidence.load import load_run
from miles_amd.evidence.types import RunEvidence
from miles_amd.judge.gate import Verdict, judge
from miles_amd.report.report import ReportFiles, write_report
from miles_amd.rules.model import Baseline
from miles_amd.run_dir import RunDir


@dataclass(frozen=True)
class Judgment:
    """One run judged against one baseline with the flags it was given, and its report."""

    verdict: Verdict
    evidence: RunEvidence
    baseline: Baseline
    files: ReportFiles

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code


def judge_run_dir(
    run_dir: Path,
    baseline: Baseline,
    *,
    expected_rollouts: int | None = None,
    report_dir: Path | None = None,
    require_env: bool = False,
) -> Judgment:
    """Judge ``run_dir`` against ``baseline``; the report goes to ``report_dir`` or
    ``<run_dir>/report``. ``require_env`` fails a run without env.json (the hardware path:
    ``--require-env``). Raises OSError when the report cannot be written."""
    evidence = load_run(run_dir)
    verdict = judge(
        evidence, baseline, expected_rollouts=expected_rollouts, require_env=require_env
    )
    out_dir = report_dir if report_dir is not None else RunDir(Path(run_dir)).report
    files = write_report(verdict, evidence, baseline, out_dir)
    return Judgment(verdict, evidence, baseline, files)
