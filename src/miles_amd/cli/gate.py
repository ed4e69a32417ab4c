"""``miles-amd gate``: judge a run directory against a baseline and write the report.

Decides the command's options, output and exit code: 0 pass, 1 fail (a check failed),
2 unusable input (no run dir, nothing readable in it, a malformed or missing baseline, an
unwritable report dir), with one line on stderr naming the flag and the fix. The report goes
to ``--report-dir`` (default ``<run-dir>/report/``): report.json, report.md, metrics.png; the
chosen ``--format`` is printed to stdout, then, last, where the report was written (on
stderr for ``json``/``markdown``, whose stdout is the document). A bad baseline or a missing
run dir writes nothing.
When the run dir exists but nothing in it is readable, the report (verdict ``error``) is
still written, so CI shows why. ``--expected-rollouts N`` judges a run of N rollouts (a
3-rollout smoke, a 1000-rollout benchmark): it sets the expected steps and rescales the bands.
``--require-env`` (the hardware path: the mi355x test and CI) fails a run whose run dir has
no ``env.json``; without it the environment check is "not measured" there (the CPU main job
has no GPUs to probe). A recorded environment that differs from the baseline's fails either
way. An unknown ``--baseline`` name or path exits 2 naming ``--baseline``.
Every verdict is appended to the run history (``--history PATH``, default
``$MILES_AMD_HISTORY`` or ``$XDG_DATA_HOME/miles-amd/history.sqlite``; ``--no-history``
opts out; ``miles_amd.cli.history.record_gate``): the store is opened before judging (an
unusable one exits 2), and report.md gets a "Drift across runs" section.

Reading (``miles_amd.evidence``), judging (``miles_amd.judge.gate``) and reporting
(``miles_amd.report``) are imported inside the command, so registering it costs nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from miles_amd.cli.errors import EXIT_CODES_HELP
from miles_amd.cli.errors import fail as _fail
from miles_amd.cli.options import NoHistoryOpt, RequireEnvOpt
from miles_amd.cli.output_format import OutputFormat


def register(app: typer.Typer) -> None:
    """Add the ``gate`` command to ``app``."""
    app.command("gate", epilog=EXIT_CODES_HELP)(gate)


def gate(
    run_dir: Annotated[
        Path,
        typer.Option(
            "--run-dir", help="Run directory: tensorboard/, ci_history/, job.log, job.json."
        ),
    ],
    baseline: Annotated[
        str,
        typer.Option("--baseline", help="stock, patched, or the path of a baseline JSON file."),
    ],
    report_dir: Annotated[
        Path | None,
        typer.Option("--report-dir", help="Where the report goes (default: RUN_DIR/report)."),
    ] = None,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", help="What to print to stdout.")
    ] = OutputFormat.text,
    expected_rollouts: Annotated[
        int | None,
        typer.Option(
            "--expected-rollouts",
            min=1,
            help="Rollouts the run must have (default: the baseline's, 20).",
        ),
    ] = None,
    require_env: RequireEnvOpt = False,
    history_file: Annotated[
        Path | None,
        typer.Option("--history", help="Append the verdict to this history store (SQLite)."),
    ] = None,
    no_history: NoHistoryOpt = False,
) -> None:
    """Judge a run dir against a baseline; exit 0 pass, 1 fail, 2 unusable input."""
    from miles_amd.baseline.model import BaselineError, UnknownBaselineError, load_baseline

    try:
        reference = load_baseline(baseline, flag="--baseline")
    except UnknownBaselineError as exc:
        _fail(str(exc))
    except BaselineError as exc:
        _fail(f"--baseline: {exc}")
    if not run_dir.is_dir():
        _fail(f"--run-dir {run_dir}: no such directory; point it at a run directory")

    from miles_amd.cli.history import open_history, record_gate
    from miles_amd.report.gate_run import judge_run_dir
    from miles_amd.report.render import render
    from miles_amd.run_dir import RunDir

    store = None if no_history else open_history(history_file)
    out_dir = report_dir if report_dir is not None else RunDir(run_dir).report
    try:
        verdict, evidence, files = judge_run_dir(
            run_dir,
            reference,
            expected_rollouts=expected_rollouts,
            report_dir=out_dir,
            require_env=require_env,
        )
    except OSError as exc:
        _fail(f"--report-dir {out_dir}: cannot write the report ({exc}); choose a writable dir")
    # the append is this command's side effect, never the judge's; it adds to report.md
    history_lines = [] if store is None else record_gate(store, verdict, evidence, reference, files)
    if output_format is OutputFormat.markdown:
        typer.echo(files.markdown.read_text(encoding="utf-8"), nl=False)
    else:
        typer.echo(render(verdict, output_format.value), nl=False)
    for line in history_lines:
        typer.echo(line, err=output_format is not OutputFormat.text)
    # where the report is, last (stderr when stdout carries the JSON or markdown document)
    written = f"report written to {files.markdown} (also {files.json.name}, {files.plot.name})"
    typer.echo(written, err=output_format is not OutputFormat.text)
    if verdict.verdict == "error":
        _fail(
            f"--run-dir {run_dir}: {verdict.reason}; "
            f"point it at a run directory with tensorboard/, ci_history/, job.log or job.json "
            f"(report: {files.json})",
            code=verdict.exit_code,
        )
    raise typer.Exit(verdict.exit_code)
