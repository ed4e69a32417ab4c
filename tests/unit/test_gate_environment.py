"""The gate's hardware identity: env.json against the baseline's provenance.environment.

env.json is written by the real writer (``miles_amd.run.preflight.write_env_json``, as
``miles-amd preflight`` does) into copies of the embedded example; the gate runs through the
CLI and through :func:`miles_amd.judge.gate.judge` on the evidence the real reader loads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miles_amd.baseline.model import load_baseline, parse_baseline
from miles_amd.cli.main import app
from miles_amd.evidence.load import load_run
from miles_amd.judge.environment import Environment, run_environment
from miles_amd.judge.gate import Check, judge
from miles_amd.records.env import EnvRecord
from miles_amd.run.preflight import Fact, write_env_json
from tests.bridge_readings import node_model_facts
from tests.constants import EXAMPLE, SHIPPED
from tests.unit.test_gate_canary import canary

PATCHED = SHIPPED / "patched.json"
AITER = "amd-aiter 0.1.5 @ 0123456789ab"
NODE_FIX = "fixed: /opt/aiter/csrc/include/custom_all_reduce.cuh sha256:0123456789ab (whole tiles)"


def run_dir_with_env(
    tmp_path: Path,
    *,
    gpus: str = "8x gfx950 (torch)",
    rocm: str = "7.2.0-43 (/opt/rocm/.info/version)",
    variant: str | None = "patched",
) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(EXAMPLE, run_dir, ignore=shutil.ignore_patterns("report"))
    facts = [
        Fact("gpus", "ok", gpus),
        Fact("rocm", "ok", rocm),
        Fact("aiter", "ok", AITER),
        Fact("aiter_variant", "ok", variant or "unrecorded"),
        *node_model_facts(),  # the deep probe's, as a node records them
        Fact("aiter_fix", "ok", NODE_FIX),
    ]
    write_env_json(facts, run_dir, {"host": "node-1"})
    return run_dir


def identity(run_dir: Path, baseline=None, **options) -> Check:
    verdict = judge(load_run(run_dir), baseline or load_baseline("patched"), **options)
    (check,) = [c for c in verdict.checks if c.name == "environment.identity"]
    return check


def gate(*args: str):
    return CliRunner().invoke(app, ["gate", *args])


def test_env_json_is_read_into_an_identity(tmp_path: Path) -> None:
    env = json.loads((run_dir_with_env(tmp_path) / "env.json").read_text())
    record = EnvRecord.from_dict(env)
    assert run_environment(record) == Environment("gfx950", 8, "7.2", "patched", AITER)


def test_the_matching_node_passes(tmp_path: Path) -> None:
    check = identity(run_dir_with_env(tmp_path), require_env=True)
    assert check.status == "pass", check.detail
    assert check.observed == f"8x gfx950, ROCm 7.2, aiter patched ({AITER})"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"gpus": "8x gfx942 (torch)"}, "gpu_arch: run gfx942, baseline gfx950"),
        ({"gpus": "4x gfx950 (rocm-smi)"}, "gpu_count: run 4, baseline 8"),
        ({"gpus": "8x gfx942,gfx950 (amd-smi)"}, "gpu_arch: run gfx942,gfx950, baseline gfx950"),
        ({"rocm": "6.4.1 (amd-smi version)"}, "rocm: run 6.4, baseline 7.2"),
        ({"variant": "stock"}, "aiter_variant: run stock, baseline patched"),
    ],
)
def test_a_mismatch_fails_naming_the_field(tmp_path: Path, change: dict, named: str) -> None:
    run_dir = run_dir_with_env(tmp_path, **change)
    for require_env in (False, True):
        check = identity(run_dir, require_env=require_env)
        assert check.status == "fail"
        assert named in check.detail


def test_the_aiter_version_is_compared_when_the_baseline_records_it(tmp_path: Path) -> None:
    raw = json.loads(PATCHED.read_text())
    raw["provenance"]["environment"]["aiter_version"] = "amd-aiter 0.1.4 @ fedcba987654"
    other = parse_baseline(json.dumps(raw), path="other.json")
    check = identity(run_dir_with_env(tmp_path), other)
    assert check.status == "fail"
    assert f"aiter_version: run {AITER}, baseline amd-aiter 0.1.4 @ fedcba987654" in check.detail


def test_without_env_json_it_is_not_measured_unless_required() -> None:
    assert identity(EXAMPLE).status == "not_measured"
    required = identity(EXAMPLE, require_env=True)
    assert required.status == "fail"
    assert "no env.json in the run dir" in required.detail
    assert "miles-amd preflight --run-dir" in required.detail


def test_an_unrecorded_field_fails_only_when_required(tmp_path: Path) -> None:
    run_dir = run_dir_with_env(tmp_path, variant=None)  # preflight without --aiter-variant
    lenient = identity(run_dir)
    assert lenient.status == "pass"
    assert "env.json does not record aiter_variant" in lenient.detail
    strict = identity(run_dir, require_env=True)
    assert strict.status == "fail"


def test_a_baseline_without_a_hardware_identity_cannot_pass_a_required_check(
    tmp_path: Path,
) -> None:
    """As ``baseline record --allow-no-preflight`` writes it: only the declared variant."""
    raw = json.loads(PATCHED.read_text())
    raw["provenance"]["environment"] = {
        "gpu_arch": None,
        "gpu_count": None,
        "rocm": None,
        "aiter_variant": "patched",
        "aiter_version": None,
    }
    partial = parse_baseline(json.dumps(raw), path="partial.json")
    assert identity(EXAMPLE, partial).status == "not_measured"
    run_dir = run_dir_with_env(tmp_path)
    assert identity(run_dir, partial).status == "pass"  # the variant matches
    required = identity(run_dir, partial, require_env=True)
    assert required.status == "fail"
    assert "the baseline records no gpu_arch, gpu_count, rocm" in required.detail


@pytest.mark.parametrize(
    ("node", "options", "exit_code"),
    [
        ("example", (), 0),  # no env.json: not measured
        ("example", ("--require-env",), 1),  # the hardware path names env.json
        ("mismatched", (), 1),
        ("matching", ("--require-env",), 0),
    ],
)
def test_the_cli_gate_exits_by_the_identity(tmp_path: Path, node, options, exit_code) -> None:
    if node == "example":
        run_dir = EXAMPLE
    elif node == "mismatched":
        run_dir = run_dir_with_env(tmp_path, gpus="8x gfx942 (torch)")
    else:
        run_dir = run_dir_with_env(tmp_path)
        with open(run_dir / "job.log", "a", encoding="utf-8") as log:  # the node's SGLang says so
            log.write("(SGLangEngine pid=77) [AR] Using AiterCustomAllreduce (AMD default)\n")
            log.write(f'MILES_AMD_AITER_FIX {{"value": "{NODE_FIX}"}}\n')  # the job's own aiter
        canary(run_dir, "aiter", bad=False, variant="patched", aiter_fix=NODE_FIX)  # clean
    out = tmp_path / "report"
    args = ("--run-dir", str(run_dir), "--baseline", "patched", "--report-dir", str(out))
    result = gate(*args, *options)
    assert result.exit_code == exit_code, result.stdout
    report = json.loads((out / "report.json").read_text())
    (check,) = [c for c in report["checks"] if c["name"] == "environment.identity"]
    assert (check["status"] == "fail") == (exit_code == 1)
    if exit_code == 1:
        assert (
            "environment.identity" in report["reason"] and "environment.identity" in result.stdout
        )
    if node == "example" and options:
        assert "no env.json" in check["detail"]
