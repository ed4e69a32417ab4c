"""``miles_amd.run.probes_miles`` and the preflight fact ``miles_argv``, on real subprocesses.

Two kinds of miles stand behind the parser here:

- a tiny stand-in package ``miles.utils.arguments`` written into tmp (an ``argparse`` parser
  that records the argv and env it was given): fast, runs anywhere, checks the plumbing
  (exact argv and env, no GPU stubs from the preflight, the one-line messages, the time limit);
- the real miles and Megatron-LM checkout of the conformance tier (marker ``conformance``;
  skipped with the reason that says how to provide it): accept, and reject after flag drift.
  There the GPU stubs are opted into, because this machine has no GPU (see
  ``tests/conformance/test_miles_parser.py`` for the two stubbed calls and why).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

from miles_amd.recipe.plan import build_train_plan
from miles_amd.recipe.settings import Recipe
from miles_amd.run.probes import PreflightConfig
from miles_amd.run.probes_miles import (
    parse_with_miles,
    probe_miles_argv,
    read_outcome,
    submitted_job,
)
from tests.conformance.fake_inputs import make_fake_inputs
from tests.conformance.harness import MilesCheckout, resolve

STAND_IN_PARSER = """
import argparse, json, os, sys, time

def parse_args():
    if os.environ.get("STAND_IN_SLEEP"):
        time.sleep(float(os.environ["STAND_IN_SLEEP"]))
    record = {"argv": sys.argv, "env": dict(os.environ)}
    with open(os.environ["STAND_IN_RECORD"], "w") as out:
        json.dump(record, out)
    parser = argparse.ArgumentParser(prog="train.py")
    parser.add_argument("--num-rollout", type=int, default=1)
    args, rest = parser.parse_known_args()
    unknown = [t for t in rest if t in os.environ.get("STAND_IN_UNKNOWN", "").split()]
    if unknown:
        parser.error("unrecognized arguments: " + " ".join(unknown))
    assert args.num_rollout > 0, f"num_rollout must be > 0, got {args.num_rollout}"
    return args
"""


def stand_in_miles(root: Path, arguments: str = STAND_IN_PARSER) -> Path:
    """A miles 'checkout': train.py and a ``miles.utils.arguments`` of ``arguments``."""
    package = root / "miles" / "utils"
    package.mkdir(parents=True)
    for init in (root / "miles" / "__init__.py", package / "__init__.py"):
        init.write_text("")
    (package / "arguments.py").write_text(arguments)
    (root / "train.py").write_text("")
    return root


def python3_on_path(bin_dir: Path, python: str | Path, record: Path | None = None) -> Path:
    """``bin_dir/python3``: runs ``python`` (a wrapper, not a symlink, so a venv stays one),
    after writing its arguments to ``record``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    log = f'printf "%s\\n" "$@" > {record}\n' if record else ""
    wrapper = bin_dir / "python3"
    wrapper.write_text(f'#!/bin/sh\n{log}exec {python} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def config_for(tmp_path: Path, miles: Path, megatron: Path | None = None) -> PreflightConfig:
    model_dir, data_dir = make_fake_inputs(tmp_path / "inputs")
    megatron = megatron or tmp_path / "Megatron-LM"
    return PreflightConfig(model_dir, data_dir, miles, megatron, tmp_path / "run")


# ---- the plumbing, with the stand-in parser ---------------------------------------------------


def test_the_job_is_what_the_driver_submits() -> None:
    recipe = Recipe(miles_dir="/m", megatron_dir="/g")
    base = {"PATH": "/bin", "WANDB_API_KEY": "k", "HIP_VISIBLE_DEVICES": "0,1"}
    job = submitted_job(build_train_plan(recipe, base, run_dir="/r"), base)
    assert (job.python, job.train_script) == ("python3", "/m/train.py")
    assert job.train_argv == Recipe(miles_dir="/m", use_wandb=True, capture_metrics=True).argv()
    assert job.env["WANDB_API_KEY"] == "k"  # the secret the job gets, for the parse only
    assert job.env["CUDA_VISIBLE_DEVICES"] == "0,1"  # the plan's device env
    assert job.env["MILES_CI_GATE_RECORD_DIR"] == "/r/ci_history"
    assert job.env["PYTHONPATH"] == "/m:/g"


def test_the_preflight_parses_the_exact_argv_and_env_without_gpu_stubs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    miles = stand_in_miles(tmp_path / "miles")
    record, command = tmp_path / "record.json", tmp_path / "command.txt"
    bin_dir = python3_on_path(tmp_path / "bin", sys.executable, command)
    config = config_for(tmp_path, miles)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("STAND_IN_RECORD", str(record))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    env = dict(os.environ)
    fact = probe_miles_argv(config)  # what `miles-amd preflight` runs
    assert fact.status == "ok", fact
    assert fact.value.endswith(f"{bin_dir}/python3 {miles}/train.py")
    seen = json.loads(record.read_text())
    job = submitted_job(build_train_plan(config.recipe(), env, run_dir=str(config.run_dir)), env)
    assert seen["argv"] == ["train.py", *job.train_argv]
    assert {k: seen["env"].get(k) for k in job.env} == job.env
    assert seen["env"]["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert "--stub-gpu-queries" not in command.read_text().split()


@pytest.mark.parametrize(
    ("extra_env", "argv", "returncode", "args", "message"),
    [
        ({}, ["--num-rollout", "3"], 0, {"num_rollout": 3}, ""),
        (
            {"STAND_IN_UNKNOWN": "--x"},
            ["--num-rollout", "2", "--x"],
            2,
            None,
            "unrecognized arguments: --x",
        ),
        ({}, ["--num-rollout", "0"], 1, None, "AssertionError: num_rollout must be > 0, got 0"),
    ],  # a wedged parse: test_a_wedged_parse_is_wrong_...
)
def test_the_parsers_answer_or_its_one_line(
    tmp_path: Path,
    extra_env: dict[str, str],
    argv: list[str],
    returncode: int,
    args: dict | None,
    message: str,
) -> None:
    miles = stand_in_miles(tmp_path / "miles")
    env = {"PYTHONPATH": str(miles), "STAND_IN_RECORD": str(tmp_path / "r.json"), **extra_env}
    outcome = parse_with_miles(argv, env, python=sys.executable, timeout=60)
    assert (outcome.returncode, outcome.args, outcome.message) == (returncode, args, message)
    assert outcome.ok == (returncode == 0)


def test_a_wedged_parse_is_wrong_and_no_checkout_or_python_is_missing(tmp_path: Path) -> None:
    miles = stand_in_miles(tmp_path / "miles")
    env = {
        "PATH": str(python3_on_path(tmp_path / "bin", sys.executable)),
        "STAND_IN_RECORD": str(tmp_path / "r.json"),
        "STAND_IN_SLEEP": "60",
    }
    fact = probe_miles_argv(config_for(tmp_path, miles), base_env=env, timeout=1)
    assert fact.status == "wrong"
    assert fact.message.startswith("the parse did not finish within 1 s: importing miles hangs")
    fact = probe_miles_argv(config_for(tmp_path, tmp_path / "nowhere"), base_env={"PATH": ""})
    assert (fact.status, fact.message) == (
        "missing",
        f"no {tmp_path}/nowhere/train.py; point --miles-dir at a miles checkout",
    )
    fact = probe_miles_argv(config_for(tmp_path, miles), base_env={"PATH": str(tmp_path)})
    assert (fact.status, fact.message) == (
        "missing",
        "no `python3` on the job's PATH to run train.py",
    )


# ---- the real miles (conformance env) ---------------------------------------------------------


@pytest.fixture(scope="module")
def checkout(request: pytest.FixtureRequest) -> MilesCheckout:
    return resolve(request.config)


def _real_env(checkout: MilesCheckout, tmp_path: Path) -> dict[str, str]:
    bin_dir = python3_on_path(tmp_path / "bin", checkout.python)
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    if checkout.needs_import_stubs:  # reaches the job's PYTHONPATH as a launching env's does
        env["PYTHONPATH"] = checkout.parse_pythonpath("").lstrip(os.pathsep)
    return env


@pytest.mark.conformance
def test_real_miles_accepts_the_preflight_argv(checkout: MilesCheckout, tmp_path: Path) -> None:
    config = config_for(tmp_path, checkout.miles, checkout.megatron)
    fact = probe_miles_argv(config, base_env=_real_env(checkout, tmp_path), gpu_stubs=True)
    assert fact.status == "ok", fact.message
    count, _, where = fact.value.partition(" args parsed by ")
    assert int(count) > 1000 and where.endswith(f"python3 {checkout.miles}/train.py")


@pytest.mark.conformance
def test_real_miles_with_a_dropped_flag_rejects_it(checkout: MilesCheckout, tmp_path: Path) -> None:
    """Flag drift in a new image: its miles no longer knows ``--lora-base-cpu-backup``."""
    drifted = tmp_path / "miles"
    shutil.copytree(checkout.miles, drifted, ignore=shutil.ignore_patterns("tests", "docs"))
    arguments = drifted / "miles" / "utils" / "arguments.py"
    source = arguments.read_text()
    assert source.count('"--lora-base-cpu-backup",') == 1
    arguments.write_text(source.replace('"--lora-base-cpu-backup",', '"--lora-base-cpu-keep",'))
    config = config_for(tmp_path, drifted, checkout.megatron)
    fact = probe_miles_argv(config, base_env=_real_env(checkout, tmp_path), gpu_stubs=True)
    assert fact.status == "wrong"
    refusal = "rejects the argv train would submit: unrecognized arguments: --lora-base-cpu-backup;"
    assert refusal in fact.message


@pytest.mark.parametrize("written", ['{"ok": true, "args": {"num_rollout"', "[1, 2]", "\xff"])
def test_a_cut_or_foreign_result_file_is_a_named_outcome(tmp_path: Path, written: str) -> None:
    """A parse child killed mid-write leaves a truncated result.json: named, never raised."""
    result = tmp_path / "result.json"
    result.write_bytes(written.encode("latin-1"))
    outcome = read_outcome(0, result, "", 0.5)
    assert not outcome.ok and outcome.args is None
    assert outcome.message.startswith(f"{result}: ") and "\n" not in outcome.message
