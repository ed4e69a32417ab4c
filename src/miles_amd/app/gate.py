"""Gate one run dir: read it, judge it, write its report, append it to a named history.

- The report goes to ``report_dir``, else the run dir's ``report/`` (:func:`report_dir_of`);
  report.json, report.md and metrics.png are rendered in memory and written as one set through
  ``miles_amd.files.write_files`` (no link below the run dir, or below the named dir's
  parent, is followed; a failed write leaves the previous set).
- A named history is opened (created) before anything is judged (:func:`open_history`,
  ``AppError`` naming ``--history``); the verdict is appended once the set is in place
  (:func:`append`): a set that cannot be written raises before it, so a run is in the history
  only with its report (``tests/unit/test_whole_writes.py``). report.md then gets the
  append's "Drift across runs" section (the drift of the runs of its identity, read in the
  append's transaction), rewritten whole; a history that cannot take the append, or a
  report.md that cannot take the section, is a line in :attr:`GateResult.history_lines`.
- The verdict carries the baseline's digest and whether it is the shipped one of its name
  (``miles_amd.app.baselines.identity``): the text, report.md and report.json show both.
- What the caller prints comes from the :class:`GateResult`, not from the files read back.
- Without a baseline (``--baseline auto``) the run's key picks it (:func:`choose_baseline`,
  ``miles_amd.baseline.keys``): the key's reviewed baseline, else the variant's template,
  the run judged record-only.
- ``gate --example``: the embedded example (:func:`example_run_dir`, package data) reported
  to ``--report-dir`` or a new temp dir, never into the installed package
  (``tests/unit/test_packaging.py``).
Raises ``OSError`` when the report cannot be written, ``AppError`` for unusable input.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from miles_amd.app.errors import AppError
from miles_amd.run_dir import RunDir

if TYPE_CHECKING:
    from miles_amd.evidence.types import RunEvidence
    from miles_amd.judge.gate import RecordOnly, Verdict
    from miles_amd.rules.model import Baseline

__all__ = [
    "GateResult",
    "ReportFiles",
    "append",
    "example_report_dir",
    "example_run_dir",
    "gate_run_dir",
    "inside_installed_package",
    "open_history",
    "report_dir_of",
]


@dataclass(frozen=True)
class ReportFiles:
    json: Path
    markdown: Path
    plot: Path

    @classmethod
    def in_dir(cls, out_dir: Path) -> ReportFiles:
        return cls(out_dir / "report.json", out_dir / "report.md", out_dir / "metrics.png")


@dataclass(frozen=True)
class GateResult:
    """One run judged against one baseline, its report as written, the history's lines."""

    verdict: Verdict
    evidence: RunEvidence
    baseline: Baseline
    files: ReportFiles
    markdown: str  # report.md as written
    history_lines: tuple[str, ...] = field(default=())

    @property
    def exit_code(self) -> int:
        return self.verdict.exit_code


def report_dir_of(run_dir: Path, given: Path | None = None) -> Path:
    """Where the gate's report goes: ``given``, else ``<run_dir>/report``."""
    return given if given is not None else RunDir(run_dir).report


def choose_baseline(evidence: RunEvidence) -> tuple[Baseline, RecordOnly | None]:
    """The baseline of the run's key, or the template and the record-only key; an
    ``AppError`` when the run does not record its key (``--baseline auto``)."""
    from miles_amd.app.baselines import load
    from miles_amd.baseline.keys import RunKeyError, reviewed_path, run_key, template_for
    from miles_amd.baseline.model import BaselineError
    from miles_amd.judge.environment import Environment
    from miles_amd.judge.gate import RecordOnly
    from miles_amd.recipe.shapes import SHAPES

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
    """Judge ``run_dir`` against ``baseline`` (None: the run's key picks it,
    :func:`choose_baseline`) and write the report (module doc); ``looks`` False judges the
    whole run only (``--no-looks``)."""
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
    out_dir = report_dir_of(run_dir, report_dir)
    files = ReportFiles.in_dir(out_dir)
    contents = {
        files.json.name: render_json(verdict).encode("utf-8"),
        files.markdown.name: markdown.encode("utf-8"),
        files.plot.name: metrics_png(verdict, evidence, baseline),
    }
    root = run_dir if report_dir is None else None
    write_files(out_dir, contents, root=root)
    if history is not None:
        lines, section = append(history, verdict, evidence, baseline, environ=os.environ)
        if section:
            full = markdown + "\n" + section
            try:
                write_files(out_dir, {files.markdown.name: full.encode("utf-8")}, root=root)
                markdown = full
            except OSError as exc:
                why = " ".join(str(exc).split())
                lines += (f"report: report.md lacks the drift section ({why})",)
    return GateResult(verdict, evidence, baseline, files, markdown, lines)


def open_history(path: Path) -> Path:
    """Check the store at ``path`` opens (creating it if new); ``AppError`` if it cannot."""
    from miles_amd.history.store import HistoryError, HistoryStore

    try:
        HistoryStore(path).close()
    except HistoryError as exc:
        fix = "fix: pass another --history, or --no-history"
        raise AppError(f"--history {path}: {exc}; {fix}") from None
    return path


def append(
    path: Path,
    verdict: Verdict,
    evidence: RunEvidence,
    baseline: Baseline,
    *,
    environ: Mapping[str, str],
) -> tuple[tuple[str, ...], str]:
    """Append the judged run to the history at ``path``: the lines to print and report.md's
    drift section ("" when nothing was appended; a store that cannot take it is a line)."""
    from miles_amd.history.drift import drifts, trusted
    from miles_amd.history.entry import appending_verdict, history_record
    from miles_amd.history.render import drift_lines, drift_section

    record = history_record(verdict, evidence, baseline, environ=environ)
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


# the example is read as data below the package root, so the product imports nothing of the
# testing package (tests/unit/test_testing_package.py)
EXAMPLE_PARTS = ("testing", "example-run")


def example_run_dir() -> Path:
    """The embedded example's run dir (real path, links resolved): in the repo a link to
    ``examples/runs/jvvnhop9``, in a wheel a copy in site-packages (``package_data``)."""
    from miles_amd.package_data import package_path

    return package_path("miles_amd", *EXAMPLE_PARTS)


def inside_installed_package(path: Path) -> bool:
    """Whether ``path`` (made absolute, links resolved) lies in the ``miles_amd`` package."""
    import miles_amd

    return Path(path).resolve().is_relative_to(Path(miles_amd.__file__).resolve().parent)


def example_report_dir(given: Path | None) -> Path:
    """``given``, else a new temporary directory (``miles-amd-example-*``)."""
    return given if given is not None else Path(tempfile.mkdtemp(prefix="miles-amd-example-"))
