"""``miles-amd preflight``: check the node, image and inputs before a run, and record them.

Decides the command's options, output and exit code: it prints the verdict and its root
cause first, then the facts (``miles_amd.run.preflight``: within 100 columns, facts that
need a failed one "not checked", an unknown value shown as unknown, not ``ok``
(``tests/unit/test_preflight.py``); ``--verbose`` every value and
message in full; ``--format json`` the facts as JSON), then where env.json went; it writes
``env.json`` into ``--run-dir`` (the same dir, with the same default, that ``train
--run-dir`` writes its evidence to and ``baseline record --run-dir`` reads), and exits 0 when
every fact is ``ok``, 1 otherwise with one line on stderr naming the failing facts, 2 on bad
input. The dir options and their defaults are ``train``'s (``cli.options``); ``--gpus`` is
the hidden old spelling of ``--num-gpus``. The probes live in ``miles_amd.run.preflight``,
imported only when the command runs, so registering the command costs nothing.
"""

from __future__ import annotations

import json
import platform
import socket
from enum import Enum
from typing import Annotated

import typer

from miles_amd.cli.errors import fail, say
from miles_amd.cli.options import (
    DEFAULT_DATA_DIR,
    DEFAULT_MEGATRON_DIR,
    DEFAULT_MILES_DIR,
    DEFAULT_MODEL_DIR,
    DEFAULT_NUM_GPUS,
    DEFAULT_RUN_DIR,
    AiterVariantOpt,
    DataDirOpt,
    GpusAliasOpt,
    MegatronDirOpt,
    MilesDirOpt,
    ModelDirOpt,
    NumGpusOpt,
    RunDirOpt,
    new_run_dir,
    resolve_alias,
)
from miles_amd.exit_codes import EXIT_CODES_HELP, EXIT_FAILED


class PreflightFormat(str, Enum):
    text = "text"
    json = "json"


def register(app: typer.Typer) -> None:
    """Add the ``preflight`` command to ``app``."""
    app.command("preflight", epilog=EXIT_CODES_HELP)(preflight)


def preflight(
    model_dir: ModelDirOpt = DEFAULT_MODEL_DIR,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
    miles_dir: MilesDirOpt = DEFAULT_MILES_DIR,
    megatron_dir: MegatronDirOpt = DEFAULT_MEGATRON_DIR,
    run_dir: RunDirOpt = DEFAULT_RUN_DIR,
    aiter_variant: AiterVariantOpt = None,
    num_gpus: NumGpusOpt = DEFAULT_NUM_GPUS,
    gpus: GpusAliasOpt = None,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", help="Every fact's value and message in full (wide)."),
    ] = False,
    output_format: Annotated[
        PreflightFormat,
        typer.Option("--format", metavar="<text|json>", help="What to print to stdout."),
    ] = PreflightFormat.text,
) -> None:
    """Check GPUs, ROCm, packages, checkouts, inputs and disk; write env.json to --run-dir.

    Exit 1 when any fact is not ok (the table says what to do).
    """
    from miles_amd.run import preflight as view
    from miles_amd.run.preflight import (
        PreflightConfig,
        failing_facts,
        run_preflight,
        write_env_json,
    )

    new_run_dir(run_dir)
    expected_gpus = resolve_alias(
        num_gpus, gpus, default=DEFAULT_NUM_GPUS, names=("--num-gpus", "--gpus")
    )
    config = PreflightConfig(
        model_dir=model_dir,
        data_dir=data_dir,
        miles_dir=miles_dir,
        megatron_dir=megatron_dir,
        run_dir=run_dir,
        expected_gpus=expected_gpus,
        aiter_variant=aiter_variant.value if aiter_variant else None,
    )
    facts = run_preflight(config)
    rows = view.shown(facts)
    as_json = output_format is PreflightFormat.json
    if not as_json:
        typer.echo(view.verdict_line(rows))
        typer.echo(view.table(rows, verbose=verbose))
    extra: dict[str, object] = {
        "config": config.as_dict(),
        "host": socket.gethostname(),
        "python": platform.python_version(),
    }
    try:
        path = write_env_json(facts, run_dir, extra)
    except OSError as exc:
        fail(f"--run-dir {run_dir}: cannot write env.json ({exc}); choose a writable dir")
    if as_json:
        document = {"verdict": view.verdict_line(rows), "env_json": str(path)}
        typer.echo(json.dumps({**document, "facts": view.as_json(rows)}, indent=2))
    from miles_amd.wrap import wrapped

    for line in wrapped(f"env.json written to {path} (the run dir's record of this preflight)"):
        say(line, err=as_json)
    failing = failing_facts(facts)
    if failing:
        roots = view.root_failures(rows)
        listed = ", ".join(f"{r.fact.name} ({r.status})" for r in roots) or "-"
        if len(failing) > len(roots):
            listed += f" (and {len(failing) - len(roots)} that need one of them)"
        for line in wrapped(f"miles-amd: preflight failed: {listed}"):
            say(line, err=True)
        raise typer.Exit(EXIT_FAILED)
