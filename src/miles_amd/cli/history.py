"""``miles-amd history``: list past gate verdicts, plot their trends, check drift, export.

Decides the command's options and output. Reads the history store (``--history PATH``,
else ``$MILES_AMD_HISTORY``, else ``$XDG_DATA_HOME/miles-amd/history.sqlite``;
``miles_amd.history.store``), never creates one: a missing file or one of another schema
version exits 2 naming ``--history`` and the fix. Lists the runs (``--variant``,
``--baseline``, ``--limit`` filter), oldest first, with the drift findings of each identity
(variant and baseline; ``miles_amd.history.drift``, k calibrated for the metrics stored);
``--plot PATH`` writes the per-metric trend PNG; ``--export DIR`` writes the history in
upstream miles' metric-history JSONL shape (``miles_amd.history.export``). Exit 0 when
listed (a drift is reported, not an exit code: the gate's verdict is the gate's). Also the
home of the ``--history``/``--no-history`` options ``miles-amd gate`` shares, and of the
gate's append (:func:`record_gate`).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from miles_amd.cli.errors import EXIT_CODES_HELP, fail
from miles_amd.cli.output_format import OutputFormat

if TYPE_CHECKING:
    from miles_amd.baseline.model import Baseline
    from miles_amd.evidence.types import RunEvidence
    from miles_amd.judge.gate import Verdict
    from miles_amd.report.report import ReportFiles

HistoryOpt = Annotated[
    Path | None,
    typer.Option(
        "--history",
        help="History store (SQLite; default $MILES_AMD_HISTORY or "
        "$XDG_DATA_HOME/miles-amd/history.sqlite).",
    ),
]


def register(app: typer.Typer) -> None:
    """Add the ``history`` command to ``app``."""
    app.command("history", epilog=EXIT_CODES_HELP)(history)


def history_path(given: Path | None) -> Path:
    from miles_amd.history.store import default_path

    return given if given is not None else default_path()


def open_history(given: Path | None) -> Path:
    """Check the store at ``--history`` (or the default) opens, before anything is judged."""
    from miles_amd.history.store import HistoryError, HistoryStore

    path = history_path(given)
    try:
        HistoryStore(path).close()
    except HistoryError as exc:
        fail(f"--history {path}: {exc}; fix: pass another --history, or --no-history")
    return path


def record_gate(
    path: Path, verdict: Verdict, evidence: RunEvidence, baseline: Baseline, files: ReportFiles
) -> list[str]:
    """``miles-amd gate``'s append: store the verdict, add the drift section to report.md,
    return the lines to print."""
    from miles_amd.files import atomic_write_text
    from miles_amd.history.drift import drifts
    from miles_amd.history.entry import append_verdict, history_record
    from miles_amd.history.render import drift_lines, drift_section
    from miles_amd.history.store import HistoryError

    record = history_record(verdict, evidence, baseline, environ=os.environ)
    try:
        run_id, same, k = append_verdict(path, record)
    except (HistoryError, sqlite3.Error, OSError) as exc:
        fail(f"--history {path}: the verdict was not appended ({exc}); pass --no-history")
    found = drifts(same, k)
    section = drift_section(found, k, len(same), run_id, str(path))
    if files.markdown.is_file():
        report = files.markdown.read_text(encoding="utf-8")
        atomic_write_text(files.markdown, report + "\n" + section)
    return [f"history: appended as run {run_id} to {path}", *drift_lines(found, k, len(same))]


def record_driver_gate(path: Path, run_dir: Path, gate: str, rollouts: int) -> list[str]:
    """``train --gate``'s append: the driver judged and reported the run; the same pure judge
    on the same evidence gives the same verdict, which is appended like ``gate``'s."""
    from miles_amd.baseline.model import load_baseline
    from miles_amd.evidence.load import load_run
    from miles_amd.judge.gate import judge
    from miles_amd.report.report import ReportFiles
    from miles_amd.run_dir import RunDir

    baseline = load_baseline(gate, flag="--gate")
    evidence = load_run(run_dir)
    verdict = judge(evidence, baseline, expected_rollouts=rollouts)
    files = ReportFiles.in_dir(RunDir(run_dir).report)
    return record_gate(path, verdict, evidence, baseline, files)


def history(
    history_file: HistoryOpt = None,
    variant: Annotated[
        str | None, typer.Option("--variant", help="Only this aiter variant.")
    ] = None,
    baseline: Annotated[
        str | None, typer.Option("--baseline", help="Only runs judged against this baseline.")
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="Only the newest N runs.")
    ] = None,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", help="What to print to stdout.")
    ] = OutputFormat.text,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the trend PNG here.")] = None,
    export: Annotated[
        Path | None,
        typer.Option("--export", help="Write upstream metric-history JSONL into this directory."),
    ] = None,
) -> None:
    """List past gate verdicts with drift findings; plot trends; export for upstream miles."""
    from miles_amd.history.drift import calibrated_k, drifts, metric_count
    from miles_amd.history.store import HistoryError, HistoryStore

    path = history_path(history_file)
    if not path.is_file():
        fail(
            f"--history {path}: no history there; fix: run `miles-amd gate` first, or point "
            "--history at the store"
        )
    try:
        store = HistoryStore(path)
    except HistoryError as exc:
        fail(f"--history {path}: {exc}")
    with store:
        runs = store.runs(variant=variant, baseline=baseline, limit=limit)
        k = calibrated_k(metric_count(runs))
        found = []
        for identity in dict.fromkeys((r.variant, r.baseline) for r in runs):
            group = [r for r in runs if (r.variant, r.baseline) == identity]
            found += drifts(group, calibrated_k(metric_count(group)))
        written = []
        try:
            if plot is not None:
                from miles_amd.files import atomic_write_bytes
                from miles_amd.history.render import trend_png

                atomic_write_bytes(plot, trend_png(runs, found))
                written.append(f"trend plot written to {plot}")
            if export is not None:
                from miles_amd.history.export import export_jsonl

                paths = export_jsonl(store, export)
                written.append(
                    f"exported {len(paths) - 1} run record(s) and runs.jsonl to {export}"
                )
        except OSError as exc:
            fail(f"--plot/--export: cannot write ({exc}); choose a writable path")
    from miles_amd.history import render

    text = {
        "text": render.render_text,
        "markdown": render.render_markdown,
        "json": render.to_json,
    }[output_format.value](runs, found, k)
    typer.echo(text, nl=False)
    for line in written:
        typer.echo(line, err=output_format is not OutputFormat.text)
