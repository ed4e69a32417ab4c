"""Write the gate's report of one run: report.json, report.md, metrics.png.

Decides where the report goes and that a reader never sees half of it: each file is written
whole or not at all (``miles_amd.files.atomic_write_bytes``), into the run dir's report
directory (``RunDir.report``, ``<run-dir>/report/``) unless another is given. What the files
say is ``miles_amd.report.render``'s (text) and ``miles_amd.report.plot``'s (the figure).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from miles_amd.evidence.types import RunEvidence
from miles_amd.files import atomic_write_bytes, atomic_write_text
from miles_amd.judge.gate import Verdict
from miles_amd.report.plot import metrics_png
from miles_amd.report.render import render_json, render_markdown
from miles_amd.rules.model import Baseline

__all__ = ["ReportFiles", "write_report"]


@dataclass(frozen=True)
class ReportFiles:
    json: Path
    markdown: Path
    plot: Path

    @classmethod
    def in_dir(cls, out_dir: Path) -> ReportFiles:
        return cls(out_dir / "report.json", out_dir / "report.md", out_dir / "metrics.png")


def write_report(
    verdict: Verdict, evidence: RunEvidence, baseline: Baseline, out_dir: Path
) -> ReportFiles:
    """Write report.json, report.md and metrics.png into ``out_dir`` (created if needed)."""
    files = ReportFiles.in_dir(out_dir)
    atomic_write_text(files.json, render_json(verdict))
    atomic_write_text(files.markdown, render_markdown(verdict))
    atomic_write_bytes(files.plot, metrics_png(verdict, evidence, baseline))
    return files
