"""Issue 16's A/B premise: the job's SGLang aiter env, the preflight's aiter commit and
all-reduce route, and the gate's ``allreduce.path`` / control-arm / aiter-commit checks.

The preflight's child is a real ``python3`` subprocess with a real ``PYTHONPATH``; the aiter
it finds is a stand-in package in a temp dir (AMD's aiter does not install on a CPU machine):
its ``_version.py`` and ``dist/device_communicators/custom_all_reduce.py`` have the paths and
the setuptools-scm format AMD's (ROCm/aiter pyproject.toml: ``write_to =
"aiter/_version.py"``). env.json is written by the real writer; run dirs are copies of the
embedded example read by the real reader, judged by the real gate.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from miles_amd.baseline.model import load_baseline, parse_baseline
from miles_amd.evidence.load import load_run
from miles_amd.judge.gate import judge
from miles_amd.recipe.settings import Recipe
from miles_amd.run.preflight import Fact, write_env_json
from miles_amd.run.probes import git_commit
from miles_amd.run.probes_allreduce import (
    aiter_commit_fact,
    allreduce_route,
    job_sglang_env,
    read_job_aiter,
    sglang_allreduce_fact,
)
from tests.cli_runs import run_cli
from tests.constants import EXAMPLE, SHIPPED

PATCHED = SHIPPED / "patched.json"
ARGV = Recipe().argv()
AITER_LINE = (
    "(SGLangEngine pid=7) [2026-11-20 10:01:02 TP0] [AR] Using AiterCustomAllreduce (AMD default)\n"
)
FALLBACK_LINE = (
    "(SGLangEngine pid=7) [2026-11-20 10:01:02 TP1] [AR] Aiter custom all-reduce not available; "
    "falling back to sglang CustomAllreduce. Details: No module named 'aiter.dist'\n"
)


# ---------------------------------------------------------------------------- the job env


def test_the_job_env_overrides_an_inherited_switch_and_keeps_the_others() -> None:
    launch = {"SGLANG_USE_AITER_AR": "1", "SGLANG_USE_1STAGE_ALLREDUCE": "1"}
    assert job_sglang_env("rccl", launch) == {
        "SGLANG_USE_AITER": "1",
        "SGLANG_USE_AITER_AR": "0",
        "SGLANG_USE_1STAGE_ALLREDUCE": "1",  # not set by the job: inherited from the head
    }


def test_record_refuses_the_control_arm(tmp_path: Path) -> None:
    """The job env of each variant is the dry run's (tests/snapshot: aiter_rccl sets
    SGLANG_USE_AITER_AR=0); a control-arm run is no baseline."""
    out = tmp_path / "x.json"
    refused = run_cli(
        "baseline", "record", "--run-dir", str(EXAMPLE), "--variant", "rccl", "--out", str(out)
    )
    assert refused.returncode == 2 and "rccl" in refused.stderr
    assert not out.exists()


# ---------------------------------------------------------------------------- SGLang's rule


@pytest.mark.parametrize(
    ("env", "argv", "error", "route"),
    [
        ({}, ARGV, None, "aiter"),  # SGLANG_USE_AITER_AR defaults to true
        ({"SGLANG_USE_AITER_AR": "0"}, ARGV, None, "sglang"),
        ({"SGLANG_USE_AITER_AR": "yes"}, ARGV, None, "sglang"),  # get_bool_env_var: only true/1
        ({}, ARGV, "ModuleNotFoundError: aiter.dist", "sglang"),  # the import fallback
        ({"SGLANG_USE_1STAGE_ALLREDUCE": "y"}, ARGV, None, "sglang"),
        ({"SGLANG_USE_1STAGE_ALLREDUCE": "0"}, [*ARGV, "--true-on-policy-mode"], None, "aiter"),
        ({}, [*ARGV, "--sglang-enable-deterministic-inference"], None, "sglang"),
        ({"SGLANG_USE_1STAGE_ALLREDUCE": "maybe"}, ARGV, None, "invalid"),
        ({}, [*ARGV, "--sglang-disable-custom-all-reduce"], None, "none"),
    ],
)
def test_sglang_all_reduce_rule(env, argv, error, route) -> None:
    assert allreduce_route(env, argv, error).route == route


def test_the_route_fact_is_wrong_when_it_is_not_the_variants() -> None:
    aiter_off = {"SGLANG_USE_AITER": "1", "SGLANG_USE_AITER_AR": "0"}
    assert sglang_allreduce_fact("rccl", aiter_off, ARGV, None).status == "ok"
    stock = sglang_allreduce_fact("stock", aiter_off, ARGV, None)
    assert stock.status == "wrong" and "ROCm/aiter#5694" in stock.message
    fallback = sglang_allreduce_fact("patched", {}, ARGV, "ImportError: no dist")
    assert fallback.status == "wrong" and fallback.value.startswith("sglang: fallback")
    assert sglang_allreduce_fact("rccl", {}, ARGV, None).status == "wrong"
    assert sglang_allreduce_fact(None, aiter_off, ARGV, None).status == "ok"


# ---------------------------------------------------------------------------- aiter's build


def fake_aiter(root: Path, version: str, *, ar_imports: bool = True) -> Path:
    package = root / "aiter"
    ar = package / "dist" / "device_communicators"
    ar.mkdir(parents=True)
    for init in (package, package / "dist", ar):
        (init / "__init__.py").write_text("")
    (package / "_version.py").write_text(f"__version__ = '{version}'\n")
    body = "CustomAllreduce = object\n" if ar_imports else "import aiter_jit_missing_module\n"
    (ar / "custom_all_reduce.py").write_text(body)
    return root


def test_the_child_reads_the_scm_commit_and_the_import_of_the_job_aiter(tmp_path: Path) -> None:
    root = fake_aiter(tmp_path / "good", "0.1.17.dev3+g1a2b3c4d5")
    reading = read_job_aiter(str(root))
    assert reading["ar_import_error"] is None
    assert reading["package_dir"] == str(root / "aiter")
    fact = aiter_commit_fact(reading, None)
    assert fact.value.startswith("1a2b3c4d5 (aiter/_version.py")
    broken = read_job_aiter(str(fake_aiter(tmp_path / "broken", "0.1.17", ar_imports=False)))
    assert "aiter_jit_missing_module" in str(broken["ar_import_error"])
    assert aiter_commit_fact(broken, None).value.startswith("unknown: ")
    error = str(broken["ar_import_error"])
    assert sglang_allreduce_fact("stock", {}, ARGV, error).status == "wrong"


def test_a_git_checkout_names_its_commit(tmp_path: Path) -> None:
    root = fake_aiter(tmp_path / "src", "0.1.0")
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "aiter"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    commit = git_commit(root / "aiter")
    assert commit == head.stdout.strip()
    assert aiter_commit_fact(read_job_aiter(str(root)), commit).value.startswith(commit)


def test_vcs_metadata_and_the_unknown_reason() -> None:
    base = {"package_dir": "/usr/lib/python3/site-packages/aiter", "version_py": None}
    vcs = json.dumps(
        {"url": "https://github.com/ROCm/aiter", "vcs_info": {"vcs": "git", "commit_id": "ab" * 20}}
    )
    pip_vcs = {**base, "dists": [{"version": "0.1.17", "direct_url": vcs}]}
    assert aiter_commit_fact(pip_vcs, None).value.startswith("ab" * 20)
    scm = {**base, "dists": [{"version": "0.1.17.post2+g0f0e0d0c", "direct_url": None}]}
    assert aiter_commit_fact(scm, None).value.startswith("0f0e0d0c (amd-aiter")
    release = {**base, "dists": [{"version": "0.1.17", "direct_url": None}]}
    unknown = aiter_commit_fact(release, None)
    assert unknown.status == "ok" and unknown.value.startswith("unknown: ")
    assert "no +g<sha>" in unknown.value and "no git checkout" in unknown.value


# ---------------------------------------------------------------------------- the gate


def run_dir(tmp_path: Path, variant: str, log: str = "", **facts: str) -> Path:
    target = tmp_path / "run"
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns("report"))
    values = {
        "gpus": "8x gfx950 (torch)",
        "rocm": "7.2.0-43 (/opt/rocm/.info/version)",
        "aiter": "amd-aiter 0.1.5",
        "aiter_variant": variant,
        **facts,
    }
    write_env_json([Fact(k, "ok", v) for k, v in values.items()], target, {})
    with open(target / "job.log", "a", encoding="utf-8") as handle:
        handle.write(log)
    return target


def check(path: Path, baseline: str, name: str, **options):
    verdict = judge(load_run(path), load_baseline(baseline), **options)
    return verdict, next(c for c in verdict.checks if c.name == name)


def test_the_all_reduce_the_log_shows_is_judged_against_the_variant(tmp_path: Path) -> None:
    _, ok = check(run_dir(tmp_path / "a", "patched", AITER_LINE), "patched", "allreduce.path")
    assert ok.status == "pass" and "line" in ok.detail
    verdict, fell = check(
        run_dir(tmp_path / "b", "stock", AITER_LINE + FALLBACK_LINE), "stock", "allreduce.path"
    )
    assert fell.status == "fail" and "falling back" in fell.detail and verdict.verdict == "fail"
    _, quiet = check(run_dir(tmp_path / "c", "patched"), "patched", "allreduce.path")
    assert quiet.status == "not_measured" and quiet.detail.startswith("not measured")
    _, required = check(
        run_dir(tmp_path / "d", "patched"), "patched", "allreduce.path", require_env=True
    )
    assert required.status == "fail"
    predicted = run_dir(
        tmp_path / "e", "patched", AITER_LINE, sglang_allreduce="sglang: SGLANG_USE_AITER_AR=0"
    )
    _, said = check(predicted, "patched", "allreduce.path")
    assert said.status == "fail" and "preflight says" in said.detail


def test_the_control_arm_is_gated_baseline_free_against_stock(tmp_path: Path) -> None:
    own = "(SGLangEngine pid=7) AMD/ROCm: Using 1-stage all-reduce kernel (deterministic)\n"
    verdict, path = check(run_dir(tmp_path / "a", "rccl", own), "stock", "allreduce.path")
    assert path.status == "pass"
    assert verdict.verdict == "pass", verdict.reason
    by_name = {c.name: c for c in verdict.checks}
    assert by_name["environment.identity"].status == "pass"  # the variant name is not compared
    for name in ("logprob_abs_diff.mean", "logprob_abs_diff.max"):
        assert by_name[name].status == "not_measured" and not by_name[name].required
        assert "miles-amd compare" in by_name[name].detail
    assert by_name["logprob_abs_diff.spikes"].status == "pass"  # baseline-free: still judged
    _, aiter = check(run_dir(tmp_path / "b", "rccl", AITER_LINE), "stock", "allreduce.path")
    assert aiter.status == "fail"


def test_an_aiter_commit_other_than_the_baselines_fails_with_the_fix(tmp_path: Path) -> None:
    raw = json.loads(PATCHED.read_text())
    raw["provenance"]["environment"]["aiter_commit"] = "1a2b3c4d5e6f"
    baseline = parse_baseline(json.dumps(raw), path="patched-with-commit.json")
    same = run_dir(tmp_path / "a", "patched", AITER_LINE, aiter_commit="1a2b3c4d5 (git checkout x)")
    other = run_dir(tmp_path / "b", "patched", AITER_LINE, aiter_commit="99aa88bb (x)")
    unknown = run_dir(tmp_path / "c", "patched", AITER_LINE, aiter_commit="unknown: release")
    identity = [
        next(c for c in judge(load_run(p), baseline).checks if c.name == "environment.identity")
        for p in (same, other, unknown)
    ]
    assert identity[0].status == "pass"
    assert identity[1].status == "fail" and "ROCm/aiter#5694" in identity[1].detail
    assert "fix:" in identity[1].detail
    assert identity[2].status == "pass" and "does not record aiter_commit" in identity[2].detail
    strict = judge(load_run(unknown), baseline, require_env=True)
    assert "environment.identity" in {c.name for c in strict.failures}
