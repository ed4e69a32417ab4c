"""``miles-amd compare``: a paired A/B of two runs on the same prompt sequence.

Decides the command's options, output and exit code: 0 when the comparison was made (a
comparison is no gate: it has no pass/fail), 1 when a run's evidence fails as the gate's
evidence checks would fail it (a corrupt source, sources that disagree: nothing compared or
written), 2 for unusable input (not two ``--run-dir``, a run dir that does not exist or has
no metric, a bad ``--baseline``, an unwritable ``--out-dir``), with one line on stderr
naming the flag and the fix. The first
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

from miles_amd.cli.errors import fail, say
from miles_amd.cli.options import (
    BASELINE_METAVAR,
    FormatOpt,
    OutputFormat,
    existing_run_dir,
    load_baseline_option,
)
from miles_amd.exit_codes import EXIT_CODES_HELP


def register(app: typer.Typer) -> None:
    """Add the ``compare`` command to ``app``."""
    app.command("compare", epilog=EXIT_CODES_HELP)(compare)


def compare(
    run_dirs: Annotated[
        list[Path],
        typer.Option(
            "--run-dir",
            metavar="<path>",
            help="Give it twice: run A (e.g. stock), then run B (patched).",
        ),
    ],
    baseline: Annotated[
        str,
        typer.Option(
            "--baseline",
            metavar=BASELINE_METAVAR,
            help="Whose metrics and spike threshold: stock, patched or a path.",
        ),
    ] = "patched",
    out_dir: Annotated[
        Path | None,
        typer.Option(
            "--out-dir", metavar="<path>", help="Where compare.* go (default: B/report/compare)."
        ),
    ] = None,
    output_format: FormatOpt = OutputFormat.text,
) -> None:
    """Paired A/B of two runs: differences with 95% CIs, spike counts, what N can detect."""
    if len(run_dirs) != 2:
        fail(f"--run-dir: given {len(run_dirs)} time(s); give it exactly twice (run A, then run B)")
    for run_dir in run_dirs:
        existing_run_dir(run_dir)
    reference = load_baseline_option(baseline, "--baseline")
    from miles_amd.app.compare import (
        NoMetricsError,
        UntrustedEvidenceError,
        compare_dir_of,
        compare_run_dirs,
    )
    from miles_amd.exit_codes import EXIT_FAILED
    from miles_amd.report.compare_report import render

    try:
        compared = compare_run_dirs(run_dirs[0], run_dirs[1], reference, out_dir=out_dir)
    except NoMetricsError as exc:
        fail(f"--run-dir {exc}; point it at a finished run")
    except UntrustedEvidenceError as exc:
        fix = f"`miles-amd gate --run-dir {exc.run_dir}` names every problem"
        fail(f"--run-dir {exc}; its evidence cannot be compared; fix: {fix}", code=EXIT_FAILED)
    except OSError as exc:
        target = compare_dir_of(run_dirs[1], out_dir)
        fail(f"--out-dir {target}: cannot write ({exc}); choose a writable directory")
    typer.echo(render(compared.comparison, output_format.value), nl=False)
    files = compared.files
    written = f"comparison written to {files.markdown} (also {files.json.name}, {files.plot.name})"
    say(written, err=output_format is not OutputFormat.text)
