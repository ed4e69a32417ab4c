"""The recipe's declared shapes: ``train --shape`` plans them, and a run's shape reads back."""

from __future__ import annotations

import json

import pytest

from miles_amd.recipe.settings import SHAPES, shape_of
from miles_amd.run.preflight import PreflightConfig
from miles_amd.run.probes import probe_gpu_model
from tests.cli_runs import run_cli

pytestmark = pytest.mark.unit


def planned(*args: str) -> dict:
    done = run_cli("train", "--dry-run", "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["recipe"]


def test_the_4gpu_shape_is_one_tp4_engine_beside_the_tp4_trainer_for_2_rollouts() -> None:
    recipe, default = planned("--shape", "4gpu"), planned()
    assert (recipe["num_gpus"], recipe["num_rollout"]) == (4, 2)
    assert recipe["tensor_model_parallel_size"] == recipe["rollout_num_gpus_per_engine"] == 4
    changed = {k for k in recipe if recipe[k] != default[k]}
    assert changed == {"num_gpus", "num_rollout"}  # the recipe otherwise unchanged
    assert planned("--shape", "4gpu", "--num-rollouts", "3")["num_rollout"] == 3


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--shape", "4gpu", "--num-gpus", "2"), "--shape 4gpu runs on 4 GPUs, --num-gpus says 2"),
        (("--shape", "3gpu"), "--shape 3gpu: unknown shape; fix: use one of 8gpu, 4gpu"),
    ],
)
def test_a_shape_the_flags_contradict_is_refused(args: tuple[str, ...], expected: str) -> None:
    done = run_cli("train", "--dry-run", *args)
    assert done.returncode == 2 and expected in done.stderr, done.stderr


def test_a_runs_shape_is_read_back_from_its_gpu_count() -> None:
    assert [shape_of(s.num_gpus) for s in SHAPES.values()] == list(SHAPES)
    assert shape_of(2) == "2gpu"


def test_the_preflight_names_the_gpu_model_the_rocm_tools_print(tmp_path) -> None:
    config = PreflightConfig(tmp_path, tmp_path, tmp_path, tmp_path, tmp_path)
    asic = '{"gpu_data": [{"asic": {"market_name": "AMD Instinct MI350X"}}]}'
    found = probe_gpu_model(config, runner=lambda argv: asic if argv[0] == "amd-smi" else None)
    assert (found.name, found.status, found.value) == ("gpu_model", "ok", "MI350X")
    missing = probe_gpu_model(config, runner=lambda argv: None)
    assert (missing.status, missing.value) == ("missing", "")
    assert "no MI355X/MI350X GPU found" in missing.message
