"""The recipe's declared shapes: ``train --shape`` plans them, a run's shape reads back."""

from __future__ import annotations

import json

import pytest

from miles_amd.recipe.settings import SHAPES, shape_of
from miles_amd.run.preflight import PreflightConfig
from miles_amd.run.probes import probe_gpu_model
from tests.cli_runs import run_cli

pytestmark = pytest.mark.unit


def test_a_shape_sets_defaults_its_flags_override() -> None:
    """The 4gpu recipe itself: the ``shape_4gpu`` dry-run snapshot."""
    done = run_cli("train", "--dry-run", "--json", "--shape", "4gpu", "--num-rollouts", "3")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["recipe"]["num_rollout"] == 3


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
