"""Gate one run dir (read, judge, write its report, append to a named history); compare two.

A report set (report.* or compare.*) is written whole, by default into ``<run>/report``
(``<B>/report/compare``). The verdict is appended to a named history only once its report is
in place; a failed append is a line, not another verdict. ``--baseline auto``: the run's key
picks the reviewed baseline, else the variant's template, judged record-only. Two runs are
compared only when both have metrics and pass the gate's evidence checks.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from miles_amd.app import AppError
from miles_amd.run_dir import RunDir

if TYPE_CHECKING:
    from miles_amd.evidence.types import RunEvidence
    from miles_amd.judge.compare import Comparison
    from miles_amd.judge.gate import RecordOnly, Verdict
    from miles_amd.rules.model import Baseline


@dataclass(frozen=True)
class ReportFiles:
    json: Path
    markdown: Path
    plot: Path

    @classmethod
    def in_dir(cls, out_dir: Path, stem: str = "report", plot: str = "metrics") -> ReportFiles:
        return cls(out_dir / f"{stem}.json", out_dir / f"{stem}.md", out_dir / f"{plot}.png")


@dataclass(frozen=True)
class GateResult:
    verdict: Verdict
    evidence: RunEvidence
    baseline: Baseline
    files: ReportFiles
    markdown: str  # report.md as written
    history_lines: tuple[str, ...] = field(default=())


def compare_dir_of(b_dir: Path, given: Path | None = None) -> Path:
    return given if given is not None else RunDir(b_dir).compare_report


def choose_baseline(evidence: RunEvidence) -> tuple[Baseline, RecordOnly | None]:
    """The baseline of the run's key, or the template and the record-only key."""
    from miles_amd.app.baselines import load
    from miles_amd.baseline.keys import RunKeyError, reviewed_path, run_key, template_for
    from miles_amd.baseline.model import BaselineError
    from miles_amd.judge.environment import Environment
    from miles_amd.judge.gate import RecordOnly
    from miles_amd.recipe.settings import SHAPES

    try:
        key = run_key(evidence)
        path = reviewed_path(key)
    except (RunKeyError, BaselineError) as exc:  # BaselineError: $MILES_AMD_BASELINES_DIR
        raise AppError(f"--baseline auto: {exc}") from None
    if path is not None:
        return load(str(path), "--baseline"), None
    shape = SHAPES.get(key.shape)
    identity = Environment(gpu_model=key.gpu, gpu_count=shape.num_gpus if shape else None)
    return load(template_for(key.variant), "--baseline"), RecordOnly(str(key), identity)


def gate_run_dir(
    run_dir: Path,
    baseline: Baseline | None,
    *,
    expected_rollouts: int | None = None,
    report_dir: Path | None = None,
    require_env: bool = False,
    history: Path | None = None,
    looks: bool = True,
) -> GateResult:
    """Judge ``run_dir`` against ``baseline`` (None: :func:`choose_baseline`); write the set."""
    from miles_amd.app.baselines import identity
    from miles_amd.evidence.load import load_run
    from miles_amd.files import write_files
    from miles_amd.judge.gate import judge
    from miles_amd.report.plot import metrics_png
    from miles_amd.report.render import render_json, render_markdown

    evidence = load_run(run_dir)
    record_only = None
    if baseline is None:
        baseline, record_only = choose_baseline(evidence)
    verdict = judge(
        evidence,
        baseline,
        expected_rollouts=expected_rollouts,
        require_env=require_env,
        looks=looks,
        record_only=record_only,
    )
    digest, shipped = identity(baseline)
    verdict = replace(verdict, baseline_sha256=digest, shipped_sha256=shipped)
    lines: tuple[str, ...] = ()
    markdown = render_markdown(verdict)
    out_dir = report_dir or RunDir(run_dir).report
    files = ReportFiles.in_dir(out_dir)
    contents = {
        files.json.name: render_json(verdict).encode("utf-8"),
        files.markdown.name: markdown.encode("utf-8"),
        files.plot.name: metrics_png(verdict, evidence, baseline),
    }
    root = run_dir if report_dir is None else None
    write_files(out_dir, contents, root=root)
    if history is not None:
        lines, section = _append(history, verdict, evidence, baseline)
        if section:
            full = markdown + "\n" + section
            try:
                write_files(out_dir, {files.markdown.name: full.encode("utf-8")}, root=root)
                markdown = full
            except OSError as exc:
                why = " ".join(str(exc).split())
                lines += (f"report: report.md lacks the drift section ({why})",)
    return GateResult(verdict, evidence, baseline, files, markdown, lines)


def _append(
    path: Path, verdict: Verdict, evidence: RunEvidence, baseline: Baseline
) -> tuple[tuple[str, ...], str]:
    """The lines to print and report.md's drift section ("" when nothing was appended)."""
    from miles_amd.history.drift import drifts, trusted
    from miles_amd.history.entry import appending_verdict, history_record
    from miles_amd.history.render import drift_lines, drift_section

    record = history_record(verdict, evidence, baseline, environ=os.environ)
    try:
        with appending_verdict(path, record) as (run_id, same, k, skipped):
            pass  # committed here
    except (sqlite3.Error, OSError, ValueError) as exc:  # HistoryError is a ValueError
        reason = " ".join(str(exc).split())
        return (f"history: the verdict was NOT appended to {path} ({reason}); "
                "it stands as judged",), ""  # fmt: skip
    found, count = drifts(same, k), len(trusted(same))
    lines = (
        f"history: appended as run {run_id} to {path}",
        *skipped,
        *drift_lines(found, k, count),
    )
    return lines, drift_section(found, k, count, run_id, str(path))


def open_history(path: Path) -> Path:
    """Check the store at ``path`` opens (creating it if new)."""
    from miles_amd.history.store import HistoryError, HistoryStore

    try:
        HistoryStore(path).close()
    except HistoryError as exc:
        fix = "fix: pass another --history, or --no-history"
        raise AppError(f"--history {path}: {exc}; {fix}") from None
    return path


class NoMetricsError(ValueError):
    def __init__(self, run_dir: Path, problem: str | None = None) -> None:
        why = f": {problem}" if problem else ""
        super().__init__(f"{run_dir}: no metric read (tensorboard/, ci_history/, job.log){why}")
        self.run_dir = run_dir


class UntrustedEvidenceError(ValueError):
    def __init__(self, run_dir: Path, check: str, detail: str) -> None:
        super().__init__(f"{run_dir}: {check} fails ({detail})")
        self.run_dir = run_dir


@dataclass(frozen=True)
class ComparedRuns:
    comparison: Comparison
    files: ReportFiles


def compare_run_dirs(
    a_dir: Path, b_dir: Path, baseline: Baseline, *, out_dir: Path | None = None
) -> ComparedRuns:
    """A/B of ``a_dir`` and ``b_dir`` (Δ = B - A) with ``baseline``'s metrics and threshold."""
    from miles_amd.evidence.load import load_run
    from miles_amd.files import write_files
    from miles_amd.judge.compare import compare
    from miles_amd.judge.gate import evidence_checks
    from miles_amd.report.compare_report import render, render_markdown
    from miles_amd.report.plot import compare_png

    a, b = load_run(a_dir), load_run(b_dir)
    for run_dir, evidence in ((a_dir, a), (b_dir, b)):
        if not evidence.series:
            problems = [str(p) for p in evidence.problems]
            more = f" (+{len(problems) - 2} more)" if len(problems) > 2 else ""
            raise NoMetricsError(run_dir, "; ".join(problems[:2]) + more if problems else None)
        for check in evidence_checks(evidence):
            if check.failed:
                raise UntrustedEvidenceError(run_dir, check.name, check.detail)
    comparison = compare(a, b, baseline)
    target = compare_dir_of(b_dir, out_dir)
    files = ReportFiles.in_dir(target, "compare", "compare")
    contents = {
        files.json.name: render(comparison, "json").encode("utf-8"),
        files.markdown.name: render_markdown(comparison).encode("utf-8"),
        files.plot.name: compare_png(comparison, a, b),
    }
    write_files(target, contents, root=b_dir if out_dir is None else None)
    return ComparedRuns(comparison, files)
