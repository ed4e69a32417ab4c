"""What a user sees from ``miles-amd <command> --dry-run`` (and ``--json``), one file per variant.

The real CLI in-process, in a fixed environment (only ``PATH`` plus the case's variables, in
``/``), stdout stored byte for byte under ``__snapshots__/test_dry_run/`` (``.txt``: one flag
per line; ``.json``: one argv token per line). Update with ``pytest -m snapshot
--snapshot-update`` and review the diff like code.
"""

from __future__ import annotations

import os
import re

import pytest
from syrupy.assertion import SnapshotAssertion
from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode
from typer.testing import CliRunner

from miles_amd.cli.main import app
from miles_amd.recipe.plan import build_train_plan
from miles_amd.recipe.settings import Recipe

BASE_ENV = {"PATH": "/usr/bin"}
NODE_RUN_ID = re.compile(r"(/miles_amd_runs/[\w.-]+?)-[0-9a-f]{8}\b")
SECRET = "wandb-secret-value-0123456789"

PATCHED, PATCHED_DIR = "AITER_PATCHED_DIR", "/opt/aiter-5694"
CUSTOM_DIRS = (
    "--model-dir", "/data/models",
    "--data-dir", "/data/sets",
    "--miles-dir", "/src/miles",
    "--megatron-dir", "/src/Megatron-LM",
)  # fmt: skip
# variant -> (command line before --dry-run, environment variables beside PATH)
CASES: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "default": (("train",), {}),
    "mi350x": (("train", "--hardware", "MI350X"), {}),
    "custom_dirs": (("train", *CUSTOM_DIRS), {"PYTHONPATH": "/opt/extra"}),
    "rollouts_3": (("train", "--num-rollout", "3"), {}),
    "extra_args": (("train", "--extra-args", "--seed 1234 --log-probs-chunk-size 512"), {}),
    "override_pinned": (
        ("train", "--extra-args", "--sglang-mem-fraction-static 0.3", "--override-pinned"),
        {},
    ),
    "wandb": (("train",), {"WANDB_API_KEY": SECRET}),
    "external_ray": (("train",), {"RAY_ADDRESS": "http://10.0.0.5:8265"}),
    "hip_visible_devices": (("train",), {"HIP_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}),
    "run_dir": (("train", "--run-dir", "/runs/r1"), {}),
    "prepare": (("prepare", "--model-dir", "/data/models", "--data-dir", "/data/sets"), {}),
    "full_train": (("full-train",), {}),
    "aiter_stock": (("train", "--aiter-variant", "stock"), {}),
    "aiter_patched": (("train", "--aiter-variant", "patched"), {}),
    "aiter_patched_dir": (("train", "--aiter-variant", "patched"), {PATCHED: PATCHED_DIR}),
    "aiter_stock_patched_dir": (("train", "--aiter-variant", "stock"), {PATCHED: PATCHED_DIR}),
    "aiter_rccl": (("train", "--aiter-variant", "rccl"), {}),
    # the per-PR smoke's shape (recipe.settings.SHAPES): one TP-4 engine beside the TP-4 trainer
    "shape_4gpu": (("train", "--shape", "4gpu", "--aiter-variant", "patched"), {}),
}


class TextSnapshot(SingleFileSnapshotExtension):
    """One plain-text file per snapshot, stored exactly as printed."""

    _write_mode = WriteMode.TEXT
    file_extension = "txt"


class JsonTextSnapshot(TextSnapshot):
    """``--json`` output, stored as printed (so a reviewer's tools highlight it as JSON)."""

    file_extension = "json"


def dry_run(case: str, *extra: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The stdout of ``miles-amd <case's args> --dry-run <extra>`` in the fixed environment."""
    args, env = CASES[case]
    for name in list(os.environ):
        monkeypatch.delenv(name)
    for name, value in {**BASE_ENV, **env}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir("/")
    result = CliRunner().invoke(app, [*args, "--dry-run", *extra])
    assert result.exit_code == 0, result.output
    # A cluster run's node-side dir ends in a fresh random run id (recipe.plan.node_run_dir):
    # the one part of the plan that differs between two identical commands.
    return NODE_RUN_ID.sub(r"\1-<run-id>", result.stdout)


@pytest.mark.parametrize("case", sorted(CASES))
def test_dry_run_text(
    case: str, snapshot: SnapshotAssertion, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert dry_run(case, monkeypatch=monkeypatch) == snapshot.use_extension(TextSnapshot)


@pytest.mark.parametrize("case", sorted(CASES))
def test_dry_run_json(
    case: str, snapshot: SnapshotAssertion, monkeypatch: pytest.MonkeyPatch
) -> None:
    printed = dry_run(case, "--json", monkeypatch=monkeypatch)
    assert printed == snapshot.use_extension(JsonTextSnapshot)


def test_wandb_key_reaches_the_job_by_inheritance_from_the_own_head() -> None:
    plan = build_train_plan(Recipe(), {**BASE_ENV, "WANDB_API_KEY": SECRET})
    job = plan.job
    assert job is not None
    assert SECRET not in repr(plan.to_dict()) + repr(plan)
    assert SECRET not in " ".join(job.entrypoint)
    assert plan.head_env()["WANDB_API_KEY"] == SECRET
    assert SECRET not in repr(job.runtime_env())
    assert "--use-wandb" in job.entrypoint


def test_wandb_key_travels_in_the_runtime_env_to_a_ray_address_cluster() -> None:
    env = {**BASE_ENV, "WANDB_API_KEY": SECRET, "RAY_ADDRESS": "http://10.0.0.5:8265"}
    plan = build_train_plan(Recipe(), env)
    job = plan.job
    assert job is not None
    assert SECRET not in repr(plan.to_dict()) + repr(plan)
    env_vars = job.runtime_env()["env_vars"]
    assert isinstance(env_vars, dict) and env_vars["WANDB_API_KEY"] == SECRET
    assert "WANDB_API_KEY" not in plan.head_env()


def test_the_patched_builds_dir_reaches_every_process_of_a_patched_run_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``AITER_PATCHED_DIR`` is on the PYTHONPATH of the preflight's probes, the canary and the
    job of a patched run (``variants.aiter_pythonpath``), and of no stock run."""
    patched = dry_run("aiter_patched_dir", monkeypatch=monkeypatch)
    job_path = f"PYTHONPATH=/root/miles:/root/Megatron-LM:{PATCHED_DIR}"
    assert f"  {job_path}\n" in patched  # the job's runtime env
    assert f"  job: {job_path}\n" in patched and f"  preflight: {job_path}\n" in patched
    assert f"  canary: PYTHONPATH={PATCHED_DIR}\n" in patched
    assert PATCHED_DIR not in dry_run("aiter_stock_patched_dir", monkeypatch=monkeypatch)
