"""``miles-amd gate``: judge a run directory against a baseline and write the report.

- Options, output and exit code (``miles_amd.exit_codes``): 0 pass, 1 fail, 2 unusable input
  (run dir, baseline, report dir or history), with one line on stderr naming the flag and
  the fix.
- The run is judged once (``miles_amd.app.gate.gate_run_dir``); what is printed, written,
  appended to the history and returned is that verdict.
- The report (report.json, report.md, metrics.png) goes to ``--report-dir`` (default
  ``<run-dir>/report/``; refused inside the installed package: ``tests/unit/test_gate_cli.py``);
  ``--example`` gates the embedded run and reports to ``--report-dir`` or a temporary dir.
- ``--baseline auto``: the run's key (shape, GPU model, variant) picks the reviewed
  baseline; a key without one is record-only (``miles_amd.app.gate.choose_baseline``).
- ``--num-rollouts N`` rescales the bands; ``--require-env`` fails a run dir without
  ``env.json`` or ``job.json``; ``--no-looks`` judges the end only.
- The verdict is appended to a history only when one is named (``--history``, else
  ``$MILES_AMD_HISTORY``; ``--no-history`` ignores both); the store is opened before judging.

Caveats:

- Bad input (a baseline, a missing run dir, a dir with none of a run dir's files) writes
  nothing; a run dir with nothing readable still gets its report (verdict ``error``).
- Reading, judging and reporting are imported inside the command, so registering it is cheap.

Explained in ``docs/cli.md`` ("The gate").
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from miles_amd.cli.errors import fail, say
from miles_amd.cli.options import (
    INT,
    MAX_ROLLOUTS,
    FormatOpt,
    HistoryOpt,
    NoHistoryOpt,
    OutputFormat,
    RequireEnvOpt,
    existing_run_dir,
    load_baseline_option,
    named_history,
    resolve_alias,
)
from miles_amd.exit_codes import EXIT_CODES_HELP

AUTO = "auto"  # --baseline auto: the run's key picks it (miles_amd.baseline.keys)


def register(app: typer.Typer) -> None:
    """Add the ``gate`` command to ``app``."""
    app.command("gate", epilog=EXIT_CODES_HELP)(gate)


def gate(
    baseline: Annotated[
        str,
        typer.Option(
            "--baseline",
            metavar="<auto|stock|patched|path>",
            help="auto (the reviewed baseline of the run's shape, GPU model and variant; "
            "none reviewed: record-only), stock, patched (8gpu MI355X), or a baseline file.",
        ),
    ],
    run_dir: Annotated[
        Path | None,
        typer.Option(
            "--run-dir",
            metavar="<path>",
            help="Run directory: tensorboard/, ci_history/, job.log, job.json.",
        ),
    ] = None,
    example: Annotated[
        bool,
        typer.Option(
            "--example",
            help="Gate the embedded example run (jvvnhop9, shipped in the package) instead "
            "of --run-dir; its report goes to --report-dir or a new temporary dir.",
        ),
    ] = False,
    report_dir: Annotated[
        Path | None,
        typer.Option(
            "--report-dir",
            metavar="<path>",
            help="Where the report goes (default: RUN_DIR/report; with --example a new "
            "temporary dir).",
        ),
    ] = None,
    output_format: FormatOpt = OutputFormat.text,
    num_rollouts: Annotated[
        int | None,
        typer.Option(
            "--num-rollouts",
            min=1,
            max=MAX_ROLLOUTS,
            metavar=INT,
            help="Rollouts the run must have (default: the baseline's, 20).",
        ),
    ] = None,
    expected_rollouts: Annotated[
        int | None, typer.Option("--expected-rollouts", min=1, max=MAX_ROLLOUTS, hidden=True)
    ] = None,
    require_env: RequireEnvOpt = False,
    history_file: HistoryOpt = None,
    no_history: NoHistoryOpt = False,
    no_looks: Annotated[
        bool,
        typer.Option(
            "--no-looks",
            help="Judge the whole run only, each rule at its fixed-sample tolerance "
            "(default: also at the baseline's looks: rollouts 6 to 16 in the shipped ones).",
        ),
    ] = False,
) -> None:
    """Judge a run dir against a baseline; exit 0 pass, 1 fail, 2 unusable input."""
    rollouts = resolve_alias(
        num_rollouts,
        expected_rollouts,
        default=None,
        names=("--num-rollouts", "--expected-rollouts"),
    )
    if example == (run_dir is not None):
        fail(
            "--run-dir and --example: "
            + ("give one, not both" if example else "neither given")
            + "; fix: pass --run-dir DIR, or --example for the embedded run"
        )
    reference = None if baseline == AUTO else load_baseline_option(baseline, "--baseline")
    from miles_amd.app.gate import example_run_dir, inside_installed_package

    if run_dir is None:
        run_dir = example_run_dir()
    existing_run_dir(run_dir)

    from miles_amd.app.gate import gate_run_dir, report_dir_of
    from miles_amd.cli.history import open_history_option
    from miles_amd.report.render import render

    history = named_history(history_file, no_history)
    if history is not None:
        open_history_option(history)
    if example and report_dir is None:
        from miles_amd.app.gate import example_report_dir

        report_dir = example_report_dir(None)
    out_dir = report_dir_of(run_dir, report_dir)
    if inside_installed_package(out_dir):
        flag = "--run-dir" if report_dir is None else "--report-dir"
        fail(
            f"{flag} {run_dir if report_dir is None else report_dir}: the report would go "
            f"into the installed miles_amd package ({out_dir}); fix: pass --report-dir DIR "
            "outside it, or use --example (a temporary dir)"
        )
    from miles_amd.app.errors import AppError

    try:
        result = gate_run_dir(
            run_dir,
            reference,
            expected_rollouts=rollouts,
            report_dir=report_dir,
            require_env=require_env,
            history=history,
            looks=not no_looks,
        )
    except AppError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"--report-dir {out_dir}: cannot write the report ({exc}); choose a writable dir")
    verdict, files = result.verdict, result.files
    if verdict.record_only:
        say(
            f"no reviewed baseline for {verdict.record_only}: recorded, not judged (the "
            "statistical rules); every evidence check judged",
            err=output_format is not OutputFormat.text,
        )
    if output_format is OutputFormat.markdown:
        typer.echo(result.markdown, nl=False)
    else:
        typer.echo(render(verdict, output_format.value), nl=False)
    for line in result.history_lines:
        say(line, err=output_format is not OutputFormat.text)
    # where the report is, last (stderr when stdout carries the JSON or markdown document)
    written = f"report written to {files.markdown} (also {files.json.name}, {files.plot.name})"
    say(written, err=output_format is not OutputFormat.text)
    if verdict.verdict == "error":
        fail(
            f"--run-dir {run_dir}: {verdict.reason}; "
            f"point it at a run directory with tensorboard/, ci_history/, job.log or job.json "
            f"(report: {files.json})",
            code=verdict.exit_code,
        )
    raise typer.Exit(verdict.exit_code)
