"""The ``miles-amd`` CLI as a user runs it: its exit codes, output and errors.

In-process through ``tests.cli_runs.run_cli`` (the console script's own entry, ``main``);
real processes only where a process is the point: a fresh interpreter's imports and the
installed console script.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import miles_amd
from tests.cli_runs import CliRun, run_cli, run_cli_process
from tests.unit.test_recipe import RECIPE_MD_MODEL_ARGS, RECIPE_MD_TRAIN_ARGS

HEAVY = ("ray", "torch", "tensorboard", "matplotlib")
SRC = Path(miles_amd.__file__).resolve().parents[1]
REPO = SRC.parent
COMMANDS = (
    ["prepare"],
    ["train"],
    ["full-train"],
    ["preflight"],
    ["gate"],
    ["baseline", "record"],
    ["baseline", "diff"],
)


def cli(*args: str, env: dict[str, str] | None = None) -> CliRun:
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


# ---- every bad input: one line naming the flag, exit 2, nothing started -----------------------


def assert_one_line_error(done: CliRun, needle: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("miles-amd: error: ") and needle in lines[0], lines[0]


@pytest.mark.parametrize("command", ["train", "full-train"])
@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--timeout", "-5"], "'--timeout'"),
        (["--timeout", "nan"], "'--timeout'"),
        (["--timeout", "inf"], "'--timeout'"),
        (["--timeout", "0"], "'--timeout'"),
        (["--timeout", "1e300"], "at most 2592000"),  # past the driver's waits (time_t)
        (["--num-rollouts", "1000000000000"], "'--num-rollouts'"),
        (["--num-rollout", "100001"], "'--num-rollout'"),
        (["--num-gpus", "99999999999999999999"], "'--num-gpus'"),
        (["--num-gpus", "0"], "'--num-gpus'"),
        (["--num-rollouts", "0"], "'--num-rollouts'"),
        (["--num-rollout", "-1"], "'--num-rollout'"),
        (["--num-rollouts", "3", "--num-rollout", "4"], "--num-rollouts 3 and --num-rollout 4"),
        (["--gate", "bogus"], "--gate bogus"),
        (["--no-such-flag"], "--no-such-flag"),
    ],
)
def test_bad_values_exit_2_naming_the_flag_before_anything(
    command: str, flags: list[str], needle: str, tmp_path: Path
) -> None:
    # --dry-run makes a run that got past validation print a plan and exit 0 (what the old
    # CLI did for all of these); the real run additionally never reaches Ray (see below).
    done = cli(command, "--dry-run", "--run-dir", str(tmp_path / "r"), *flags)
    assert_one_line_error(done, needle)
    assert "--baseline" not in done.stderr
    assert not (tmp_path / "r").exists()


def test_preflight_refuses_more_gpus_than_a_node_has_before_probing(tmp_path: Path) -> None:
    """The recipe's one-node check is train's; preflight probed (and wrote env.json) for any
    count. Bounded where it is parsed: exit 2 naming the flag, nothing written."""
    done = cli("preflight", "--run-dir", str(tmp_path / "r"), "--num-gpus", str(10**20))
    assert_one_line_error(done, "'--num-gpus'")
    assert not (tmp_path / "r").exists()


def test_a_bad_timeout_stops_a_real_run_before_ray(tmp_path: Path) -> None:
    """Inputs all valid, so only the timeout's check stands between the command and Ray."""
    write_checkpoint(tmp_path / "models", mxfp4=False)
    dataset = tmp_path / "data" / "dapo-math-17k" / "dapo-math-17k.jsonl"
    dataset.parent.mkdir(parents=True)
    dataset.write_text(json.dumps({"prompt": "1+1?", "label": "2"}) + "\n")
    (tmp_path / "miles").mkdir()
    (tmp_path / "miles" / "train.py").write_text("")
    env = {**os.environ, "RAY_ADDRESS": "http://127.0.0.1:9"}  # nothing listens there
    for timeout in ("nan", "-5"):
        done = cli(
            "train", "--timeout", timeout, "--run-dir", str(tmp_path / "r"),
            "--model-dir", str(tmp_path / "models"), "--data-dir", str(tmp_path / "data"),
            "--miles-dir", str(tmp_path / "miles"), env=env,
        )  # fmt: skip
        assert_one_line_error(done, "'--timeout'")
        assert not (tmp_path / "r").exists()


def test_an_unreachable_cluster_is_one_line_with_the_fix(tmp_path: Path) -> None:
    """Ray's own client against a port nothing listens on: one line, the flag and the fix;
    bad input (exit 2) and the run dir left fresh, since nothing was submitted."""
    env = {**os.environ, "RAY_ADDRESS": "http://127.0.0.1:9"}
    done = cli("train", "--run-dir", str(tmp_path / "r"), env=env)
    assert done.returncode == 2, done.stderr
    assert not (tmp_path / "r").exists()
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("miles-amd: error: no Ray Jobs API at "), lines
    assert "--ray-address / RAY_ADDRESS" in lines[0] and "fix:" in lines[0]
    assert lines[0].count("http://127.0.0.1:9") == 1, lines[0]  # Ray's repeat is dropped


def test_gate_that_does_not_load_names_gate(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    done = cli("train", "--dry-run", "--gate", str(broken))
    assert_one_line_error(done, f"--gate {broken}: ")
    assert "invalid JSON" in done.stderr


def test_gate_with_a_shipped_baseline_plans(tmp_path: Path) -> None:
    done = cli("train", "--dry-run", "--gate", "patched", "--run-dir", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "extra",
    ["--wandb-key SECRET-VALUE-42", "--hf-token=SECRET-VALUE-42", "--x-api-key SECRET-VALUE-42"],
)
def test_credentials_in_extra_args_are_refused_and_not_echoed(extra: str) -> None:
    done = cli("train", "--dry-run", "--extra-args", extra)
    assert_one_line_error(done, "--extra-args carries a credential")
    assert "SECRET-VALUE-42" not in done.stdout + done.stderr


def test_usage_errors_are_one_line_too() -> None:
    done = cli("train", "--hardware")
    assert_one_line_error(done, "'--hardware'")


# ---- paths, aliases, help, version ------------------------------------------------------------


def cli_in(cwd: Path, *args: str, env: dict[str, str] | None = None) -> CliRun:
    """The CLI run from ``cwd``."""
    return run_cli(*args, env=env, cwd=cwd)


def test_relative_dirs_go_into_the_plan_absolute(tmp_path: Path) -> None:
    done = cli_in(
        tmp_path,
        "train", "--dry-run", "--json",
        "--model-dir", "m", "--data-dir", "d/../data", "--miles-dir", "miles",
        "--megatron-dir", "./mlm", "--run-dir", "runs/r",
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


def test_the_sampled_options_are_the_declared_ones() -> None:
    from miles_amd.recipe.settings import FIELD_FLAGS

    assert set(RECIPE_OPTION_SAMPLES) == set(FIELD_FLAGS)


@pytest.mark.parametrize("field", sorted(RECIPE_OPTION_SAMPLES))
def test_each_declared_recipe_option_sets_its_field(field: str) -> None:
    """``Setting.cli`` of a field is an option of ``train`` and ``full-train`` that sets it."""
    from miles_amd.recipe.settings import FIELD_FLAGS, Recipe

    values, expected = RECIPE_OPTION_SAMPLES[field]
    assert Recipe().as_dict()[field] != expected
    for command in ("train", "full-train"):
        done = cli(command, "--dry-run", "--json", FIELD_FLAGS[field], *values)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["recipe"][field] == expected, (command, field)


def test_num_rollout_is_a_hidden_alias_of_num_rollouts() -> None:
    for flag in ("--num-rollouts", "--num-rollout"):
        done = cli("train", "--dry-run", "--json", flag, "3")
        assert done.returncode == 0, done.stderr
        entry = json.loads(done.stdout)["job"]["entrypoint"]
        assert entry[entry.index("--num-rollout") + 1] == "3"
    helped = cli("train", "--help").stdout
    assert "--num-rollouts" in helped
    assert not re.search(r"--num-rollout(?!s)", helped)


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_help_has_plain_flags_and_exit_codes(command: list[str]) -> None:
    done = cli(*command, "--help")
    assert done.returncode == 0, done.stderr
    assert "<bool>" not in done.stdout
    text = " ".join(done.stdout.split())
    assert "Exit codes: 0 success" in text and "2 bad input" in text, done.stdout


def test_version() -> None:
    from importlib.metadata import version

    done = cli("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"miles-amd {version('miles-amd')}\n"


def test_the_console_script_runs_as_a_process() -> None:
    """The installed ``miles-amd`` script (beside this interpreter) and ``python -m``: the
    smoke test that the in-process runs above exercise the entry a user starts."""
    from importlib.metadata import version

    script = Path(sys.executable).parent / "miles-amd"
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"miles-amd {version('miles-amd')}\n"
    bad = run_cli_process("train", "--hardware")
    assert bad.returncode == 2 and bad.stdout == "", bad.stderr
    assert bad.stderr.startswith("miles-amd: error: ") and len(bad.stderr.splitlines()) == 1


# ---- prepare and `hf` -------------------------------------------------------------------------


def test_hf_is_declared_by_a_release_that_ships_it() -> None:
    """`hf` is huggingface_hub's console script from 0.34.0 on (0.33.x: huggingface-cli)."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "huggingface_hub>=0.34" in project["dependencies"]


def no_hf_beside_python() -> bool:
    return not (Path(sys.executable).parent / "hf").exists()


@pytest.mark.skipif(not no_hf_beside_python(), reason="this interpreter has its own `hf`")
def test_prepare_without_hf_says_what_to_install(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path / "empty-bin")}
    done = cli("prepare", "--model-dir", str(tmp_path / "m"), "--data-dir", str(tmp_path / "d"),
               env=env)  # fmt: skip
    assert_one_line_error(done, "pip install 'huggingface_hub>=0.34'")
    assert not (tmp_path / "m").exists()


def fake_hf(bin_dir: Path, exit_code: int) -> Path:
    """An `hf` on PATH that records its argv (one line per call) and exits ``exit_code``."""
    bin_dir.mkdir()
    log = bin_dir / "calls.txt"
    script = bin_dir / "hf"
    script.write_text(
        f"#!{sys.executable}\nimport sys\n"
        f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        f"sys.exit({exit_code})\n"
    )
    script.chmod(0o755)
    return log


def test_prepare_runs_hf_download_for_each_input(tmp_path: Path) -> None:
    log = fake_hf(tmp_path / "bin", 0)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    done = cli_in(tmp_path, "prepare", "--model-dir", "m", "--data-dir", "d", env=env)
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == [
        f"download lmsys/gpt-oss-20b-bf16 --local-dir {tmp_path}/m/gpt-oss-20b-bf16",
        "download --repo-type dataset zhuzilin/dapo-math-17k "
        f"--local-dir {tmp_path}/d/dapo-math-17k",
    ]


def test_prepare_stops_at_a_failed_download(tmp_path: Path) -> None:
    log = fake_hf(tmp_path / "bin", 3)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    done = cli("prepare", "--model-dir", str(tmp_path / "m"), env=env)
    assert done.returncode == 1
    assert "download-checkpoint failed with exit code 3" in done.stderr
    assert len(log.read_text().splitlines()) == 1


# ---- one home per concept ---------------------------------------------------------------------


def test_one_error_exit_path_and_one_home_for_default_dirs() -> None:
    cli_dir = SRC / "miles_amd" / "cli"
    error_literal = re.compile(r"[\"']miles-amd: error|def _?fail\(|typer\.Exit\(2\)")
    for module in sorted(cli_dir.glob("*.py")):
        if module.name != "options.py":
            assert not error_literal.search(module.read_text()), module.name
    default_dir = re.compile(r"[\"'](/root/(models|datasets|miles|Megatron-LM))[\"']")
    homes = [
        str(path.relative_to(REPO))
        for path in [*sorted((SRC / "miles_amd").rglob("*.py")), REPO / "conftest.py"]
        if default_dir.search(path.read_text())
    ]
    assert homes == ["src/miles_amd/recipe/settings.py"]
