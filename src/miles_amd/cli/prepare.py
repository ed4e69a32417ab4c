"""``miles-amd prepare``: download the BF16 checkpoint and the dataset with ``hf download``.

Decides the command's options and how it runs the plan's steps (``recipe.plan``
decides the steps). ``hf`` is the Hugging Face CLI: the console script of
``huggingface_hub`` since 0.34.0 (0.33.x ships only ``huggingface-cli``), declared as a
dependency of this package; it reads ``HF_TOKEN`` from the inherited environment, so no
token is ever on a command line. It is looked up on ``PATH`` and then beside this
interpreter (a venv used without activation). Without it the command exits 2 saying what
to install; a failed download exits 1; ``--json`` without ``--dry-run`` exits 2.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import typer

from miles_amd.cli.errors import fail, say
from miles_amd.cli.options import (
    DEFAULT_DATA_DIR,
    DEFAULT_MODEL_DIR,
    DataDirOpt,
    DryRunOpt,
    JsonOpt,
    ModelDirOpt,
    check_json_needs_dry_run,
)
from miles_amd.exit_codes import EXIT_CODES_HELP, EXIT_FAILED
from miles_amd.recipe.plan import LaunchPlan, build_prepare_plan, format_plan
from miles_amd.recipe.settings import Recipe

HF_REQUIREMENT = "huggingface_hub>=0.34"  # the first release whose wheel has the `hf` script


def register(app: typer.Typer) -> None:
    """Add the ``prepare`` command to ``app``."""
    app.command("prepare", epilog=EXIT_CODES_HELP)(prepare)


def prepare(
    model_dir: ModelDirOpt = DEFAULT_MODEL_DIR,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Download the BF16 checkpoint and the dataset with `hf download`."""
    check_json_needs_dry_run(as_json, dry_run)
    plan = build_prepare_plan(Recipe(model_dir=str(model_dir), data_dir=str(data_dir)))
    if dry_run:
        print_plan(plan, as_json)
        return
    run_prepare(plan)


def print_plan(plan: LaunchPlan, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(plan.to_dict(), indent=2))
    else:
        typer.echo(format_plan(plan))


def hf_executable() -> str | None:
    """``hf`` on ``PATH``, else the one installed beside this interpreter, else None."""
    found = shutil.which("hf")
    if found:
        return found
    beside = Path(sys.executable).parent / "hf"
    return str(beside) if beside.is_file() else None


def run_prepare(plan: LaunchPlan) -> None:
    """Each download step as a subprocess; the HF token comes from the inherited env."""
    hf = hf_executable()
    if hf is None:
        fail(
            "`hf` (the Hugging Face CLI) is not installed; fix: "
            f"pip install '{HF_REQUIREMENT}' (it provides `hf`), then run prepare again"
        )
    for step in plan.steps:
        argv = [hf, *step.argv[1:]] if step.argv[:1] == ("hf",) else list(step.argv)
        say(f"$ {' '.join(step.argv)}")
        code = subprocess.run(argv, check=False).returncode
        if code != 0:
            fail(f"{step.name} failed with exit code {code}", code=EXIT_FAILED)
