"""``miles-amd train`` and ``miles-amd full-train``: build the recipe and its plan, check, run.

Decides the commands' options, what is checked before anything runs and in which order:
flags (parsed and range-checked by ``cli.options``; ``--json`` needs ``--dry-run``; a
``--run-dir`` that is a file is refused), then the recipe's invariants and ``--extra-args``
(``recipe.settings``; credentials there are refused), then ``--gate`` (the baseline is
loaded, once), and, for a real run only, the
checkpoint, the dataset and the miles checkout (``recipe.inputs``). Any of these is one line
on stderr and exit 2, with nothing started and no run dir written. Running is
``miles_amd.app.train``'s, imported only for a real run. ``full-train`` is ``prepare`` then
``train``, with exactly ``train``'s options. A gated run is judged once, after the driver,
with the flags given (``--require-env`` included); its one verdict is printed, returned as
the exit code and, when a history is named (``--history`` or ``$MILES_AMD_HISTORY``, checked
before the run; ``--no-history`` ignores both), appended to it (``miles_amd.app.gate``).

The all-reduce canary (``miles-amd canary``) runs after the input checks and before the job
when ``--aiter-variant`` names the run's all-reduce and the job runs on this machine's own
head (the plan's ``canary`` step; ``--no-canary`` drops it; a CPU rehearsal names no variant,
so it has none). Its red for patched or rccl is exit 1 before the run, with the node-minutes
that saved; an unusable canary (no GPU) is exit 2 naming ``--no-canary``
(``miles_amd.app.train.run_canary``).
"""

from __future__ import annotations

import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from miles_amd.cli.errors import fail, say
from miles_amd.cli.options import (
    DEFAULT_DATA_DIR,
    DEFAULT_HARDWARE,
    DEFAULT_MEGATRON_DIR,
    DEFAULT_MILES_DIR,
    DEFAULT_MODEL_DIR,
    DEFAULT_NUM_GPUS,
    DEFAULT_NUM_ROLLOUTS,
    DEFAULT_RUN_DIR,
    DEFAULT_TIMEOUT_S,
    AiterVariantOpt,
    DataDirOpt,
    DryRunOpt,
    ExtraArgsOpt,
    GateOpt,
    HardwareOpt,
    HistoryOpt,
    JsonOpt,
    MegatronDirOpt,
    MilesDirOpt,
    ModelDirOpt,
    NodeRootOpt,
    NoHistoryOpt,
    NumGpusOpt,
    NumRolloutAliasOpt,
    NumRolloutsOpt,
    OverridePinnedOpt,
    RayAddressOpt,
    RequireEnvOpt,
    RunDirOpt,
    SharedFsOpt,
    TimeoutOpt,
    VariantsOpt,
    check_json_needs_dry_run,
    load_baseline_option,
    named_history,
    new_run_dir,
    resolve_alias,
)
from miles_amd.cli.prepare import print_plan, run_prepare
from miles_amd.exit_codes import EXIT_CODES_HELP, EXIT_FAILED
from miles_amd.recipe.plan import (
    DEFAULT_NODE_ROOT,
    build_prepare_plan,
    build_train_plan,
    format_plan,
)
from miles_amd.recipe.settings import Hardware, Recipe, RecipeError, parse_hardware
from miles_amd.recipe.shapes import DEFAULT_SHAPE, SHAPES
from miles_amd.run_dir import RunDir

if TYPE_CHECKING:
    from miles_amd.rules.model import Baseline

ShapeOpt = Annotated[
    str,
    typer.Option(
        "--shape",
        metavar="<" + "|".join(SHAPES) + ">",
        help="The recipe's shape: 8gpu (one node, 20 rollouts) or 4gpu (one TP-4 rollout "
        "engine beside the TP-4 trainer, 2 rollouts: the per-PR smoke). Sets --num-gpus and "
        'the default --num-rollouts (docs/cli.md, "Recipe shapes").',
    ),
]
NoCanaryOpt = Annotated[
    bool,
    typer.Option(
        "--no-canary",
        help="Skip the all-reduce canary that runs before the job with --aiter-variant "
        "(miles-amd canary; it needs the node's GPUs).",
    ),
]


def register(app: typer.Typer) -> None:
    """Add ``train`` and ``full-train`` to ``app``."""
    app.command("train", epilog=EXIT_CODES_HELP)(train)
    app.command("full-train", epilog=EXIT_CODES_HELP)(full_train)


def train(
    hardware: HardwareOpt = DEFAULT_HARDWARE,
    shape: ShapeOpt = DEFAULT_SHAPE,
    num_gpus: NumGpusOpt = DEFAULT_NUM_GPUS,
    model_dir: ModelDirOpt = DEFAULT_MODEL_DIR,
    data_dir: DataDirOpt = DEFAULT_DATA_DIR,
    miles_dir: MilesDirOpt = DEFAULT_MILES_DIR,
    megatron_dir: MegatronDirOpt = DEFAULT_MEGATRON_DIR,
    num_rollouts: NumRolloutsOpt = DEFAULT_NUM_ROLLOUTS,
    num_rollout: NumRolloutAliasOpt = None,
    extra_args: ExtraArgsOpt = "",
    override_pinned: OverridePinnedOpt = False,
    run_dir: RunDirOpt = DEFAULT_RUN_DIR,
    gate: GateOpt = None,
    require_env: RequireEnvOpt = False,
    timeout: TimeoutOpt = DEFAULT_TIMEOUT_S,
    ray_address: RayAddressOpt = None,
    node_root: NodeRootOpt = DEFAULT_NODE_ROOT,
    shared_fs: SharedFsOpt = False,
    variants: VariantsOpt = None,
    aiter_variant: AiterVariantOpt = None,
    no_canary: NoCanaryOpt = False,
    dry_run: DryRunOpt = False,
    as_json: JsonOpt = False,
    history_file: HistoryOpt = None,
    no_history: NoHistoryOpt = False,
) -> None:
    """Run the recipe as a Ray job, write the run dir, and optionally gate it."""
    check_json_needs_dry_run(as_json, dry_run)
    new_run_dir(run_dir)
    recipe = make_recipe(**_recipe_options(locals()))
    reference = _gate_baseline(gate)
    env = launch_env(ray_address)
    root = None if shared_fs else node_root
    if variants is not None:
        from miles_amd.cli.variants import parse_variants, run_variants

        if gate is not None:
            fail("--variants gates each variant against its own baseline; drop --gate")
        if aiter_variant is not None:
            fail("--variants sets each job's aiter variant; drop --aiter-variant")
        names = parse_variants(variants)
        run_variants(
            recipe,
            run_dir,
            names,
            require_env=require_env,
            timeout=timeout,
            dry_run=dry_run,
            as_json=as_json,
            env=env,
            node_root=root,
        )
        return
    run_train(
        TrainRequest(
            recipe=recipe,
            run_dir=run_dir,
            env=env,
            node_root=root,
            timeout_s=timeout,
            gate=reference,
            require_env=require_env,
            history=named_history(history_file, no_history),
            dry_run=dry_run,
            as_json=as_json,
            aiter_variant=aiter_variant.value if aiter_variant else None,
            canary=not no_canary,
        )
    )


def full_train(**options: Any) -> None:
    """`prepare`, then `train` (same options as `train`)."""
    check_json_needs_dry_run(options["as_json"], options["dry_run"])
    new_run_dir(options["run_dir"])
    recipe = make_recipe(**_recipe_options(options))
    reference = _gate_baseline(options["gate"])
    if options["variants"] is not None:
        fail("--variants: run `miles-amd prepare` on the nodes, then `miles-amd train`")
    prepare_plan = build_prepare_plan(recipe)
    run_dir, dry_run = options["run_dir"], options["dry_run"]
    env = launch_env(options["ray_address"])
    node_root = None if options["shared_fs"] else options["node_root"]
    variant = options["aiter_variant"].value if options["aiter_variant"] else None
    if dry_run and options["as_json"]:
        train_plan = build_train_plan(
            recipe,
            env,
            run_dir=str(run_dir),
            node_root=node_root,
            aiter_variant=variant,
            canary=not options["no_canary"],
        )
        merged = train_plan.to_dict()
        train_steps = merged["steps"]
        assert isinstance(train_steps, list)
        merged["steps"] = [s.to_dict() for s in prepare_plan.steps] + train_steps
        typer.echo(json.dumps(merged, indent=2))
        return
    if dry_run:
        typer.echo(format_plan(prepare_plan))
    else:
        run_prepare(prepare_plan)
    run_train(
        TrainRequest(
            recipe=recipe,
            run_dir=run_dir,
            env=env,
            node_root=node_root,
            timeout_s=options["timeout"],
            gate=reference,
            require_env=options["require_env"],
            history=named_history(options["history_file"], options["no_history"]),
            dry_run=dry_run,
            aiter_variant=variant,
            canary=not options["no_canary"],
        )
    )


# `full-train` takes exactly `train`'s options: typer reads them from this signature.
full_train.__signature__ = inspect.signature(train, eval_str=True)  # type: ignore[attr-defined]


def _recipe_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options ``make_recipe`` takes, the hidden ``--num-rollout`` merged in and the
    shape applied: it fixes ``--num-gpus`` and gives the default ``--num-rollouts``."""
    rollouts = resolve_alias(
        options["num_rollouts"],
        options["num_rollout"],
        default=DEFAULT_NUM_ROLLOUTS,
        names=("--num-rollouts", "--num-rollout"),
    )
    given = {"num_gpus": options["num_gpus"], "num_rollouts": rollouts}
    shape = SHAPES.get(options["shape"])
    if shape is None:
        fail(f"--shape {options['shape']}: unknown shape; fix: use one of {', '.join(SHAPES)}")
    if shape.name != DEFAULT_SHAPE:  # the default shape is Recipe's defaults: nothing to set
        if options["num_gpus"] not in (DEFAULT_NUM_GPUS, shape.num_gpus):
            fail(
                f"--shape {shape.name} runs on {shape.num_gpus} GPUs, --num-gpus says "
                f"{options['num_gpus']}; fix: drop --num-gpus, or pick the shape of that count"
            )
        given["num_gpus"] = shape.num_gpus
        if rollouts == DEFAULT_NUM_ROLLOUTS:
            given["num_rollouts"] = shape.num_rollouts
    names = inspect.signature(make_recipe).parameters
    return {name: given.get(name, options.get(name)) for name in names}


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
    num_rollouts: int,
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
            num_rollout=num_rollouts,
            extra_args=extra_args,
            override_pinned=override_pinned,
        )
    except RecipeError as exc:
        fail(str(exc))


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


def launch_env(ray_address: str | None) -> dict[str, str]:
    """The environment the launch sees; ``--ray-address`` replaces ``RAY_ADDRESS``."""
    env = dict(os.environ)
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    return env


@dataclass(frozen=True)
class TrainRequest:
    """One ``train`` as the user asked for it, every option checked."""

    recipe: Recipe
    run_dir: Path
    env: dict[str, str]
    node_root: str | None
    timeout_s: float
    gate: Baseline | None = None  # loaded once, before anything runs
    require_env: bool = False
    history: Path | None = None  # append the gate's verdict here (named_history)
    dry_run: bool = False
    as_json: bool = False
    aiter_variant: str | None = None  # miles_amd.variants: the job's SGLang aiter env
    canary: bool = False  # the all-reduce canary first (with aiter_variant, own head only)


# said on stdout when --aiter-variant is not given (miles_amd.variants.sglang_env sets only
# SGLANG_USE_AITER then)
AITER_LEFT_TO_IMAGE = (
    "aiter variant: not given; SGLANG_USE_AITER_AR (aiter's all-reduce or SGLang's) is left to "
    "the image; --aiter-variant stock|patched|rccl sets it and records the run's variant"
)


def run_train(request: TrainRequest) -> None:
    """Print the plan (``dry_run``), or run it, print the outcome and exit with its code."""
    recipe = request.recipe
    plan = build_train_plan(
        recipe,
        request.env,
        run_dir=str(request.run_dir),
        node_root=request.node_root,
        aiter_variant=request.aiter_variant,
        canary=request.canary,
    )
    if request.dry_run:
        print_plan(plan, request.as_json)
        if request.aiter_variant is None and not request.as_json:
            say(AITER_LEFT_TO_IMAGE)
        return
    if request.aiter_variant is None:
        say(AITER_LEFT_TO_IMAGE)
    if plan.node_run_dir is None:  # with private node storage these are the node's paths
        check_inputs(recipe)
    from miles_amd.app.errors import AppError
    from miles_amd.app.train import CanaryRed, run_and_gate
    from miles_amd.cli.history import open_history_option
    from miles_amd.run.cluster import ClusterError
    from miles_amd.run.driver import DriverError

    history = request.history if request.gate is not None else None
    if history is not None:
        open_history_option(history)
    try:
        result = run_and_gate(
            plan,
            timeout_s=request.timeout_s,
            gate=request.gate,
            require_env=request.require_env,
            history=history,
        )
    except CanaryRed as exc:
        fail(str(exc), code=EXIT_FAILED)  # nothing was submitted
    except (AppError, ClusterError) as exc:
        fail(str(exc))  # bad input: nothing was submitted
    except DriverError as exc:
        fail(str(exc), code=exc.exit_code)
    except OSError as exc:
        report = RunDir(request.run_dir).report
        fail(
            f"{report}: cannot write the report ({exc}); the run dir holds the run",
            code=EXIT_FAILED,
        )
    say(result.summary())
    if result.gate is not None:
        for line in result.gate.history_lines:
            say(line)
    raise typer.Exit(result.exit_code)


def _gate_baseline(gate: str | None) -> Baseline | None:
    """``--gate``'s baseline, loaded before an hour of GPUs is spent (and not again)."""
    return None if gate is None else load_baseline_option(gate, "--gate")
