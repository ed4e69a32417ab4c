"""``miles-amd preflight``: check the node, image and inputs before a run, and record them.

Decides the command's options, output and exit code: it prints the preflight table, writes
``env.json`` into ``--run-dir`` (the same dir, with the same default, that ``train
--run-dir`` writes its evidence to and ``baseline record --run-dir`` reads), and exits 0 when
every fact is ``ok``, 1 otherwise with one line on stderr naming the failing facts, 2 on bad
input. The dir options and their defaults are ``train``'s (``cli.options``); ``--gpus`` is
the hidden old spelling of ``--num-gpus``. The probes live in ``miles_amd.run.preflight``,
imported only when the command runs, so registering the command costs nothing.
"""

from __future__ import annotations

import platform
import socket

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
) -> None:
    """Check GPUs, ROCm, packages, checkouts, inputs and disk; write env.json to --run-dir.

    Exit 1 when any fact is not ok (the table says what to do).
    """
    from miles_amd.run.preflight import (
        PreflightConfig,
        failing_facts,
        format_table,
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
    typer.echo(format_table(facts))
    extra: dict[str, object] = {
        "config": config.as_dict(),
        "host": socket.gethostname(),
        "python": platform.python_version(),
    }
    try:
        path = write_env_json(facts, run_dir, extra)
    except OSError as exc:
        fail(f"--run-dir {run_dir}: cannot write env.json ({exc}); choose a writable dir")
    say(f"wrote {path}")
    failing = failing_facts(facts)
    if failing:
        listed = ", ".join(f"{f.name} ({f.status})" for f in failing)
        say(f"miles-amd: preflight failed: {listed}", err=True)
        raise typer.Exit(EXIT_FAILED)
