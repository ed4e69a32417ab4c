"""The gate's hardware identity: env.json against the baseline's provenance.environment.

env.json is written by the real writer (``miles_amd.run.preflight.write_env_json``, as
``miles-amd preflight`` does) into copies of the embedded example, judged by
:func:`miles_amd.judge.gate.judge` on the evidence the real reader loads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from miles_amd.baseline.model import load_baseline, parse_baseline
from miles_amd.evidence.load import load_run
from miles_amd.judge.environment import Environment, run_environment
from miles_amd.judge.gate import Check, judge
from miles_amd.records.env import EnvRecord
from miles_amd.rules.model import Baseline
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


def test_env_json_is_read_into_an_identity(tmp_path: Path) -> None:
    env = json.loads((run_dir_with_env(tmp_path) / "env.json").read_text())
    record = EnvRecord.from_dict(env)
    assert run_environment(record) == Environment("gfx950", 8, "7.2", "patched", AITER)


def edited(environment: dict) -> Baseline:
    """The shipped patched baseline with ``provenance.environment`` updated."""
    raw = json.loads(PATCHED.read_text())
    raw["provenance"]["environment"].update(environment)
    return parse_baseline(json.dumps(raw), path="edited.json")


# As ``baseline record --allow-no-preflight`` writes it: only the declared variant.
PARTIAL = dict.fromkeys(("gpu_arch", "gpu_model", "gpu_count", "rocm", "aiter_version"))
MISMATCHES = [
    ("gpus", "8x gfx942 (torch)", "gpu_arch: run gfx942, baseline gfx950"),
    ("gpus", "4x gfx950 (rocm-smi)", "gpu_count: run 4, baseline 8"),
    ("gpus", "8x gfx942,gfx950 (amd-smi)", "gpu_arch: run gfx942,gfx950, baseline gfx950"),
    ("rocm", "6.4.1 (amd-smi version)", "rocm: run 6.4, baseline 7.2"),
    ("variant", "stock", "aiter_variant: run stock, baseline patched"),
]
# id: (env.json's change (None: no env.json), the baseline's change, require_env, status,
# in the detail)
CASES = {
    "the matching node": ({}, {}, True, "pass", ""),
    **{
        f"{field} {value}{', required' * strict}": ({field: value}, {}, strict, "fail", named)
        for field, value, named in MISMATCHES
        for strict in (False, True)
    },
    "an aiter version the baseline records": (
        {}, {"aiter_version": "amd-aiter 0.1.4 @ fedcba987654"}, False, "fail",
        f"aiter_version: run {AITER}, baseline amd-aiter 0.1.4 @ fedcba987654",
    ),
    "no env.json": (None, {}, False, "not_measured", ""),
    "no env.json, required": (
        None, {}, True, "fail", "no env.json in the run dir; run `miles-amd preflight --run-dir"
    ),
    # a preflight without --aiter-variant
    "an unrecorded variant": (
        {"variant": None}, {}, False, "pass", "env.json does not record aiter_variant"
    ),
    "an unrecorded variant, required": ({"variant": None}, {}, True, "fail", ""),
    "no env.json, a baseline without hardware": (None, PARTIAL, False, "not_measured", ""),
    "a baseline without hardware: the variant matches": ({}, PARTIAL, False, "pass", ""),
    "a baseline without hardware, required": (
        {}, PARTIAL, True, "fail", "the baseline records no gpu_arch, gpu_count, rocm"
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("env", "environment", "strict", "status", "named"), CASES.values(), ids=CASES.keys()
)
def test_the_identity(tmp_path: Path, env, environment, strict, status, named) -> None:
    run_dir = EXAMPLE if env is None else run_dir_with_env(tmp_path, **env)
    baseline = edited(environment) if environment else None
    check = identity(run_dir, baseline, require_env=strict)
    assert check.status == status, check.detail
    assert named in check.detail, check.detail
    if status == "pass" and strict:
        assert check.observed == f"8x gfx950, ROCm 7.2, aiter patched ({AITER})"


@pytest.mark.parametrize(
    ("node", "require_env", "exit_code"),
    [
        ("example", False, 0),  # no env.json: not measured
        ("example", True, 1),  # the hardware path names env.json
        ("mismatched", False, 1),
        ("matching", True, 0),  # every piece of the hardware path's evidence: a pass
    ],
)
def test_the_gate_exits_by_the_identity(tmp_path: Path, node, require_env, exit_code) -> None:
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
    verdict = judge(load_run(run_dir), load_baseline("patched"), require_env=require_env)
    assert verdict.exit_code == exit_code, verdict.reason
    (check,) = [c for c in verdict.checks if c.name == "environment.identity"]
    assert (check.status == "fail") == (exit_code == 1)
    if exit_code == 1:
        assert "environment.identity" in verdict.reason
    if node == "example" and require_env:
        assert "no env.json" in check.detail
