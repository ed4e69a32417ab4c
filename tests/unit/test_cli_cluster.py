"""``train --ray-address`` and ``--variants`` through the CLI's own entry (in-process), dry-run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from miles_amd.recipe.plan import NODE_RESOURCE
from miles_amd.run.variants_run import PATCHED_DIR_VAR
from tests.cli_runs import run_cli

pytestmark = pytest.mark.unit

ADDRESS = "http://10.0.0.5:8265"


def env_without_cluster() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", PATCHED_DIR_VAR)}


def test_ray_address_flag_makes_a_cluster_plan(tmp_path: Path) -> None:
    args = ["train", "--dry-run", "--json", "--ray-address", ADDRESS, "--run-dir", str(tmp_path)]
    done = run_cli(*args, env=env_without_cluster())
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["ray_address"] == ADDRESS
    assert plan["job"]["entrypoint_resources"] == {NODE_RESOURCE: 1.0}
    assert plan["node_run_dir"].startswith(f"/tmp/miles_amd_runs/{tmp_path.name}-")
    assert plan["job"]["runtime_env"]["env_vars"]["TENSORBOARD_DIR"].startswith(
        plan["node_run_dir"]
    )


def test_variants_dry_run_has_one_plan_per_variant(tmp_path: Path) -> None:
    env = {**env_without_cluster(), PATCHED_DIR_VAR: "/opt/aiter-5694"}
    args = ["--variants", "stock,patched", "--ray-address", ADDRESS, "--run-dir", str(tmp_path)]
    done = run_cli("train", "--dry-run", "--json", *args, env=env)
    assert done.returncode == 0, done.stderr
    plans = json.loads(done.stdout)
    assert set(plans) == {"stock", "patched"}
    assert plans["stock"]["run_dir"] == str(tmp_path / "stock")
    paths = {v: p["job"]["runtime_env"]["env_vars"]["PYTHONPATH"] for v, p in plans.items()}
    assert "/opt/aiter-5694" in paths["patched"].split(":")
    assert "/opt/aiter-5694" not in paths["stock"]


@pytest.mark.parametrize(
    ("args", "extra_env", "needle"),
    [
        (["--variants", "stock,patched"], {}, "--variants needs a Ray cluster"),
        (["--variants", "stock,fast", "--ray-address", ADDRESS], {}, "--variants stock,fast"),
        (["--variants", "stock,stock", "--ray-address", ADDRESS], {}, "distinct names"),
        (["--variants", "patched", "--ray-address", ADDRESS], {}, f"{PATCHED_DIR_VAR} is not set"),
        (
            ["--variants", "stock", "--gate", "stock", "--ray-address", ADDRESS],
            {},
            "drop --gate",
        ),
    ],
)
def test_variants_bad_input_exits_2(args: list[str], extra_env: dict, needle: str) -> None:
    done = run_cli("train", "--dry-run", *args, env={**env_without_cluster(), **extra_env})
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert needle in done.stderr and len(done.stderr.strip().splitlines()) == 1
