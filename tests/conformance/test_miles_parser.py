"""miles' real ``parse_args`` accepts every argv ``miles-amd train`` plans for the snapshot
suite's ``train`` variants, hands ``train()`` the values the recipe means, and refuses the
negative controls with its own message (docs/conformance.md, "What it proves")."""

from __future__ import annotations

import itertools
import json
import shlex
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from miles_amd.recipe.settings import Recipe
from miles_amd.run.probes_miles import ParseOutcome
from tests.conformance import harness
from tests.conformance.conftest import UNKNOWN_FLAGS, parses
from tests.snapshot.test_dry_run import SECRET

pytestmark = [pytest.mark.conformance, pytest.mark.xdist_group("miles-parse")]

CHANGING = ("default", "rollouts_3", "extra_args", "override_pinned", "wandb")  # argv differs
# Set by the test or the plan, not the variant: the dirs, and a run dir's / W&B key's switches.
NOT_FROM_THE_VARIANT = (*harness.DIR_FIELDS, "capture_metrics", "use_wandb")
SAME_NAME = (
    "lora_rank", "lora_alpha", "lora_dropout", "num_rollout", "rollout_batch_size",
    "n_samples_per_prompt", "global_batch_size", "rollout_max_response_len", "lr",
    "tensor_model_parallel_size", "rollout_num_gpus_per_engine", "sglang_mem_fraction_static",
    "sglang_max_lora_rank", "sglang_lora_backend", "sglang_moe_runner_backend",
    "sglang_attention_backend", "sglang_lora_use_virtual_experts", "lora_base_cpu_backup",
    "qkv_format", "use_dynamic_batch_size", "use_wandb",
)  # fmt: skip
REFUSALS = {  # job -> (exit status, the parser's or validator's message)
    **{f"unknown:{t}": (2, f"unrecognized arguments: {t}") for t in UNKNOWN_FLAGS},
    "no-cuda-device-max-connections": (1, "CUDA_DEVICE_MAX_CONNECTIONS to 1"),
    "wrong-checkpoint-config": (
        1,
        "num_hidden_layers in hf config 36 is not equal to num_layers 24",
    ),
}


def _why(outcome: ParseOutcome) -> str:
    return f"exit {outcome.returncode}: {outcome.message}\n{outcome.stderr[-3000:]}"


def expected_values(job: harness.Job) -> dict[str, Any]:
    """What ``train()`` must receive for this job, from the resolved recipe and env."""
    r = job.recipe
    expected: dict[str, Any] = {name: r[name] for name in SAME_NAME}
    expected.update(
        target_modules=list(r["target_modules"]),  # miles splits the CSV into a list
        hf_checkpoint=f"{r['model_dir']}/gpt-oss-20b-bf16",
        prompt_data=f"{r['data_dir']}/dapo-math-17k/dapo-math-17k.jsonl",
        actor_num_gpus_per_node=r["num_gpus"],
        num_gpus_per_node=r["num_gpus"],
        colocate=True,
        use_tensorboard=r["capture_metrics"],  # the dir is TENSORBOARD_DIR, read by the writer
        ci_enable_metrics_capture=bool(job.env.get(harness.CI_RECORD_ENV)),
    )
    if r["use_wandb"]:
        expected.update(
            wandb_project=r["wandb_project"],
            wandb_group=r["wandb_group"],
            wandb_random_suffix=False,  # --disable-wandb-random-suffix
        )
    tokens = shlex.split(r["extra_args"])  # --flag value pairs, values as written
    expected.update(
        {
            flag[2:].replace("-", "_"): value
            for flag, value in itertools.pairwise(tokens)
            if flag.startswith("--") and not value.startswith("--")
        }
    )
    return expected


def mismatches(expected: dict[str, Any], parsed: dict[str, Any]) -> dict[str, Any]:
    """``{name: (expected, parsed)}`` for each value that differs (an extra arg's string
    compares with the parsed value's ``str``)."""
    out = {}
    for name, want in expected.items():
        got = parsed.get(name, "<absent>")
        if (str(got) if isinstance(want, str) else got) != want:
            out[name] = (want, got)
    return out


@pytest.mark.parametrize("case", sorted(harness.TRAIN_CASES))
@parses("variant:{case}")
def test_real_miles_parses_the_planned_argv(
    case: str, jobs: dict[str, harness.Job], parse_run: harness.ParseRun
) -> None:
    job, outcome = jobs[f"variant:{case}"], parse_run.outcomes[f"variant:{case}"]
    differ = {  # the job parsed is the snapshot case's recipe, planned by the real CLI
        key: (value, job.recipe[key])
        for key, value in harness.snapshot_recipe(case).items()
        if key not in NOT_FROM_THE_VARIANT and job.recipe[key] != value
    }
    assert differ == {}
    assert outcome.ok and outcome.args is not None, _why(outcome)
    assert mismatches(expected_values(job), outcome.args) == {}
    assert SECRET not in json.dumps(outcome.args)  # a W&B key travels in the env only


@parses(*(f"variant:{case}" for case in CHANGING), "no-ci-record-env")
def test_the_variants_change_what_they_mean(
    jobs: dict[str, harness.Job], parse_run: harness.ParseRun
) -> None:
    args = {case: parse_run.outcomes[f"variant:{case}"].args or {} for case in CHANGING}
    default = args["default"]
    assert default["num_rollout"] == Recipe().num_rollout
    assert args["rollouts_3"]["num_rollout"] == 3
    assert (args["extra_args"]["seed"], args["extra_args"]["log_probs_chunk_size"]) == (1234, 512)
    assert default["sglang_mem_fraction_static"] == Recipe().sglang_mem_fraction_static
    assert args["override_pinned"]["sglang_mem_fraction_static"] == 0.3
    assert (default["use_wandb"], args["wandb"]["use_wandb"]) == (False, True)
    assert args["wandb"]["wandb_key"] is None
    assert default["use_tensorboard"] and default["ci_enable_metrics_capture"]
    # CI-history capture follows MILES_CI_GATE_RECORD_DIR alone
    assert harness.CI_RECORD_ENV in jobs["variant:default"].env
    without = parse_run.outcomes["no-ci-record-env"]
    assert without.ok and without.args is not None, _why(without)
    assert without.args["ci_enable_metrics_capture"] is False


@pytest.mark.parametrize("job", sorted(REFUSALS))
@parses("{job}")
def test_a_control_is_refused_with_its_message(job: str, parse_run: harness.ParseRun) -> None:
    outcome, (returncode, message) = parse_run.outcomes[job], REFUSALS[job]
    assert outcome.returncode == returncode, _why(outcome)
    assert message == outcome.message if returncode == 2 else message in outcome.message


@parses(*(f"variant:{case}" for case in harness.TRAIN_CASES), "unknown:--no-such-flag")
def test_a_forked_parse_reads_as_a_fresh_interpreters(
    checkout: harness.MilesCheckout, jobs: dict[str, harness.Job], parse_run: harness.ParseRun
) -> None:
    """For the accepted job that sets most keys beyond its batch's import env, and a refusal."""
    accepted = sorted(n for n in parse_run.forked if parse_run.outcomes[n].ok)
    assert accepted and "unknown:--no-such-flag" in parse_run.forked, parse_run.forked
    names = (max(accepted, key=lambda n: len(parse_run.forked[n])), "unknown:--no-such-flag")
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        fresh = dict(
            zip(
                names,
                pool.map(lambda n: harness.parse_fresh(checkout, jobs[n]), names),
                strict=True,
            )
        )
    for name in names:
        forked = parse_run.outcomes[name]
        assert (forked.returncode, forked.message) == (fresh[name].returncode, fresh[name].message)
        assert forked.args == fresh[name].args, name
