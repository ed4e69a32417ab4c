"""Compare two run dirs: read both, compare them, write compare.json, .md and .png.

- The files go to ``out_dir``, else B's ``report/compare`` (:func:`compare_dir_of`), as one
  set through ``miles_amd.files.write_files``: no link below B's run dir (a ``report`` link
  in it included) or below the named dir's parent is followed.
- A run dir without any metric cannot be compared: :class:`NoMetricsError` names it.
- A run dir whose evidence the gate fails as evidence (``judge.gate.evidence_checks``: a
  corrupt, truncated or malformed source, or two sources that disagree) is not compared
  either: :class:`UntrustedEvidenceError` names it and the check, and nothing is written.

Raises ``OSError`` when the files cannot be written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from miles_amd.run_dir import RunDir

if TYPE_CHECKING:
    from miles_amd.judge.compare import Comparison
    from miles_amd.rules.model import Baseline

__all__ = [
    "CompareFiles",
    "ComparedRuns",
    "NoMetricsError",
    "UntrustedEvidenceError",
    "compare_dir_of",
    "compare_run_dirs",
]


class NoMetricsError(ValueError):
    """A run dir to compare holds no metric (``run_dir`` is the one); ``problem``: the source
    problems (a file refused or unreadable) that explain why, if any."""

    def __init__(self, run_dir: Path, problem: str | None = None) -> None:
        why = f": {problem}" if problem else ""
        super().__init__(f"{run_dir}: no metric read (tensorboard/, ci_history/, job.log){why}")
        self.run_dir = run_dir


class UntrustedEvidenceError(ValueError):
    """A run dir to compare fails the gate's evidence checks (``run_dir`` is the one)."""

    def __init__(self, run_dir: Path, check: str, detail: str) -> None:
        super().__init__(f"{run_dir}: {check} fails ({detail})")
        self.run_dir = run_dir


@dataclass(frozen=True)
class CompareFiles:
    json: Path
    markdown: Path
    plot: Path


@dataclass(frozen=True)
class ComparedRuns:
    comparison: Comparison
    files: CompareFiles


def compare_dir_of(b_dir: Path, given: Path | None = None) -> Path:
    """Where compare's files go: ``given``, else B's ``report/compare``."""
    return given if given is not None else RunDir(b_dir).compare_report


def compare_run_dirs(
    a_dir: Path, b_dir: Path, baseline: Baseline, *, out_dir: Path | None = None
) -> ComparedRuns:
    """A/B of ``a_dir`` and ``b_dir`` (Δ = B - A) with ``baseline``'s metrics and spike
    threshold (module doc)."""
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
    files = CompareFiles(target / "compare.json", target / "compare.md", target / "compare.png")
    contents = {
        files.json.name: render(comparison, "json").encode("utf-8"),
        files.markdown.name: render_markdown(comparison).encode("utf-8"),
        files.plot.name: compare_png(comparison, a, b),
    }
    write_files(target, contents, root=b_dir if out_dir is None else None)
    return ComparedRuns(comparison, files)
