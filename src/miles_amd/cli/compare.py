"""``miles-amd compare``: a paired A/B of two runs on the same prompt sequence.

Decides the command's options, output and exit code: 0 when the comparison was made (a
comparison is no gate: it has no pass/fail), 2 for unusable input (not two ``--run-dir``,
a run dir that does not exist or has no metric, a bad ``--baseline``, an unwritable
``--out-dir``), with one line on stderr naming the flag and the fix. The first
``--run-dir`` is A, the second B; Δ = B - A. ``--baseline`` (default ``patched``) names
the metrics compared, the spike threshold and the samples a rollout. The files
(compare.json, compare.md, compare.png) go to ``--out-dir`` (default
``<B>/report/compare``); ``--format`` is printed to stdout and where the files are written
is the last line (stderr for json/markdown). The statistics are
``miles_amd.judge.compare``'s, the words and the figure ``miles_amd.report.compare_report``'s;
both are imported inside the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from miles_amd.cli.errors import EXIT_CODES_HELP, fail
from miles_amd.cli.output_format import OutputFormat


def register(app: typer.Typer) -> None:
    """Add the ``compare`` command to ``app``."""
    app.command("compare", epilog=EXIT_CODES_HELP)(compare)


def compare(
    run_dirs: Annotated[
        list[Path],
        typer.Option("--run-dir", help="Give it twice: run A (e.g. stock), then run B (patched)."),
    ],
    baseline: Annotated[
        str,
        typer.Option(
            "--baseline", help="Whose metrics and spike threshold: stock, patched or a path."
        ),
    ] = "patched",
    out_dir: Annotated[
        Path | None,
        typer.Option("--out-dir", help="Where compare.* go (default: B/report/compare)."),
    ] = None,
    output_format: Annotated[
        OutputFormat, typer.Option("--format", help="What to print to stdout.")
    ] = OutputFormat.text,
) -> None:
    """Paired A/B of two runs: differences with 95% CIs, spike counts, what N can detect."""
    if len(run_dirs) != 2:
        fail(f"--run-dir: given {len(run_dirs)} time(s); give it exactly twice (run A, then run B)")
    for run_dir in run_dirs:
        if not run_dir.is_dir():
            fail(f"--run-dir {run_dir}: no such directory; point it at a run directory")
    from miles_amd.baseline.model import BaselineError, UnknownBaselineError, load_baseline

    try:
        reference = load_baseline(baseline, flag="--baseline")
    except UnknownBaselineError as exc:
        fail(str(exc))
    except BaselineError as exc:
        fail(f"--baseline: {exc}")
    from miles_amd.evidence.load import load_run
    from miles_amd.judge.compare import compare as compare_runs
    from miles_amd.report.compare_report import render, write_compare
    from miles_amd.run_dir import RunDir

    a, b = (load_run(run_dir) for run_dir in run_dirs)
    for run_dir, evidence in zip(run_dirs, (a, b), strict=True):
        if not evidence.series:
            fail(
                f"--run-dir {run_dir}: no metric in it (tensorboard/, ci_history/, job.log); "
                "point it at a finished run"
            )
    comparison = compare_runs(a, b, reference)
    target = out_dir if out_dir is not None else RunDir(run_dirs[1]).report / "compare"
    try:
        files = write_compare(comparison, a, b, target)
    except OSError as exc:
        fail(f"--out-dir {target}: cannot write ({exc}); choose a writable directory")
    typer.echo(render(comparison, output_format.value), nl=False)
    written = f"comparison written to {files.markdown} (also {files.json.name}, {files.plot.name})"
    typer.echo(written, err=output_format is not OutputFormat.text)
