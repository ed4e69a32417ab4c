"""The ``miles-amd`` command line: turns flags into a recipe and a plan, then runs or prints it.

Decides option names, defaults and exit codes; planning lives in ``recipe``/``launcher``,
running in ``driver``, judging in ``gate``. Top-level imports stay light (no ray, torch,
tensorboard or matplotlib) so ``--dry-run`` and the snapshot suite are fast.

Exit codes: 0 success / gate pass, 1 gate fail or job failure, 2 bad input (one line on
stderr naming the flag and the fix).
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from miles_amd.cli import baseline as baseline_command
from miles_amd.cli import gate as gate_command
from miles_amd.cli import preflight as preflight_command
from miles_amd.recipe.plan import LaunchPlan, build_prepare_plan, build_train_plan, format_plan
from miles_amd.recipe.settings import Hardware, Recipe, RecipeError, parse_hardware

app = typer.Typer(
    help="gpt-oss-20b MoE LoRA GRPO on 8x AMD MI355X/MI350X: plan, run and gate it.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
preflight_command.register(app)
gate_command.register(app)
baseline_command.register(app)

HardwareOpt = Annotated[
    str, typer.Option("--hardware", help="MI355X, MI350X, or auto (detect from the GPUs).")
]
GpusOpt = Annotated[int, typer.Option("--num-gpus", help="GPUs on the node.")]
ModelDirOpt = Annotated[Path, typer.Option("--model-dir", help="Holds gpt-oss-20b-bf16/.")]
DataDirOpt = Annotated[
    Path, typer.Option("--data-dir", help="Holds dapo-math-17k/dapo-math-17k.jsonl.")
]
MilesDirOpt = Annotated[Path, typer.Option("--miles-dir", help="miles checkout (train.py).")]
MegatronDirOpt = Annotated[Path, typer.Option("--megatron-dir", help="Megatron-LM checkout.")]
RolloutsOpt = Annotated[int, typer.Option("--num-rollout", help="Rollouts (= optimizer steps).")]
ExtraOpt = Annotated[
    str, typer.Option("--extra-args", help="Extra train args, appended last (shell-split).")
]
OverrideOpt = Annotated[
    bool, typer.Option("--override-pinned", help="Let --extra-args replace pinned flags.")
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the plan; run nothing.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="With --dry-run: print the plan as JSON.")]
RunDirOpt = Annotated[
    Path, typer.Option("--run-dir", help="Where job.log, events and the report go.")
]
GateOpt = Annotated[
    str | None,
    typer.Option("--gate", help="After the run, gate it against this baseline (stock|patched)."),
]
TimeoutOpt = Annotated[
    float, typer.Option("--timeout", help="Overall timeout of the job, seconds.")
]


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, a non-zero exit."""
    typer.echo(f"miles-amd: error: {message}", err=True)
    raise typer.Exit(code)


def resolve_hardware(value: str) -> Hardware:
    if value.lower() == "auto":
        from miles_amd.recipe.hardware import HardwareDetectionError, detect_hardware

        try:
            return detect_hardware()
        except HardwareDetectionError as exc:
            fail(str(exc))
    try:
        return parse_hardware(value)
    except RecipeError as exc:
        fail(str(exc))


def make_recipe(
    hardware: str,
    num_gpus: int,
    model_dir: Path,
    data_dir: Path,
    miles_dir: Path,
    megatron_dir: Path,
    num_rollout: int,
    extra_args: str,
    override_pinned: bool,
) -> Recipe:
    try:
        return Recipe(
            hardware=resolve_hardware(hardware),
            num_gpus=num_gpus,
            model_dir=str(model_dir),
            data_dir=str(data_dir),
            miles_dir=str(miles_dir),
            megatron_dir=str(megatron_dir),
            num_rollout=num_rollout,
            extra_args=extra_args,
            override_pinned=override_pinned,
        )
    except RecipeError as exc:
        fail(str(exc))


def print_plan(plan: LaunchPlan, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(plan.to_dict(), indent=2))
    else:
        typer.echo(format_plan(plan))


def check_inputs(recipe: Recipe) -> None:
    """Before a real run: a BF16, complete checkpoint and a dataset with the right keys."""
    from miles_amd.recipe.inputs import InputError, validate_checkpoint, validate_dataset

    try:
        validate_checkpoint(Path(recipe.checkpoint_dir), flag="--model-dir")
        validate_dataset(Path(recipe.dataset_file), flag="--data-dir")
    except InputError as exc:
        fail(str(exc))
    if not Path(recipe.train_script).is_file():
        fail(f"--miles-dir {recipe.miles_dir}: no train.py there; point it at a miles checkout")


def run_prepare(plan: LaunchPlan) -> None:
    """Each download step as a subprocess; the HF token comes from the inherited env."""
    for step in plan.steps:
        typer.echo(f"$ {' '.join(step.argv)}")
        try:
            code = subprocess.run(step.argv, check=False).returncode
        except FileNotFoundError:
            fail("`hf` not found; install huggingface_hub (pip install -U huggingface_hub)")
        if code != 0:
            fail(f"{step.name} failed with exit code {code}", code=1)


def run_train(
    recipe: Recipe, run_dir: Path, gate: str | None, timeout: float, dry_run: bool, as_json: bool
) -> None:
    plan = build_train_plan(recipe, dict(os.environ), run_dir=str(run_dir.resolve()))
    if dry_run:
        print_plan(plan, as_json)
        return
    check_inputs(recipe)
    from miles_amd.run.driver import DriverError, execute

    try:
        outcome = execute(plan, timeout_s=timeout, baseline=gate)
    except DriverError as exc:
        fail(str(exc), code=1)
    typer.echo(outcome.summary())
    raise typer.Exit(outcome.exit_code)


@app.command()
def prepare(
    model_dir: ModelDirOpt = Path("/root/models"),
    data_dir: DataDirOpt = Path("/root/datasets"),
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Download the BF16 checkpoint and the dataset with `hf download`."""
    plan = build_prepare_plan(Recipe(model_dir=str(model_dir), data_dir=str(data_dir)))
    if dry_run:
        print_plan(plan, as_json)
        return
    run_prepare(plan)


@app.command()
def train(
    hardware: HardwareOpt = "MI355X",
    num_gpus: GpusOpt = 8,
    model_dir: ModelDirOpt = Path("/root/models"),
    data_dir: DataDirOpt = Path("/root/datasets"),
    miles_dir: MilesDirOpt = Path("/root/miles"),
    megatron_dir: MegatronDirOpt = Path("/root/Megatron-LM"),
    num_rollout: RolloutsOpt = 20,
    extra_args: ExtraOpt = "",
    override_pinned: OverrideOpt = False,
    run_dir: RunDirOpt = Path("runs/gpt-oss-20b-lora"),
    gate: GateOpt = None,
    timeout: TimeoutOpt = 5400.0,
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Run the recipe as a Ray job, write the run dir, and optionally gate it."""
    recipe = make_recipe(
        hardware, num_gpus, model_dir, data_dir, miles_dir, megatron_dir, num_rollout,
        extra_args, override_pinned,
    )  # fmt: skip
    run_train(recipe, run_dir, gate, timeout, dry_run, as_json)


def full_train(**options: Any) -> None:
    """`prepare`, then `train` (same options as `train`)."""
    recipe = make_recipe(*(options[name] for name in RECIPE_OPTIONS))
    prepare_plan = build_prepare_plan(recipe)
    run_dir, dry_run = options["run_dir"], options["dry_run"]
    if dry_run and options["as_json"]:
        train_plan = build_train_plan(recipe, dict(os.environ), run_dir=str(run_dir.resolve()))
        merged = train_plan.to_dict()
        merged["steps"] = [s.to_dict() for s in prepare_plan.steps] + merged["steps"]
        typer.echo(json.dumps(merged, indent=2))
        return
    if dry_run:
        typer.echo(format_plan(prepare_plan))
    else:
        run_prepare(prepare_plan)
    run_train(recipe, run_dir, options["gate"], options["timeout"], dry_run, as_json=False)


# `full-train` takes exactly `train`'s options: typer reads them from this signature.
full_train.__signature__ = inspect.signature(train, eval_str=True)  # type: ignore[attr-defined]
app.command("full-train")(full_train)
RECIPE_OPTIONS = tuple(inspect.signature(make_recipe).parameters)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
