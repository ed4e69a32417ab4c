"""``miles-amd prepare``, ``preflight``, ``train`` and ``full-train``: plan, check, run.

Every check (flags, the recipe, ``--gate``'s baseline, a named history, and for a real run the
checkpoint, dataset and miles checkout) is one line and exit 2 before anything starts.
``full-train`` is ``prepare`` then ``train`` with ``train``'s options; ``--variants`` runs one
job per aiter variant, then the A/B against stock, and exits with the worst code.
"""

from __future__ import annotations

import inspect
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, cast

import typer

from miles_amd.cli import options as opts
from miles_amd.cli.options import fail, opt, say
from miles_amd.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED
from miles_amd.recipe.plan import (
    DEFAULT_NODE_ROOT,
    LaunchPlan,
    build_prepare_plan,
    build_train_plan,
    format_plan,
)
from miles_amd.recipe.settings import DEFAULT_SHAPE, SHAPES, Recipe, parse_hardware
from miles_amd.run_dir import RunDir
from miles_amd.variants import AITER_VARIANTS

HF_REQUIREMENT = "huggingface_hub>=0.34"  # the first release whose wheel has the `hf` script
AITER_LEFT_TO_IMAGE = (
    "aiter variant: not given; SGLANG_USE_AITER_AR (aiter's all-reduce or SGLang's) is left to "
    "the image; --aiter-variant stock|patched|rccl sets it and records the run's variant"
)
ShapeOpt = Annotated[
    str, opt("--shape", "Sets --num-gpus and the rollouts (docs/cli.md).", "<8gpu|4gpu>")
]
NoCanaryOpt = Annotated[bool, opt("--no-canary", "Skip the canary before the job.")]


class PreflightFormat(str, Enum):
    text = "text"
    json = "json"


def register(app: typer.Typer) -> None:
    for name, command in (
        ("prepare", prepare),
        ("train", train),
        ("full-train", full_train),
        ("preflight", preflight),
    ):
        opts.add_command(app, name, command)


def prepare(
    model_dir: opts.ModelDirOpt = opts.DEFAULT_MODEL_DIR,
    data_dir: opts.DataDirOpt = opts.DEFAULT_DATA_DIR,
    dry_run: opts.DryRunOpt = False,
    as_json: opts.JsonOpt = False,
) -> None:
    """Download the BF16 checkpoint and the dataset with `hf download`."""
    opts.check_json_needs_dry_run(as_json, dry_run)
    plan = build_prepare_plan(Recipe(model_dir=str(model_dir), data_dir=str(data_dir)))
    if dry_run:
        print_plan(plan, as_json)
    else:
        run_prepare(plan)


def print_plan(plan: LaunchPlan, as_json: bool) -> None:
    typer.echo(json.dumps(plan.to_dict(), indent=2) if as_json else format_plan(plan))


def run_prepare(plan: LaunchPlan) -> None:
    beside = Path(sys.executable).parent / "hf"  # a venv used without activation
    hf = shutil.which("hf") or (str(beside) if beside.is_file() else None)
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


def preflight(
    model_dir: opts.ModelDirOpt = opts.DEFAULT_MODEL_DIR,
    data_dir: opts.DataDirOpt = opts.DEFAULT_DATA_DIR,
    miles_dir: opts.MilesDirOpt = opts.DEFAULT_MILES_DIR,
    megatron_dir: opts.MegatronDirOpt = opts.DEFAULT_MEGATRON_DIR,
    run_dir: opts.RunDirOpt = opts.DEFAULT_RUN_DIR,
    aiter_variant: opts.AiterVariantOpt = None,
    num_gpus: opts.NumGpusOpt = opts.DEFAULT_NUM_GPUS,
    gpus: opts.GpusAliasOpt = None,
    verbose: Annotated[bool, opt("--verbose", "Every fact in full (wide).")] = False,
    output_format: Annotated[
        PreflightFormat, opt("--format", None, "<text|json>")
    ] = PreflightFormat.text,
) -> None:
    """Check GPUs, ROCm, packages, checkouts, inputs and disk; write env.json to --run-dir.

    Exit 1 when any fact is not ok (the table says what to do).
    """
    from miles_amd.run import preflight as view
    from miles_amd.wrap import wrapped

    opts.new_run_dir(run_dir)
    config = view.PreflightConfig(
        model_dir=model_dir,
        data_dir=data_dir,
        miles_dir=miles_dir,
        megatron_dir=megatron_dir,
        run_dir=run_dir,
        expected_gpus=opts.resolve_alias(
            num_gpus, gpus, default=opts.DEFAULT_NUM_GPUS, names=("--num-gpus", "--gpus")
        ),
        aiter_variant=aiter_variant.value if aiter_variant else None,
    )
    facts = view.run_preflight(config)
    rows = view.shown(facts)
    as_json = output_format is PreflightFormat.json
    if not as_json:
        typer.echo(view.verdict_line(rows))
        typer.echo(view.table(rows, verbose=verbose))
    extra: dict[str, object] = {"config": config.as_dict(), "host": socket.gethostname(),
             "python": platform.python_version()}  # fmt: skip
    try:
        path = view.write_env_json(facts, run_dir, extra)
    except OSError as exc:
        fail(f"--run-dir {run_dir}: cannot write env.json ({exc}); choose a writable dir")
    if as_json:
        document = {"verdict": view.verdict_line(rows), "env_json": str(path)}
        typer.echo(json.dumps({**document, "facts": view.as_json(rows)}, indent=2))
    for line in wrapped(f"env.json written to {path} (the run dir's record of this preflight)"):
        say(line, err=as_json)
    failing = view.failing_facts(facts)
    if failing:
        roots = view.root_failures(rows)
        listed = ", ".join(f"{r.fact.name} ({r.status})" for r in roots) or "-"
        if len(failing) > len(roots):
            listed += f" (and {len(failing) - len(roots)} that need one of them)"
        for line in wrapped(f"miles-amd: preflight failed: {listed}"):
            say(line, err=True)
        raise typer.Exit(EXIT_FAILED)


def train(
    hardware: opts.HardwareOpt = opts.DEFAULT_HARDWARE,
    shape: ShapeOpt = DEFAULT_SHAPE,
    num_gpus: opts.NumGpusOpt = opts.DEFAULT_NUM_GPUS,
    model_dir: opts.ModelDirOpt = opts.DEFAULT_MODEL_DIR,
    data_dir: opts.DataDirOpt = opts.DEFAULT_DATA_DIR,
    miles_dir: opts.MilesDirOpt = opts.DEFAULT_MILES_DIR,
    megatron_dir: opts.MegatronDirOpt = opts.DEFAULT_MEGATRON_DIR,
    num_rollouts: opts.RolloutsOpt = opts.DEFAULT_NUM_ROLLOUTS,
    num_rollout: opts.RolloutAliasOpt = None,
    extra_args: opts.ExtraArgsOpt = "",
    override_pinned: opts.OverridePinnedOpt = False,
    run_dir: opts.RunDirOpt = opts.DEFAULT_RUN_DIR,
    gate: opts.GateOpt = None,
    require_env: opts.RequireEnvOpt = False,
    timeout: opts.TimeoutOpt = opts.DEFAULT_TIMEOUT_S,
    ray_address: opts.RayAddressOpt = None,
    node_root: opts.NodeRootOpt = DEFAULT_NODE_ROOT,
    shared_fs: opts.SharedFsOpt = False,
    variants: opts.VariantsOpt = None,
    aiter_variant: opts.AiterVariantOpt = None,
    no_canary: NoCanaryOpt = False,
    dry_run: opts.DryRunOpt = False,
    as_json: opts.JsonOpt = False,
    history_file: opts.HistoryOpt = None,
    no_history: opts.NoHistoryOpt = False,
) -> None:
    """Run the recipe as a Ray job, write the run dir, and optionally gate it."""
    _run(locals(), then_prepare=False)


def full_train(**options: Any) -> None:
    """`prepare`, then `train` (same options as `train`)."""
    _run(options, then_prepare=True)


# `full-train` takes exactly `train`'s options: typer reads them from this signature.
full_train.__signature__ = inspect.signature(train, eval_str=True)  # type: ignore[attr-defined]


def _run(o: dict[str, Any], *, then_prepare: bool) -> None:
    run_dir, dry_run, as_json = o["run_dir"], o["dry_run"], o["as_json"]
    opts.check_json_needs_dry_run(as_json, dry_run)
    opts.new_run_dir(run_dir)
    recipe = make_recipe(o)
    from miles_amd.app.baselines import load

    reference = load(o["gate"], "--gate") if o["gate"] is not None else None
    env = dict(os.environ)
    if o["ray_address"]:
        env["RAY_ADDRESS"] = o["ray_address"]
    node_root = None if o["shared_fs"] else o["node_root"]
    variant = o["aiter_variant"].value if o["aiter_variant"] else None
    if o["variants"] is not None:
        if then_prepare:
            fail("--variants: run `miles-amd prepare` on the nodes, then `miles-amd train`")
        if o["gate"] is not None:
            fail("--variants gates each variant against its own baseline; drop --gate")
        if variant is not None:
            fail("--variants sets each job's aiter variant; drop --aiter-variant")
        _run_variants(recipe, run_dir, o, env, node_root)
    plan = build_train_plan(
        recipe,
        env,
        run_dir=str(run_dir),
        node_root=node_root,
        aiter_variant=variant,
        canary=not o["no_canary"],
    )
    if then_prepare:
        prepare_plan = build_prepare_plan(recipe)
        if dry_run and as_json:
            merged = plan.to_dict()
            steps = [s.to_dict() for s in prepare_plan.steps] + cast(list, merged["steps"])
            typer.echo(json.dumps({**merged, "steps": steps}, indent=2))
            return
        if dry_run:
            typer.echo(format_plan(prepare_plan))
        else:
            run_prepare(prepare_plan)
    if dry_run:
        print_plan(plan, as_json)
    if variant is None and not as_json:
        say(AITER_LEFT_TO_IMAGE)
    if dry_run:
        return
    if plan.node_run_dir is None:  # with private node storage these are the node's paths
        from miles_amd.recipe.inputs import validate_checkpoint, validate_dataset

        validate_checkpoint(Path(recipe.checkpoint_dir), flag="--model-dir")
        validate_dataset(Path(recipe.dataset_file), flag="--data-dir")
        if not Path(recipe.train_script).is_file():
            fail(f"--miles-dir {recipe.miles_dir}: no train.py there; point it at a miles checkout")
    history = opts.named_history(o["history_file"], o["no_history"]) if reference else None
    if history is not None:
        from miles_amd.app.gate import open_history

        open_history(history)
    from miles_amd.app.train import run_and_gate

    try:  # a red canary, bad input or the driver's error: add_command's line and code
        result = run_and_gate(
            plan, timeout_s=o["timeout"], gate=reference, require_env=o["require_env"],
            history=history,
        )  # fmt: skip
    except OSError as exc:
        report = RunDir(run_dir).report
        fail(f"{report}: cannot write the report ({exc}); the run dir holds the run", EXIT_FAILED)
    say(result.summary())
    for line in result.gate.history_lines if result.gate is not None else ():
        say(line)
    raise typer.Exit(result.exit_code)


def make_recipe(o: dict[str, Any]) -> Recipe:
    """The options' recipe (the shape fixes ``--num-gpus`` and the default rollouts)."""
    rollouts = opts.resolve_alias(
        o["num_rollouts"], o["num_rollout"], default=opts.DEFAULT_NUM_ROLLOUTS,
        names=("--num-rollouts", "--num-rollout"),
    )  # fmt: skip
    num_gpus = o["num_gpus"]
    shape = SHAPES.get(o["shape"])
    if shape is None:
        fail(f"--shape {o['shape']}: unknown shape; fix: use one of {', '.join(SHAPES)}")
    if shape.name != DEFAULT_SHAPE:  # the default shape is Recipe's defaults: nothing to set
        if num_gpus not in (opts.DEFAULT_NUM_GPUS, shape.num_gpus):
            fail(
                f"--shape {shape.name} runs on {shape.num_gpus} GPUs, --num-gpus says "
                f"{num_gpus}; fix: drop --num-gpus, or pick the shape of that count"
            )
        num_gpus = shape.num_gpus
        if rollouts == opts.DEFAULT_NUM_ROLLOUTS:
            rollouts = shape.num_rollouts
    if o["hardware"].lower() == "auto":
        from miles_amd.recipe.settings import detect_hardware

        hardware = detect_hardware()
    else:
        hardware = parse_hardware(o["hardware"])
    return Recipe(
        hardware=hardware,
        num_gpus=num_gpus,
        model_dir=str(o["model_dir"]),
        data_dir=str(o["data_dir"]),
        miles_dir=str(o["miles_dir"]),
        megatron_dir=str(o["megatron_dir"]),
        num_rollout=rollouts,
        extra_args=o["extra_args"],
        override_pinned=o["override_pinned"],
    )


def _run_variants(
    recipe: Recipe, run_dir: Path, o: dict[str, Any], env: dict[str, str], node_root: str | None
) -> None:
    """One plan per variant in ``run_dir/<variant>``, run, gated, compared with stock."""
    from miles_amd.run.variants_run import variant_env

    value = o["variants"]
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    if not names or set(names) - set(AITER_VARIANTS) or len(set(names)) != len(names):
        fail(f"--variants {value}: give distinct names from {', '.join(AITER_VARIANTS)}")
    if not env.get("RAY_ADDRESS"):
        fail("--variants needs a Ray cluster: pass --ray-address (one whole node per variant)")
    root = RunDir(run_dir)
    plans = {
        v: build_train_plan(recipe, variant_env(env, v), run_dir=str(root.variant(v).root),
                            node_root=node_root, aiter_variant=v)
        for v in names
    }  # fmt: skip
    if o["dry_run"]:
        if o["as_json"]:
            typer.echo(json.dumps({v: p.to_dict() for v, p in plans.items()}, indent=2))
        else:
            typer.echo("\n\n".join(f"# variant {v}\n{format_plan(p)}" for v, p in plans.items()))
        raise typer.Exit(0)
    from miles_amd.app.gate import NoMetricsError, compare_run_dirs
    from miles_amd.app.train import TrainResult, run_variants
    from miles_amd.report.compare_report import render

    results = run_variants(
        plans, timeout_s=o["timeout"], require_env=o["require_env"], echo=typer.echo
    )
    code = 0
    for variant, result in results.items():
        if isinstance(result, TrainResult):
            say(f"{variant}: {result.summary()}")
            code = max(code, result.exit_code)
        else:
            typer.echo(opts.error_line(f"{variant}: could not run: {result}"), err=True)
            code = max(code, EXIT_FAILED)
    for other in [v for v in plans if v != "stock"] if "stock" in plans else []:
        b = results[other]
        if not isinstance(b, TrainResult) or b.gate is None:
            continue  # this variant did not run to a verdict: said above
        try:
            compared = compare_run_dirs(
                root.variant("stock").root, root.variant(other).root, b.gate.baseline
            )
        except NoMetricsError as exc:
            typer.echo(opts.error_line(f"compare --run-dir {exc}; no comparison"), err=True)
            raise typer.Exit(max(code, EXIT_BAD_INPUT)) from None
        except OSError as exc:
            what = f"compare: cannot write the comparison ({exc})"
            typer.echo(opts.error_line(what), err=True)
            raise typer.Exit(max(code, EXIT_BAD_INPUT)) from None
        typer.echo(render(compared.comparison, "text"), nl=False)
        say(f"comparison written to {compared.files.markdown}")
    raise typer.Exit(code)
