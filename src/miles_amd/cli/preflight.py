"""``miles-amd preflight``: check the node, image and inputs before a run, and record them.

Decides the command's options, output and exit code: it prints the preflight table, writes
``env.json`` into the run dir, and exits 0 when every fact is ``ok``, 1 otherwise with one line
on stderr naming the failing facts. The probes themselves live in ``miles_amd.run.preflight``,
imported only when the command runs, so registering the command costs nothing.
"""

from __future__ import annotations

import platform
import socket
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer


class AiterVariant(str, Enum):
    stock = "stock"
    patched = "patched"  # with ROCm/aiter#5694


def register(app: typer.Typer) -> None:
    """Add the ``preflight`` command to ``app``."""
    app.command("preflight")(preflight)


def preflight(
    model_dir: Annotated[Path, typer.Option("--model-dir", help="Holds gpt-oss-20b-bf16/.")] = Path(
        "/root/models"
    ),
    data_dir: Annotated[
        Path, typer.Option("--data-dir", help="Holds dapo-math-17k/dapo-math-17k.jsonl.")
    ] = Path("/root/datasets"),
    miles_dir: Annotated[
        Path, typer.Option("--miles-dir", help="miles checkout (train.py).")
    ] = Path("/root/miles"),
    megatron_dir: Annotated[
        Path, typer.Option("--megatron-dir", help="Megatron-LM checkout.")
    ] = Path("/root/Megatron-LM"),
    run_dir: Annotated[Path, typer.Option("--run-dir", help="env.json is written here.")] = Path(
        "runs/preflight"
    ),
    aiter_variant: Annotated[
        AiterVariant | None,
        typer.Option(
            "--aiter-variant", help="The image's aiter: stock, or patched (ROCm/aiter#5694)."
        ),
    ] = None,
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="GPUs the node must have.")] = 8,
) -> None:
    """Check GPUs, ROCm, packages, checkouts, inputs and disk; write env.json."""
    from miles_amd.run.preflight import (
        PreflightConfig,
        failing_facts,
        format_table,
        run_preflight,
        write_env_json,
    )

    config = PreflightConfig(
        model_dir=model_dir,
        data_dir=data_dir,
        miles_dir=miles_dir,
        megatron_dir=megatron_dir,
        run_dir=run_dir,
        expected_gpus=gpus,
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
        typer.echo(
            f"miles-amd: error: --run-dir {run_dir}: cannot write env.json ({exc})", err=True
        )
        raise typer.Exit(2) from None
    typer.echo(f"wrote {path}")
    failing = failing_facts(facts)
    if failing:
        listed = ", ".join(f"{f.name} ({f.status})" for f in failing)
        typer.echo(f"miles-amd: preflight failed: {listed}", err=True)
        raise typer.Exit(1)
