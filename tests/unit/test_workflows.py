"""The CI lanes' facts no linter holds (``.ci/lint`` runs the workflow schema and zizmor):
runners, GPU counts, check names, caps, the base branch's baselines, no fork code on a GPU
runner, the verified action pins, shellcheck on every ``run:``, CODEOWNERS (docs/ci.md).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.constants import REPO

WORKFLOWS = REPO / ".github" / "workflows"
REQUIRED_CHECK = "AMD 4-GPU verdict (patched aiter)"
PR_CHECKS = {
    "CPU suite",
    REQUIRED_CHECK,
    "AMD 4-GPU lane: fork pull request",
    "Baselines against the base branch",
}
# workflow -> (GPU job, its runner labels' default, EXPECTED_GPUS, the reviewed baselines' ref)
LANES = {
    "amd-pr.yml": (
        "amd-4gpu",
        ["self-hosted", "amd", "mi350", "4gpu"],
        "4",
        "${{ github.event.pull_request.base.sha || github.event.repository.default_branch }}",
    ),
    "amd-nightly.yml": (
        "nightly",
        ["self-hosted", "amd", "mi350", "8gpu"],
        "8",
        "${{ github.event.repository.default_branch }}",
    ),
}
SAME_REPO_ONLY = (
    "github.event_name != 'pull_request' || "
    "github.event.pull_request.head.repo.full_name == github.repository"
)
REVIEWED_PATHS = (
    "baselines/gpt_oss_20b_lora/8gpu/mi355x/stock.json",
    "src/miles_amd/rules/registry.py",
    "src/miles_amd/rules/bands.py",
    "src/miles_amd/baseline/baseline.schema.json",
    ".github/workflows/amd-pr.yml",
    ".github/action-pins.json",
    ".ci/lint",
)
USES = re.compile(r"uses:\s*([\w.-]+/[\w./-]+)@(\S+)(?:\s*#\s*(\S+))?")


def load(name: str) -> dict[str, Any]:
    doc = yaml.safe_load((WORKFLOWS / name).read_text(encoding="utf-8"))
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the bare key `on` as True
    return doc


def runner_default(runs_on: str) -> list[str]:
    match = re.fullmatch(r"\$\{\{ fromJSON\(vars\.\w+ \|\| '(\[.*\])'\) \}\}", runs_on)
    assert match, runs_on
    return json.loads(match.group(1))


@pytest.mark.parametrize("workflow", sorted(LANES))
def test_the_lanes_hold_their_runners_gpus_checks_and_cpu_job(workflow: str) -> None:
    doc = load(workflow)
    job_name, labels, gpus, reviewed_ref = LANES[workflow]
    job = doc["jobs"][job_name]
    assert runner_default(job["runs-on"]) == labels
    assert job["env"]["EXPECTED_GPUS"] == gpus
    # The gate judges with the base branch's baselines: a change cannot loosen its own gate.
    (reviewed,) = [s for s in job["steps"] if s.get("with", {}).get("path") == ".reviewed"]
    assert reviewed["with"]["ref"] == reviewed_ref
    exports = 'echo "MILES_AMD_BASELINES_DIR=$PWD/.reviewed/baselines" >> "$GITHUB_ENV"'
    assert any(exports in s.get("run", "") for s in job["steps"])
    # Not copied from miles' ROCm CI (docs/ci.md): read-write caches, a privileged container,
    # a blanket kill; and the evidence is uploaded whatever happened.
    options = job["container"]["options"].split()
    assert "--privileged" not in options and "--pid=host" not in options
    assert all(volume.endswith(":ro") for volume in job["container"]["volumes"])
    assert not any(re.search(r"\b(pkill|killall)\b", s.get("run", "")) for s in job["steps"])
    (upload,) = [s for s in job["steps"] if "upload-artifact" in s.get("uses", "")]
    assert upload["if"] == "always()"
    step_caps = [s.get("timeout-minutes", 0) for s in job["steps"]]
    assert all(step_caps) and sum(step_caps) < job["timeout-minutes"]
    assert job["needs"] == "cpu"
    cpu_runs = [s.get("run") for s in doc["jobs"]["cpu"]["steps"]]
    assert ".ci/lint" in cpu_runs and "python -m pytest" in cpu_runs
    if workflow == "amd-pr.yml":
        assert {j["name"] for j in doc["jobs"].values()} == PR_CHECKS
        assert job["name"] == REQUIRED_CHECK
        assert doc["on"]["pull_request"] is None  # no path filter: the check always reports
        assert job["if"] == SAME_REPO_ONLY  # fork code never reaches the self-hosted runner
    else:
        assert "pull_request" not in doc["on"]  # only the schedule and dispatches
        # The patched aiter is an exact commit: no moving default, a non-SHA refused.
        (build,) = [s for s in job["steps"] if "aiter-src" in s.get("run", "")]
        assert "'" not in build["env"]["AITER_REF"] and "^[0-9a-f]{40}$" in build["run"]


def pin_problems(text: str, pins: dict[str, Any]) -> list[str]:
    problems = []
    for action, ref, tag in USES.findall(text):
        pin = pins.get(action)
        if pin is None:
            problems.append(f"{action}: not in .github/action-pins.json")
        elif (ref, tag) != (pin["sha"], pin["tag"]):
            problems.append(
                f"{action}@{ref} # {tag}: is not the verified {pin['sha']} # {pin['tag']}"
            )
    return problems


def test_every_action_is_the_verified_commit_and_a_bad_pin_is_named() -> None:
    lock = json.loads((REPO / ".github" / "action-pins.json").read_text(encoding="utf-8"))
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", lock["verified_on"])
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(WORKFLOWS.glob("*.y*ml")))
    assert USES.findall(text) and pin_problems(text, lock["actions"]) == []
    for old, new in (
        ("bbbca2ddaa5d8feaa63e36b76fdaad77386f024f", "b4b15b8c7c6ac21ea08fcf65892d2ee8c75cf882"),
        ("# v7.0.1", "# v4.2.2"),
        ("actions/setup-python@", "someone/setup-python@"),
    ):
        assert pin_problems(text.replace(old, new), lock["actions"]), old


def test_every_run_script_passes_shellcheck_which_can_fail(tmp_path: Path) -> None:
    found = Path(sys.executable).parent / "shellcheck"
    if not found.exists():
        pytest.skip("shellcheck is not installed: pip install -e '.[test]' provides it")
    scripts = {
        f"{path.name}: jobs.{name}.{step.get('name')}": step["run"]
        for path in sorted(WORKFLOWS.glob("*.yml"))
        for name, job in load(path.name)["jobs"].items()
        for step in job.get("steps", [])
        if "run" in step
    }
    assert len(scripts) > 10
    scripts["control"] = "rm -rf $RUN_DIR/x\n"  # an unquoted variable is a finding
    files = {}
    for index, (where, script) in enumerate(scripts.items()):  # one shellcheck for them all
        files[where] = tmp_path / f"{index}.sh"
        files[where].write_text(re.sub(r"\$\{\{.*?\}\}", "GITHUB_EXPRESSION", script, flags=re.S))
    argv = [str(found), "--shell=bash", "--format=gcc", *map(str, files.values())]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300).stdout
    failing = {where for where, file in files.items() if f"{file}:" in out}
    assert failing == {"control"}, out


def test_codeowners_require_a_maintainer_for_the_reviewed_paths() -> None:
    rules = [
        line.split()
        for line in (REPO / ".github" / "CODEOWNERS").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for path in REVIEWED_PATHS:
        owners = [r[1:] for r in rules if ("/" + path).startswith(r[0])]  # last match wins
        assert owners and owners[-1] == ["@radixark/miles-amd-maintainers"], path
