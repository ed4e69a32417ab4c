"""What ``train``, ``full-train``, ``prepare`` and ``preflight`` plan and refuse, in process:
every bad input is one line naming the flag, exit 2, nothing started or written; the plan is
RECIPE.md's, its dirs absolute; ``prepare`` runs ``hf download``. ``full-train`` shares
``train``'s options and checks (``test_cli_reference.py``): a few cases show it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from miles_amd.recipe.settings import FIELD_FLAGS, Recipe
from tests.cli_runs import one_error_line, run_cli
from tests.unit.test_recipe import RECIPE_MD_MODEL_ARGS, RECIPE_MD_TRAIN_ARGS

# heavy libraries, and the reading and judging a command imports only when it runs
HEAVY = ("ray", "torch", "tensorboard", "matplotlib", "jsonschema", "miles_amd.judge.gate",
         "miles_amd.app.gate", "miles_amd.baseline.model", "miles_amd.evidence.load")  # fmt: skip


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


def inputs(root: Path) -> list[str]:
    """Valid inputs for a real run: only what the test changes stands between it and Ray."""
    write_checkpoint(root / "models", mxfp4=False)
    dataset = root / "data" / "dapo-math-17k" / "dapo-math-17k.jsonl"
    dataset.parent.mkdir(parents=True)
    dataset.write_text(json.dumps({"prompt": "1+1?", "label": "2"}) + "\n")
    (root / "miles").mkdir()
    (root / "miles" / "train.py").write_text("")
    return ["--model-dir", str(root / "models"), "--data-dir", str(root / "data"),
            "--miles-dir", str(root / "miles")]  # fmt: skip


def test_dry_run_json_is_recipe_md_with_the_evidence_flags(tmp_path: Path) -> None:
    done = run_cli("train", "--dry-run", "--json", "--run-dir", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    entry = plan["job"]["entrypoint"]
    assert entry[:2] == ["python3", "/root/miles/train.py"]
    model, train = RECIPE_MD_MODEL_ARGS.split(), RECIPE_MD_TRAIN_ARGS.split()
    assert entry[2 : 2 + len(model)] == model
    # the driver's evidence flag rides along (CI history is switched on by env)
    assert [t for t in entry[2 + len(model) :] if t != "--use-tensorboard"] == train
    env = plan["job"]["runtime_env"]["env_vars"]
    assert env["TENSORBOARD_DIR"] == f"{tmp_path / 'run'}/tensorboard"
    assert env["MILES_CI_GATE_RECORD_DIR"] == f"{tmp_path / 'run'}/ci_history"
    assert plan["recipe"]["hardware"] == "MI355X" and plan["recipe"]["num_rollout"] == 20
    assert [s["name"] for s in plan["steps"]] == ["cleanup", "ray-start", "submit"]
    full = json.loads(run_cli("full-train", "--dry-run", "--json", "--num-rollout", "3").stdout)
    names = [s["name"] for s in full["steps"]]
    assert names[:2] == ["download-checkpoint", "download-dataset"] and names[-1] == "submit"
    entry = full["job"]["entrypoint"]
    assert entry[entry.index("--num-rollout") + 1] == "3"


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


# (flags after `train --dry-run --run-dir R`, what the one line says)
BAD_VALUES = [
    (["--timeout", "-5"], "'--timeout'"),
    (["--timeout", "nan"], "'--timeout'"),
    (["--timeout", "1e300"], "at most 2592000"),  # past the driver's waits (time_t)
    (["--num-rollouts", "100001"], "'--num-rollouts'"),
    (["--num-rollout", "100001"], "'--num-rollout'"),
    (["--num-gpus", "99999999999999999999"], "'--num-gpus'"),
    (["--num-rollouts", "0"], "'--num-rollouts'"),
    (["--num-rollouts", "3", "--num-rollout", "4"], "--num-rollouts 3 and --num-rollout 4"),
    (["--gate", "bogus"], "--gate bogus"),
    (["--no-such-flag"], "--no-such-flag"),
    (["--hardware", "H100"], "--hardware H100"),
    (["--hardware", "auto"], "--hardware auto"),  # no AMD GPU here
    (["--num-gpus", "6"], "--num-gpus 6: not divisible"),
    (["--extra-args", "--lr 1"], "--override-pinned"),
    (["--shape", "4gpu", "--num-gpus", "2"], "--shape 4gpu runs on 4 GPUs"),
    (["--hardware"], "'--hardware'"),  # a usage error click finds
]


@pytest.mark.parametrize(("flags", "needle"), BAD_VALUES, ids=lambda v: str(v)[:40])
def test_bad_values_exit_2_naming_the_flag_before_anything(
    flags: list[str], needle: str, tmp_path: Path
) -> None:
    # --dry-run: a run that got past the checks would print a plan and exit 0
    done = run_cli("train", "--dry-run", "--run-dir", str(tmp_path / "r"), *flags)
    one_error_line(done, needle)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--aiter-variant", "foo"], ("'--aiter-variant'", "'foo' is not one of", "'rccl'")),
        (["--num-rollouts", "abc"], ("'--num-rollouts'", "valid integer")),
    ],
)
def test_a_bad_value_is_one_line_without_the_converters_prefix(args: list[str], needle) -> None:
    line = one_error_line(run_cli("train", "--dry-run", *args), "Invalid value for")
    assert "Value error" not in line and ".;" not in line
    assert line.endswith("; see `miles-amd train --help`") and all(n in line for n in needle)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["prepare", "--json"], "--json prints the plan and needs --dry-run"),
        (["full-train", "--json"], "--json prints the plan and needs --dry-run"),
        (["train", "--dry-run", "--run-dir", "{file}"], "--run-dir {file}: is a file"),
        (["preflight", "--run-dir", "{file}"], "--run-dir {file}: is a file"),
        (["preflight", "--run-dir", "{tmp}/r", "--num-gpus", "10"], "'--num-gpus'"),
        (["train", "--dry-run", "--gate", "{tmp}/broken.json"], "{tmp}/broken.json: line 1"),
        (["train", "--dry-run", "--extra-args", "--wandb-key SECRET-VALUE-42"], "a credential"),
        (["full-train", "--dry-run", "--extra-args", "--hf-token=SECRET-VALUE-42"], "a credential"),
        (["train", "--dry-run", "--variants", "stock"], "--ray-address"),
        (["train", "--dry-run", "--variants", "stock,bogus"], "give distinct names"),
        (["full-train", "--dry-run", "--variants", "stock"], "run `miles-amd prepare` on the"),
    ],
)
def test_bad_input_is_one_line_and_nothing_written(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    (tmp_path / "a-file").write_text("x\n")
    (tmp_path / "broken.json").write_text("{not json")
    fill = {"file": str(tmp_path / "a-file"), "tmp": str(tmp_path)}
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = run_cli(*(a.format(**fill) for a in args), env=env, cwd=tmp_path)
    line = one_error_line(done, needle.format(**fill))
    assert "SECRET-VALUE-42" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "broken.json"]
    assert (tmp_path / "a-file").read_text() == "x\n"


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        (lambda root: write_checkpoint(root / "models", mxfp4=True), "mxfp4"),
        (lambda root: write_checkpoint(root / "models", mxfp4=False), "dapo-math-17k.jsonl"),
    ],
    ids=["mxfp4 checkpoint", "no dataset"],
)
def test_a_real_run_checks_its_inputs_first(tmp_path: Path, setup, needle: str) -> None:
    setup(tmp_path)
    done = run_cli(
        "train", "--model-dir", str(tmp_path / "models"), "--data-dir", str(tmp_path / "data"),
        "--run-dir", str(tmp_path / "r"),
    )  # fmt: skip
    assert needle in one_error_line(done, "-dir ", stdout="aiter variant: not given").lower()
    assert not (tmp_path / "r").exists()


def test_a_real_run_refuses_a_bad_timeout_and_an_unreachable_cluster(tmp_path: Path) -> None:
    """Inputs valid, so only the timeout's check, then Ray's own client against a port
    nothing listens on, stand between the command and a job: one line each, exit 2."""
    args = ["train", "--run-dir", str(tmp_path / "r"), *inputs(tmp_path)]
    env = {**os.environ, "RAY_ADDRESS": "http://127.0.0.1:9"}  # nothing listens there
    one_error_line(run_cli(*args, "--timeout", "nan", env=env), "'--timeout'")
    line = one_error_line(run_cli(*args, env=env), "no Ray Jobs API at ", stdout="aiter variant")
    assert "--ray-address / RAY_ADDRESS" in line and "fix:" in line
    assert line.count("http://127.0.0.1:9") == 1, line  # Ray's repeat is dropped
    assert not (tmp_path / "r").exists()


def test_relative_dirs_go_into_the_plan_absolute(tmp_path: Path) -> None:
    done = run_cli(
        "train", "--dry-run", "--json",
        "--model-dir", "m", "--data-dir", "d/../data", "--miles-dir", "miles",
        "--megatron-dir", "./mlm", "--run-dir", "runs/r", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    entry = plan["job"]["entrypoint"]
    assert entry[1] == f"{tmp_path}/miles/train.py"
    assert entry[entry.index("--hf-checkpoint") + 1] == f"{tmp_path}/m/gpt-oss-20b-bf16"
    assert entry[entry.index("--prompt-data") + 1] == (
        f"{tmp_path}/data/dapo-math-17k/dapo-math-17k.jsonl"
    )
    env = plan["job"]["runtime_env"]["env_vars"]
    assert env["PYTHONPATH"].split(":")[:2] == [f"{tmp_path}/miles", f"{tmp_path}/mlm"]
    assert plan["run_dir"] == f"{tmp_path}/runs/r"


# A value for each recipe option (Setting.cli) and the field it must become in the plan.
RECIPE_OPTION_SAMPLES: dict[str, tuple[tuple[str, ...], object]] = {
    "hardware": (("MI350X",), "MI350X"),
    "num_gpus": (("4",), 4),
    "model_dir": (("/m",), "/m"),
    "data_dir": (("/d",), "/d"),
    "miles_dir": (("/src/miles",), "/src/miles"),
    "megatron_dir": (("/src/mlm",), "/src/mlm"),
    "num_rollout": (("3",), 3),
    "extra_args": (("--seed 7",), "--seed 7"),
    "override_pinned": ((), True),
}


@pytest.mark.parametrize("field", sorted(FIELD_FLAGS))
def test_each_declared_recipe_option_sets_its_field(field: str) -> None:
    """``Setting.cli`` of a field is an option of ``train`` that sets it."""
    values, expected = RECIPE_OPTION_SAMPLES[field]
    assert Recipe().as_dict()[field] != expected
    done = run_cli("train", "--dry-run", "--json", FIELD_FLAGS[field], *values)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["recipe"][field] == expected, field


def fake_hf(bin_dir: Path, exit_code: int) -> tuple[Path, dict[str, str]]:
    """An `hf` first on PATH that records its argv (one line per call) and exits ``exit_code``."""
    bin_dir.mkdir()
    log, script = bin_dir / "calls.txt", bin_dir / "hf"
    script.write_text(
        f"#!{sys.executable}\nimport sys\n"
        f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        f"sys.exit({exit_code})\n"
    )
    script.chmod(0o755)
    return log, {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def test_prepare_runs_hf_download_for_each_input_and_stops_at_a_failure(tmp_path: Path) -> None:
    log, env = fake_hf(tmp_path / "bin", 0)
    done = run_cli("prepare", "--model-dir", "m", "--data-dir", "d", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == [
        f"download lmsys/gpt-oss-20b-bf16 --local-dir {tmp_path}/m/gpt-oss-20b-bf16",
        "download --repo-type dataset zhuzilin/dapo-math-17k "
        f"--local-dir {tmp_path}/d/dapo-math-17k",
    ]
    log, env = fake_hf(tmp_path / "bad", 3)
    done = run_cli("prepare", "--model-dir", str(tmp_path / "m"), env=env)
    assert done.returncode == 1
    assert "download-checkpoint failed with exit code 3" in done.stderr
    assert len(log.read_text().splitlines()) == 1


@pytest.mark.skipif(
    (Path(sys.executable).parent / "hf").exists(), reason="this interpreter has its own `hf`"
)
def test_prepare_without_hf_says_what_to_install(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path / "empty-bin")}
    done = run_cli("prepare", "--model-dir", str(tmp_path / "m"), env=env)
    one_error_line(done, "pip install 'huggingface_hub>=0.34'")
    assert not (tmp_path / "m").exists()
