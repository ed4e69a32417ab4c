"""Snapshots of what the launcher would run: one flag per line, so a diff names the flag.

Each case builds a plan from a recipe and a fixed environment (never the test machine's),
and stores the job's entrypoint, its runtime env and the steps. Update with
``pytest -m snapshot --snapshot-update`` and review the diff like code.
"""

from __future__ import annotations

import pytest

from miles_amd.recipe.plan import LaunchPlan, build_prepare_plan, build_train_plan
from miles_amd.recipe.settings import Hardware, Recipe

pytestmark = pytest.mark.snapshot

BASE_ENV = {"PATH": "/usr/bin"}
SECRET = "wandb-secret-value-0123456789"


def one_flag_per_line(argv: list[str]) -> list[str]:
    lines: list[str] = []
    for token in argv:
        if token.startswith("--") or not lines:
            lines.append(token)
        else:
            lines[-1] += f" {token}"
    return lines


def view(plan: LaunchPlan) -> dict[str, object]:
    printed = plan.to_dict()
    job = printed["job"]
    return {
        "steps": [
            f"{s['name']}: {' '.join(s['argv'])}" for s in printed["steps"] if s["name"] != "submit"
        ],
        "entrypoint": one_flag_per_line(job["entrypoint"]) if job else None,
        "runtime_env": job["runtime_env"]["env_vars"] if job else None,
        "process_env": printed["process_env"],
    }


CASES = {
    "default_mi355x": (Recipe(), BASE_ENV, None),
    "mi350x": (Recipe(hardware=Hardware.MI350X), BASE_ENV, None),
    "custom_dirs": (
        Recipe(
            model_dir="/data/models",
            data_dir="/data/sets",
            miles_dir="/src/miles",
            megatron_dir="/src/Megatron-LM",
        ),
        {**BASE_ENV, "PYTHONPATH": "/opt/extra"},
        None,
    ),
    "rollouts_3": (Recipe(num_rollout=3), BASE_ENV, None),
    "extra_args": (Recipe(extra_args="--seed 1234 --log-probs-chunk-size 512"), BASE_ENV, None),
    "override_pinned": (
        Recipe(extra_args="--sglang-mem-fraction-static 0.3", override_pinned=True),
        BASE_ENV,
        None,
    ),
    "wandb": (Recipe(), {**BASE_ENV, "WANDB_API_KEY": SECRET}, None),
    "external_ray": (Recipe(), {**BASE_ENV, "RAY_ADDRESS": "http://10.0.0.5:8265"}, None),
    "hip_visible_devices": (Recipe(), {**BASE_ENV, "HIP_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, None),
    "with_run_dir": (Recipe(), BASE_ENV, "/runs/r1"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_train_plan(case: str, snapshot) -> None:
    recipe, env, run_dir = CASES[case]
    plan = build_train_plan(recipe, env, run_dir=run_dir)
    assert view(plan) == snapshot


def test_prepare_plan(snapshot) -> None:
    plan = build_prepare_plan(Recipe(model_dir="/data/models", data_dir="/data/sets"))
    assert view(plan) == snapshot


def test_wandb_key_reaches_the_job_by_inheritance_from_the_own_head() -> None:
    plan = build_train_plan(Recipe(), {**BASE_ENV, "WANDB_API_KEY": SECRET})
    assert SECRET not in repr(plan.to_dict()) + repr(plan)
    assert SECRET not in " ".join(plan.job.entrypoint)
    assert plan.head_env()["WANDB_API_KEY"] == SECRET
    assert SECRET not in repr(plan.job.runtime_env())
    assert "--use-wandb" in plan.job.entrypoint


def test_wandb_key_travels_in_the_runtime_env_to_a_ray_address_cluster() -> None:
    env = {**BASE_ENV, "WANDB_API_KEY": SECRET, "RAY_ADDRESS": "http://10.0.0.5:8265"}
    plan = build_train_plan(Recipe(), env)
    assert SECRET not in repr(plan.to_dict()) + repr(plan)
    assert plan.job.runtime_env()["env_vars"]["WANDB_API_KEY"] == SECRET
    assert "WANDB_API_KEY" not in plan.head_env()
