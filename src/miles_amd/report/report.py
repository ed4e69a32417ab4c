"""Write the gate's report of one run: report.json, report.md, metrics.png.

Decides where the report goes and that a reader never sees half of it: each file is written
whole or not at all, into the run dir's report directory (``RunDir.report``,
``<run-dir>/report/``) unless another is given, never through a link
(``miles_amd.report.safe_dir``: a ``report`` link in the run dir is refused, nothing written).
What the files
say is ``miles_amd.report.render``'s (text) and ``miles_amd.report.plot``'s (the figure).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from miles_amd.evidence.types import RunEvidence
from miles_amd.judge.gate import Verdict
from miles_amd.report.plot import metrics_png
from miles_amd.report.render import render_json, render_markdown
from miles_amd.report.safe_dir import write_files
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
    contents = {
        files.json.name: render_json(verdict).encode("utf-8"),
        files.markdown.name: render_markdown(verdict).encode("utf-8"),
        files.plot.name: metrics_png(verdict, evidence, baseline),
    }
    write_files(out_dir, contents)
    return files
