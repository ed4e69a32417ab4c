"""The ``miles-amd`` CLI as a user runs it: real subprocesses, real exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_runs import run_cli
from tests.unit.test_recipe import RECIPE_MD_MODEL_ARGS, RECIPE_MD_TRAIN_ARGS

HEAVY = ("ray", "torch", "tensorboard", "matplotlib")


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=env)


def test_dry_run_json_contract_model_args_first(tmp_path: Path) -> None:
    done = cli("train", "--dry-run", "--json", "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert set(plan) >= {"recipe", "steps", "job"}
    entry = plan["job"]["entrypoint"]
    assert entry[:2] == ["python3", "/root/miles/train.py"]
    model, train = RECIPE_MD_MODEL_ARGS.split(), RECIPE_MD_TRAIN_ARGS.split()
    assert entry[2 : 2 + len(model)] == model
    # The driver's evidence flags ride along; everything else is RECIPE.md verbatim.
    capture = ["--use-tensorboard"]  # CI history is switched on by env, not a flag
    assert [t for t in entry[2 + len(model) :] if t not in capture] == train
    env = plan["job"]["runtime_env"]["env_vars"]
    assert env["TENSORBOARD_DIR"] == f"{tmp_path / 'run'}/tensorboard"
    assert env["MILES_CI_GATE_RECORD_DIR"] == f"{tmp_path / 'run'}/ci_history"
    assert plan["recipe"]["hardware"] == "MI355X" and plan["recipe"]["num_rollout"] == 20
    assert [s["name"] for s in plan["steps"]] == ["cleanup", "ray-start", "submit"]


def test_dry_run_prints_wandb_key_redacted() -> None:
    import os

    secret = "wk-0123456789abcdef"
    env = {**os.environ, "WANDB_API_KEY": secret}
    for extra in ([], ["--json"]):
        done = cli("train", "--dry-run", *extra, env=env)
        assert done.returncode == 0, done.stderr
        assert secret not in done.stdout + done.stderr
        assert "WANDB_API_KEY" in done.stdout and "<redacted>" in done.stdout


def test_full_train_dry_run_lists_downloads_then_the_job() -> None:
    done = cli("full-train", "--dry-run", "--json", "--num-rollout", "3")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    names = [s["name"] for s in plan["steps"]]
    assert names[:2] == ["download-checkpoint", "download-dataset"] and names[-1] == "submit"
    assert "--num-rollout" in plan["job"]["entrypoint"]
    assert plan["job"]["entrypoint"][plan["job"]["entrypoint"].index("--num-rollout") + 1] == "3"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["train", "--dry-run", "--hardware", "H100"], "--hardware H100"),
        (["train", "--dry-run", "--hardware", "auto"], "--hardware auto"),
        (["train", "--dry-run", "--num-gpus", "6"], "--num-gpus 6: not divisible"),
        (["train", "--dry-run", "--extra-args", "--lr 1"], "--override-pinned"),
    ],
)
def test_bad_flags_fail_with_one_line(args: list[str], needle: str) -> None:
    done = cli(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], done.stderr


def write_checkpoint(model_dir: Path, *, mxfp4: bool) -> None:
    ckpt = model_dir / "gpt-oss-20b-bf16"
    ckpt.mkdir(parents=True)
    config: dict[str, object] = {"architectures": ["GptOssForCausalLM"]}
    if mxfp4:
        config["quantization_config"] = {"quant_method": "mxfp4"}
    (ckpt / "config.json").write_text(json.dumps(config))
    (ckpt / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "model-00001-of-00001.safetensors"}})
    )
    header = json.dumps({"w": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}}).encode()
    shard = len(header).to_bytes(8, "little") + header + b"\0\0"  # the safetensors layout
    (ckpt / "model-00001-of-00001.safetensors").write_bytes(shard)


def test_train_refuses_an_mxfp4_checkpoint(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "models", mxfp4=True)
    done = cli("train", "--model-dir", str(tmp_path / "models"), "--run-dir", str(tmp_path / "r"))
    assert done.returncode == 2
    assert "--model-dir" in done.stderr and "mxfp4" in done.stderr.lower()
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists(), "nothing half-written on bad input"


def test_train_refuses_a_missing_dataset(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "models", mxfp4=False)
    done = cli(
        "train",
        "--model-dir",
        str(tmp_path / "models"),
        "--data-dir",
        str(tmp_path / "data"),
        "--run-dir",
        str(tmp_path / "r"),
    )
    assert done.returncode == 2
    assert "--data-dir" in done.stderr and "dapo-math-17k.jsonl" in done.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.snapshot
def test_planning_imports_no_heavy_module() -> None:
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from miles_amd.cli.main import app\n"
        "r = CliRunner().invoke(app, ['train', '--dry-run', '--json'])\n"
        "assert r.exit_code == 0, r.output\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"heavy modules imported: {done.stdout}"
