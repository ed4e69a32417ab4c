"""Plan a launcher variant with the real CLI, then parse its argv with miles' real parser.

Planning is ``miles-amd train --dry-run --json`` run in-process (typer's ``CliRunner``) with
``os.environ`` replaced by exactly the variant's environment for the call, so nothing of the
test machine's shell (a ``WANDB_API_KEY``, a ``RAY_ADDRESS``) changes the plan. The parse
is ``miles_amd.run.probes_miles.parse_with_miles``: a subprocess of the checkout's python
running ``miles_parse.py`` on the plan's ``train.py`` argv, in the env the driver submits
(the launching env's ``PATH``/``HOME``/locale, the plan's device env, the job's runtime
env with its secrets).

Variants come from the snapshot suite's ``CASES`` (:data:`TRAIN_CASES`: every ``train``
case, its flags with the dir flags taken out, since the tier supplies its own fake inputs and
checkout), so a variant added there is checked here too.

A fresh interpreter per parse costs about 13 CPU-s, nearly all imports (torch, sglang,
Megatron), and a parse cannot share an interpreter with another: ``parse_args`` reads
``sys.argv`` and ``os.environ``, configures logging, and Megatron keeps global args. So
:func:`parse_all` imports miles once per import path and forks a child per job
(``parse_batch.py`` says when a fork is the same as a fresh interpreter, and which jobs it
sends back to one).

Explained for people in ``docs/conformance.md``.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from miles_amd.cli.main import app
from miles_amd.recipe.plan import REDACTED
from miles_amd.run.probes_miles import (
    PARSE_TIMEOUT_S,
    SCRIPT,
    ParseOutcome,
    parse_with_miles,
    read_outcome,
)
from tests.conformance.checkout import MilesCheckout
from tests.snapshot.test_dry_run import CASES as SNAPSHOT_CASES

BATCH = Path(__file__).resolve().with_name("parse_batch.py")
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


# A forked parse takes 2-3 s; a child still running after this is parsed afresh instead.
FORK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ParseRun:
    """Every parse of a session: the outcomes by job; for each forked job the env keys it set
    beyond its batch's import env; for each job a batch sent back, why."""

    outcomes: dict[str, ParseOutcome]
    forked: dict[str, set[str]]
    sent_back: dict[str, str]


def import_env(group: Mapping[str, Job]) -> dict[str, str]:
    """The keys every job of ``group`` has, with the value all of them give it."""
    first, *rest = group.values()
    return {k: v for k, v in first.env.items() if all(job.env.get(k) == v for job in rest)}


def parse_fresh(checkout: MilesCheckout, job: Job) -> ParseOutcome:
    """``job``'s parse in a fresh interpreter, as the preflight's probe runs it on a node."""
    return parse_with_miles(job.train_argv, job.env, python=checkout.python, gpu_stubs=True)


def parse_batch(checkout: MilesCheckout, group: Mapping[str, Job]) -> ParseRun | None:
    """``parse_batch.py`` on ``group``: miles imported once, a forked child per job. None
    when the import failed; a job it sends back is in ``sent_back``, not in the outcomes."""
    shared = import_env(group)
    with tempfile.TemporaryDirectory(prefix="miles-parse-batch-") as tmp:
        files = {name: Path(tmp, str(i)) for i, name in enumerate(group)}
        spec = {
            "miles_parse": str(SCRIPT),
            "stub_gpu_queries": True,
            "workers": os.cpu_count() or 1,
            "fork_timeout_s": min(FORK_TIMEOUT_S, PARSE_TIMEOUT_S),
            "jobs": [
                {
                    "argv": job.train_argv,
                    "env": job.env,
                    "result": f"{files[name]}.json",
                    "stderr": f"{files[name]}.stderr",
                    "status": f"{files[name]}.status",
                }
                for name, job in group.items()
            ],
        }
        Path(tmp, "spec.json").write_text(json.dumps(spec))
        done = subprocess.run(
            [str(checkout.python), str(BATCH), str(Path(tmp, "spec.json"))],
            env=shared,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PARSE_TIMEOUT_S + len(group) * FORK_TIMEOUT_S,
        )
        if done.returncode != 0:
            return None
        outcomes, forked, sent_back = {}, {}, {}
        for name, stem in files.items():
            status = json.loads(Path(f"{stem}.status").read_text())
            if status["fresh_because"] is not None:
                sent_back[name] = status["fresh_because"]
                continue
            stderr = Path(f"{stem}.stderr").read_text(errors="replace")
            outcomes[name] = read_outcome(
                status["returncode"], Path(f"{stem}.json"), stderr, status["seconds"]
            )
            forked[name] = set(group[name].env) - set(shared)
    return ParseRun(outcomes, forked, sent_back)


def parse_all(checkout: MilesCheckout, jobs: Mapping[str, Job]) -> ParseRun:
    """Every job's parse, GPU queries stubbed. Jobs that share a ``PYTHONPATH`` (the import
    path miles is found on) are parsed in one batch; a job alone on its path, one the batch
    sends back, or all of a batch whose import failed, in a fresh interpreter each (one
    worker per CPU)."""
    groups: dict[str, dict[str, Job]] = {}
    for name, job in jobs.items():
        groups.setdefault(job.env.get("PYTHONPATH", ""), {})[name] = job
    outcomes: dict[str, ParseOutcome] = {}
    forked: dict[str, set[str]] = {}
    sent_back: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        alone = [group for group in groups.values() if len(group) == 1]
        singles = {n: pool.submit(parse_fresh, checkout, j) for g in alone for n, j in g.items()}
        for group in (group for group in groups.values() if len(group) > 1):
            batch = parse_batch(checkout, group)
            if batch is not None:
                outcomes.update(batch.outcomes)
                forked.update(batch.forked)
                sent_back.update(batch.sent_back)
            rest = [name for name in group if name not in outcomes]
            singles.update({n: pool.submit(parse_fresh, checkout, group[n]) for n in rest})
        outcomes.update({name: future.result() for name, future in singles.items()})
    return ParseRun(outcomes, forked, sent_back)


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
