"""Plan a launcher variant with the real CLI, then parse its argv with miles' real parser.

Planning is ``miles-amd train --dry-run --json`` run in-process (typer's ``CliRunner``) with
``os.environ`` replaced by exactly the variant's environment for the call, so nothing of the
test machine's shell (a ``WANDB_API_KEY``, a ``RAY_ADDRESS``) changes the plan. The parse
is ``miles_amd.run.parse_probe.parse_with_miles``: a subprocess of the checkout's python
running ``miles_parse.py`` on the plan's ``train.py`` argv, in the env the driver submits
(the launching env's ``PATH``/``HOME``/locale, the plan's device env, the job's runtime
env with its secrets).

Variants come from the snapshot suite's ``CASES`` (:data:`TRAIN_CASES`: every ``train``
case, its flags with the dir flags taken out, since the tier supplies its own fake inputs and
checkout), so a variant added there is checked here too.

Parses run concurrently (:func:`parse_all`, one worker per CPU): each one is a fresh
interpreter (~13 s of CPU, nearly all imports), because ``parse_args`` reads ``sys.argv``
and ``os.environ`` and configures logging, and Megatron keeps global args.

Explained for people in ``docs/conformance.md``.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from miles_amd.cli.main import app
from miles_amd.recipe.plan import REDACTED
from miles_amd.run.parse_probe import ParseOutcome, parse_with_miles
from tests.conformance.checkout import MilesCheckout
from tests.snapshot.test_dry_run import CASES as SNAPSHOT_CASES

# Fields the test sets itself: the fake inputs, the checkout under test.
DIR_FIELDS = ("model_dir", "data_dir", "miles_dir", "megatron_dir")
# Inherited from the test process: what a shell gives any launch. Everything else is the plan's.
PASSTHROUGH_ENV = ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL")
CI_RECORD_ENV = "MILES_CI_GATE_RECORD_DIR"  # miles/utils/arguments.py: RECORD_DIR_ENV


@dataclass(frozen=True)
class Job:
    """One planned job: the resolved recipe, the ``train.py`` argv and the parse env."""

    recipe: dict[str, Any]
    train_argv: list[str]
    env: dict[str, str]

    def with_env(self, **changes: str | None) -> Job:
        env = {k: v for k, v in self.env.items() if changes.get(k, v) is not None}
        env.update({k: v for k, v in changes.items() if v is not None})
        return Job(self.recipe, self.train_argv, env)


DIR_FLAGS = ("--model-dir", "--data-dir", "--miles-dir", "--megatron-dir", "--run-dir")


def without_dir_flags(args: tuple[str, ...]) -> list[str]:
    """``args`` without the dir flags and their values (the tier supplies its own dirs)."""
    kept: list[str] = []
    skip = False
    for token in args:
        if skip:
            skip = False
        elif token in DIR_FLAGS:
            skip = True
        else:
            kept.append(token)
    return kept


# snapshot case -> (train flags without dirs, the case's environment beside PATH)
TRAIN_CASES: dict[str, tuple[list[str], dict[str, str]]] = {
    case: (without_dir_flags(args[1:]), env)
    for case, (args, env) in SNAPSHOT_CASES.items()
    if args[0] == "train"
}


def snapshot_recipe(case: str) -> dict[str, Any]:
    """The recipe the snapshot suite plans for ``case`` (its own dirs, its own environment)."""
    args, env = SNAPSHOT_CASES[case]
    with exactly_this_environ({"PATH": "/usr/bin", **env}):
        result = CliRunner().invoke(app, [*args, "--dry-run", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    recipe: dict[str, Any] = json.loads(result.stdout)["recipe"]
    return recipe


@contextmanager
def exactly_this_environ(env: Mapping[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def plan_with_cli(
    checkout: MilesCheckout,
    inputs: tuple[Path, Path],
    run_dir: Path,
    cli_args: list[str],
    launch_env: Mapping[str, str],
) -> Job:
    """``miles-amd train --dry-run --json`` for the variant, as the job the driver submits."""
    model_dir, data_dir = inputs
    argv = [
        "train", "--dry-run", "--json",
        "--model-dir", str(model_dir), "--data-dir", str(data_dir),
        "--miles-dir", str(checkout.miles), "--megatron-dir", str(checkout.megatron),
        "--run-dir", str(run_dir), *cli_args,
    ]  # fmt: skip
    env = {**{k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}, **launch_env}
    with exactly_this_environ(env):
        result = CliRunner().invoke(app, argv, catch_exceptions=False)
    if result.exit_code != 0:
        raise AssertionError(
            f"miles-amd {' '.join(argv)} exited {result.exit_code}: {result.output}"
        )
    printed = json.loads(result.stdout)
    entrypoint: list[str] = printed["job"]["entrypoint"]
    assert entrypoint[:2] == ["python3", f"{checkout.miles}/train.py"], entrypoint[:2]
    job_env = {
        name: launch_env[name] if value == REDACTED else value  # the secret the driver sends
        for name, value in printed["job"]["runtime_env"]["env_vars"].items()
    }
    parse_env = {
        **{k: env[k] for k in PASSTHROUGH_ENV if k in env},
        **printed["process_env"],
        **job_env,
    }
    parse_env["PYTHONPATH"] = checkout.parse_pythonpath(job_env["PYTHONPATH"])
    return Job(printed["recipe"], entrypoint[2:], parse_env)


def parse_all(checkout: MilesCheckout, jobs: Mapping[str, Job]) -> dict[str, ParseOutcome]:
    """Every job's parse, concurrently (one worker per CPU); GPU queries stubbed."""

    def parse(job: Job) -> ParseOutcome:
        return parse_with_miles(job.train_argv, job.env, python=checkout.python, gpu_stubs=True)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = {name: pool.submit(parse, job) for name, job in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


def expected_values(job: Job) -> dict[str, Any]:
    """What ``train()`` must receive for this job, derived from the resolved recipe and env."""
    r = job.recipe
    same_name = (
        "lora_rank", "lora_alpha", "lora_dropout", "num_rollout", "rollout_batch_size",
        "n_samples_per_prompt", "global_batch_size", "rollout_max_response_len", "lr",
        "tensor_model_parallel_size", "rollout_num_gpus_per_engine",
        "sglang_mem_fraction_static", "sglang_max_lora_rank", "sglang_lora_backend",
        "sglang_moe_runner_backend", "sglang_attention_backend",
        "sglang_lora_use_virtual_experts", "lora_base_cpu_backup", "qkv_format",
        "use_dynamic_batch_size", "use_wandb",
    )  # fmt: skip
    expected: dict[str, Any] = {name: r[name] for name in same_name}
    expected.update(
        target_modules=list(r["target_modules"]),  # miles splits the CSV into a list
        hf_checkpoint=f"{r['model_dir']}/gpt-oss-20b-bf16",
        prompt_data=f"{r['data_dir']}/dapo-math-17k/dapo-math-17k.jsonl",
        actor_num_gpus_per_node=r["num_gpus"],
        num_gpus_per_node=r["num_gpus"],
        colocate=True,  # the recipe always colocates trainer and rollout
        use_tensorboard=r["capture_metrics"],  # the dir is TENSORBOARD_DIR, read by the writer
        ci_enable_metrics_capture=bool(job.env.get(CI_RECORD_ENV)),
    )
    if r["use_wandb"]:
        expected.update(
            wandb_project=r["wandb_project"],
            wandb_group=r["wandb_group"],
            wandb_random_suffix=False,  # --disable-wandb-random-suffix
        )
    expected.update(extra_arg_values(r["extra_args"]))
    return expected


def extra_arg_values(extra_args: str) -> dict[str, str]:
    """``--flag value`` pairs of the extra args, by namespace name, values as written."""
    tokens = shlex.split(extra_args)
    return {
        flag[2:].replace("-", "_"): value
        for flag, value in itertools.pairwise(tokens)
        if flag.startswith("--") and not value.startswith("--")
    }


def mismatches(expected: Mapping[str, Any], parsed: Mapping[str, Any]) -> dict[str, Any]:
    """``{name: (expected, parsed)}`` for every value that differs (extra-arg strings compare
    with the parsed value's ``str``)."""
    out = {}
    for name, want in expected.items():
        got = parsed.get(name, "<absent>")
        same = (
            str(got) == want if isinstance(want, str) and not isinstance(got, str) else got == want
        )
        if not same:
            out[name] = (want, got)
    return out
