"""The CI lanes keep the promises the AMD gate depends on.

``.ci/run`` checks every workflow with ``check-jsonschema`` (GitHub's workflow schema) and
``zizmor --offline`` (the pedantic persona on all, the auditor persona on both GPU lanes);
findings a workflow accepts on purpose are silenced in the file with ``# zizmor:
ignore[<audit>]`` beside a comment that says why. Here, each shown able to fail by a mutated
copy: every ``run:`` script passes shellcheck; every action is pinned to its verified
commit; code owners cover the reviewed paths; and ``tests.workflow_audit`` names every
broken promise of the nightly lane (``amd-nightly.yml``: a whole 8-GPU node) and the per-PR
lane (``amd-pr.yml``: one 4-GPU runner), reading both lanes' jobs for their labels, GPU
counts, steps and check names.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.workflow_audit import (
    ACTION_PINS,
    CODEOWNERS,
    NIGHTLY_JOB,
    PR_CHECKS,
    PR_JOB,
    REQUIRED_CHECK,
    REVIEWED_PATHS,
    codeowners_rules,
    load_pins,
    nightly_workflow_problems,
    owners_of,
    pin_problems,
    pr_workflow_problems,
)
from tests.workflow_tools import shellcheck_problems
from tests.workflow_yaml import (
    NIGHTLY_WORKFLOW,
    PR_WORKFLOW,
    REPO_ROOT,
    find_step,
    load_workflow,
    mutated_copy,
    runner_labels,
    steps_of,
    workflow_files,
)


def test_every_action_is_pinned_to_its_verified_commit() -> None:
    text = "\n".join(p.read_text(encoding="utf-8") for p in workflow_files())
    assert pin_problems(text, load_pins()) == []


def test_pin_file_records_when_it_was_verified() -> None:
    lock = json.loads(ACTION_PINS.read_text(encoding="utf-8"))
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", lock["verified_on"])
    assert all(re.fullmatch(r"[0-9a-f]{40}", p["sha"]) for p in lock["actions"].values())


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param(
            # The SHA that was once committed: the right shape, but no such commit exists.
            "upload-artifact@bbbca2ddaa5d8feaa63e36b76fdaad77386f024f",
            "upload-artifact@b4b15b8c7c6ac21ea08fcf65892d2ee8c75cf882",
            "is not the verified",
            id="nonexistent-sha",
        ),
        pytest.param("# v7.0.1", "# v4.2.2", "comment says 'v4.2.2'", id="wrong-tag-comment"),
        pytest.param("actions/setup-python@", "someone/setup-python@", "not in", id="unknown"),
    ],
)
def test_pin_check_catches_a_bad_pin(old: str, new: str, expected: str) -> None:
    text = NIGHTLY_WORKFLOW.read_text(encoding="utf-8")
    assert old in text
    problems = pin_problems(text.replace(old, new), load_pins())
    assert any(expected in p for p in problems), problems


def test_every_run_script_passes_shellcheck() -> None:
    for workflow in workflow_files():
        assert shellcheck_problems(load_workflow(workflow)) == [], workflow.name


def test_shellcheck_catches_an_unquoted_variable(tmp_path: Path) -> None:
    broken = mutated_copy(tmp_path, 'rm -rf -- "$RUN_DIR"', "rm -rf -- $RUN_DIR")
    assert any("SC2086" in p for p in shellcheck_problems(load_workflow(broken)))


@pytest.mark.parametrize("path", REVIEWED_PATHS)
def test_codeowners_require_a_maintainer_for(path: str) -> None:
    assert (REPO_ROOT / path).exists(), path
    assert owners_of(path, codeowners_rules()), f"{path} has no code owner in {CODEOWNERS}"


def test_the_nightly_lane_keeps_its_invariants() -> None:
    assert nightly_workflow_problems(load_workflow(NIGHTLY_WORKFLOW)) == []


def test_the_pr_lane_keeps_its_invariants() -> None:
    assert pr_workflow_problems(load_workflow(PR_WORKFLOW)) == []


def test_workflow_on_key_survives_yaml_1_1() -> None:
    nightly, pr = load_workflow(NIGHTLY_WORKFLOW), load_workflow(PR_WORKFLOW)
    assert True not in nightly and True not in pr
    assert set(nightly["on"]) == {"workflow_dispatch", "schedule"}
    assert set(pr["on"]) == {"pull_request", "workflow_dispatch"}


SUMMARY_STEP = "      - name: Append the report to the job summary\n"
UPLOAD_STEP = "      - name: Upload the run dir\n"
CLEAN_STEP_BODY = '        run: |\n          rm -rf -- "$RUN_DIR"'
PREFLIGHT_STEP = "      - name: Preflight\n"
VERDICT_STEP = "      - name: Record the verdict in the run history\n"

BROKEN_NIGHTLIES = [
    pytest.param("        --device=/dev/kfd\n", "", "missing --device=/dev/kfd", id="no-kfd"),
    pytest.param("        --group-add render\n", "", "missing --group-add=render", id="no-render"),
    pytest.param("        --shm-size=64g\n", "", "missing --shm-size", id="no-shm"),
    pytest.param(
        "        --env HIP_VISIBLE_DEVICES\n",
        "",
        "missing --env=HIP_VISIBLE_DEVICES",
        id="runner-gpus-not-forwarded",
    ),
    pytest.param(
        "        --ipc=host\n",
        "        --privileged\n",
        "must not use --privileged",
        id="privileged",
    ),
    pytest.param(
        ":/root/datasets:ro", ":/data:ro", "nothing mounted at /root/datasets", id="no-data-cache"
    ),
    pytest.param(
        "'/data/miles_ci/hf_cache' }}:/root/.cache/huggingface:ro",
        "'/data/hf' }}:/root/.cache/huggingface:ro",
        "/root/.cache/huggingface must default to /data/miles_ci/hf_cache",
        id="not-the-fleets-cache",
    ),
    pytest.param(
        "|| 'rocm/sgl-dev:miles-rocm720-mi35x'",
        "|| 'rocm/sgl-dev:latest'",
        "is not rocm/sgl-dev:miles-rocm720-mi35x",
        id="other-image",
    ),
    pytest.param('"mi350","8gpu"]\')', '"mi350","4gpu"]\')', "not ['8gpu', 'amd'", id="4gpu"),
    pytest.param("    needs: cpu\n", "", "CPU suite first", id="no-cpu-first"),
    pytest.param(
        "aiter: [stock, patched, rccl]", "aiter: [stock]", "strategy.matrix.aiter", id="matrix"
    ),
    pytest.param("fail-fast: false", "fail-fast: true", "strategy.fail-fast", id="fail-fast"),
    pytest.param(
        "    continue-on-error: ${{ matrix.aiter == 'stock' }}\n",
        "",
        "the stock leg is informational",
        id="stock-leg-gates",
    ),
    pytest.param(
        "cancel-in-progress: false",
        "cancel-in-progress: true",
        "cancel-in-progress",
        id="cancel-in-progress",
    ),
    pytest.param(
        "  contents: read\n\n#",
        "  contents: write\n\n#",
        "permissions: must be exactly",
        id="write-permission",
    ),
    pytest.param(
        "    timeout-minutes: 260\n",
        "    timeout-minutes: 240\n",
        "must exceed the steps' sum",
        id="job-timeout-below-steps",
    ),
    pytest.param(
        "        timeout-minutes: 100\n",
        "        timeout-minutes: 60\n",
        "train step: timeout",
        id="run-timeout",
    ),
    pytest.param(
        "        timeout-minutes: 5\n" + CLEAN_STEP_BODY,
        CLEAN_STEP_BODY,
        "steps without timeout-minutes",
        id="unbounded-step",
    ),
    pytest.param(
        "miles-amd train --no-canary", "miles-amd train", "missing --no-canary", id="two-canaries"
    ),
    pytest.param(
        '            --aiter-variant "$AITER_VARIANT" \\\n            --num-rollouts',
        "            --aiter-variant stock \\\n            --num-rollouts",
        "train step: --aiter-variant must be the matrix variant",
        id="fixed-variant",
    ),
    pytest.param(
        '          --aiter-variant "$AITER_VARIANT"\n          --run-dir',
        "          --aiter-variant stock\n          --run-dir",
        "preflight step: --aiter-variant must be the matrix variant",
        id="preflight-fixed-variant",
    ),
    pytest.param(
        "--baseline auto --require-env \\\n            --num-rollouts",
        "--baseline patched --require-env \\\n            --num-rollouts",
        "no 'miles-amd gate --baseline auto' step",
        id="one-baseline-for-every-gpu",
    ),
    pytest.param(
        VERDICT_STEP + "        # The verdict",
        VERDICT_STEP.replace("Record", "Judge") + "        # The verdict",
        "",
        id="renamed-verdict-is-fine",
    ),
    pytest.param(
        "            runs/nightly/${{ matrix.aiter }}/env.json\n",
        "",
        "path misses ['env.json']",
        id="no-env-json",
    ),
    pytest.param(
        'miles-amd canary --variant "$AITER_VARIANT"',
        "miles-amd canary --variant stock",
        "canary step: --variant must be the matrix variant",
        id="canary-fixed-variant",
    ),
    pytest.param(
        UPLOAD_STEP + "        if: always()\n",
        UPLOAD_STEP,
        "upload step: needs if: always()",
        id="upload-not-always",
    ),
    pytest.param(
        SUMMARY_STEP + "        if: always()\n",
        SUMMARY_STEP,
        "summary step: needs",
        id="summary-not-always",
    ),
    pytest.param(
        PREFLIGHT_STEP,
        PREFLIGHT_STEP + "        env:\n          HF_TOKEN: ${{ secrets.HF_TOKEN }}\n",
        "only the run step may see a secret",
        id="secret-elsewhere",
    ),
    pytest.param(
        '--run-dir "$RUN_DIR"\n          --model-dir',
        "--run-dir ${{ env.RUN_DIR }}\n          --model-dir",
        "pass values through env",
        id="template-in-run",
    ),
    pytest.param(
        'rm -rf -- "$RUN_DIR"',
        'pkill -f ray; rm -rf -- "$RUN_DIR"',
        "never pkill",
        id="blanket-kill",
    ),
    pytest.param('-e "$src"', "aiter", "PyPI `aiter` is unrelated", id="pypi-aiter"),
    pytest.param(
        "actions/upload-artifact@bbbca2ddaa5d8feaa63e36b76fdaad77386f024f",
        "actions/upload-artifact@v7",
        "is not pinned to a commit SHA",
        id="tag-pinned-action",
    ),
    pytest.param(
        "          ref: ${{ github.event.repository.default_branch }}\n",
        "",
        "the commit's own baselines would judge it",
        id="judged-with-the-branchs-baselines",
    ),
    pytest.param(
        'echo "MILES_AMD_BASELINES_DIR=$PWD/.reviewed/baselines" >> "$GITHUB_ENV"',
        'echo "MILES_AMD_BASELINES_DIR=$PWD/baselines" >> "$GITHUB_ENV"',
        "MILES_AMD_BASELINES_DIR must name .reviewed/baselines",
        id="baselines-dir-is-the-commits",
    ),
    pytest.param(
        '      HF_HUB_OFFLINE: "1"\n',
        '      HF_HUB_OFFLINE: "1"\n      MILES_AMD_BASELINES_DIR: baselines\n',
        "MILES_AMD_BASELINES_DIR also set by env of ['job']",
        id="baselines-dir-overridden",
    ),
    pytest.param(
        "on:\n", "on:\n  pull_request:\n", "pull requests use amd-pr", id="nightly-on-prs"
    ),
    pytest.param("      num_rollouts:\n", "      rollouts:\n", "'num_rollouts'", id="no-input"),
    pytest.param('    - cron: "30 2 * * *"\n', '    - cron: "@daily"\n', "cron", id="no-cron"),
    pytest.param(
        "        run: python -m pytest\n",
        "        run: echo skipped\n",
        "needs a pytest step",
        id="cpu-job-without-pytest",
    ),
]


@pytest.mark.parametrize(("old", "new", "expected"), BROKEN_NIGHTLIES)
def test_invariant_checker_catches_a_broken_nightly(
    tmp_path: Path, old: str, new: str, expected: str
) -> None:
    problems = nightly_workflow_problems(load_workflow(mutated_copy(tmp_path, old, new)))
    if not expected:  # a harmless edit: the checker must not cry wolf
        assert problems == []
        return
    assert any(expected in p for p in problems), problems


BROKEN_PR_LANES = [
    pytest.param(
        "  pull_request:\n",
        '  pull_request:\n    paths: ["src/**"]\n',
        "on.pull_request.paths: a filtered pull request leaves a required check waiting",
        id="path-filter",
    ),
    pytest.param(
        '"mi350","4gpu"]\')', '"mi350","8gpu"]\')', "not ['4gpu', 'amd'", id="whole-node-labels"
    ),
    pytest.param(
        '      EXPECTED_GPUS: "4"\n',
        '      EXPECTED_GPUS: "8"\n',
        "EXPECTED_GPUS: must be 4",
        id="8-gpus",
    ),
    pytest.param(
        ' --run-dir "$dir" --num-gpus "$EXPECTED_GPUS"',
        ' --run-dir "$dir"',
        'miles-amd preflight needs --num-gpus "$EXPECTED_GPUS"',
        id="preflight-expects-a-node",
    ),
    pytest.param(
        '--run-dir="$RUN_ROOT/patched" --world-size "$EXPECTED_GPUS"',
        '--run-dir="$RUN_ROOT/patched"',
        'miles-amd canary needs --world-size "$EXPECTED_GPUS"',
        id="canary-at-8",
    ),
    pytest.param(
        "        continue-on-error: true\n",
        "",
        "continue-on-error only for stock",
        id="stock-gates-the-pr",
    ),
    pytest.param(
        '      - name: "Patched: canary at TP 4"\n',
        '      - name: "Patched: canary at TP 4"\n        continue-on-error: true\n',
        "continue-on-error only for stock",
        id="patched-canary-informational",
    ),
    pytest.param(
        '--shape "$SHAPE" --aiter-variant patched',
        '--shape "$SHAPE" --aiter-variant stock',
        "4-GPU smoke step: --aiter-variant must be patched",
        id="smoke-of-stock",
    ),
    pytest.param(
        "        timeout-minutes: 25\n        env:\n"
        "          AITER_PATCHED_DIR: /opt/aiter-patched\n",
        "        timeout-minutes: 25\n",
        "4-GPU smoke step: AITER_PATCHED_DIR must name the mounted build",
        id="smoke-on-the-images-aiter",
    ),
    pytest.param(
        "--baseline auto --require-env \\\n",
        "--baseline auto \\\n",
        "no 'verdict' step",
        id="verdict-without-the-node-env",
    ),
    pytest.param(
        "    name: AMD 4-GPU verdict (patched aiter)\n",
        "    name: AMD 4-GPU verdict (${{ github.event_name }})\n",
        "must be 'AMD 4-GPU verdict (patched aiter)' (the check to require)",
        id="unstable-check-name",
    ),
    pytest.param(
        "    if: github.event_name != 'pull_request' ||",
        "    if: true ||",
        "forks stay off",
        id="forks-reach-gpu",
    ),
    pytest.param(
        '          } >> "$GITHUB_STEP_SUMMARY"\n\n  baselines:',
        '          } >> "$GITHUB_STEP_SUMMARY"\n          exit 1\n\n  baselines:',
        "must not fail (a fork's author cannot fix it)",
        id="fork-red",
    ),
    pytest.param(
        '          echo "::notice title=AMD 4-GPU lane not run::',
        '          echo "::debug::',
        "must say why",
        id="fork-silent",
    ),
    pytest.param(
        '          exit "$worst"\n',
        "          exit 1\n",
        "must not fail (an admin override",
        id="changed-baselines-red",
    ),
    pytest.param(
        "          ref: ${{ github.event.pull_request.base.sha"
        " || github.event.repository.default_branch }}\n",
        "",
        "the commit's own baselines would judge it",
        id="pr-judged-with-its-own-baselines",
    ),
]


@pytest.mark.parametrize(("old", "new", "expected"), BROKEN_PR_LANES)
def test_invariant_checker_catches_a_broken_pr_lane(
    tmp_path: Path, old: str, new: str, expected: str
) -> None:
    copy = mutated_copy(tmp_path, old, new, workflow=PR_WORKFLOW)
    problems = pr_workflow_problems(load_workflow(copy))
    assert any(expected in p for p in problems), problems


def test_the_lanes_ask_for_the_gpus_their_runners_hold() -> None:
    """The PR lane: one 4-GPU runner of the fleet; the nightly: a whole 8-GPU node."""
    pr = load_workflow(PR_WORKFLOW)["jobs"][PR_JOB]
    nightly = load_workflow(NIGHTLY_WORKFLOW)["jobs"][NIGHTLY_JOB]
    assert runner_labels(pr["runs-on"]) == ["self-hosted", "amd", "mi350", "4gpu"]
    assert runner_labels(nightly["runs-on"]) == ["self-hosted", "amd", "mi350", "8gpu"]
    assert "vars.AMD_PR_RUNNER_LABELS" in pr["runs-on"]  # configurable
    assert "vars.AMD_NIGHTLY_RUNNER_LABELS" in nightly["runs-on"]
    assert (pr["env"]["EXPECTED_GPUS"], nightly["env"]["EXPECTED_GPUS"]) == ("4", "8")


def test_the_pr_lane_runs_stock_then_patched_then_the_smoke_and_its_verdict() -> None:
    steps = steps_of(load_workflow(PR_WORKFLOW)["jobs"][PR_JOB])
    named = [s["name"] for s in steps]
    gpu_part = named[
        named.index("Set up the suite") + 1 : named.index("Append the report to the job summary")
    ]
    assert gpu_part == [
        "Stock: preflight and canary (informational)",
        "Patched: preflight",
        "Patched: canary at TP 4",
        "Patched: 4-GPU smoke",
        "Patched: verdict on the evidence checks",
    ]
    informational = [s["name"] for s in steps if s.get("continue-on-error")]
    assert informational == ["Stock: preflight and canary (informational)"]
    smoke = steps[named.index("Patched: 4-GPU smoke")]["run"]
    assert '--shape "$SHAPE"' in smoke and '--num-rollouts "$NUM_ROLLOUTS"' in smoke
    job = load_workflow(PR_WORKFLOW)["jobs"][PR_JOB]
    assert (job["env"]["SHAPE"], job["env"]["NUM_ROLLOUTS"]) == ("4gpu", "2")


def test_the_check_names_a_repository_can_require() -> None:
    """docs/ci.md names the exact checks; the required one is constant (no expression) and
    reported on every pull request (no path filter)."""
    jobs = load_workflow(PR_WORKFLOW)["jobs"]
    names = {job["name"] for job in jobs.values()}
    assert set(PR_CHECKS) == names
    assert jobs[PR_JOB]["name"] == REQUIRED_CHECK and "${{" not in REQUIRED_CHECK
    assert load_workflow(PR_WORKFLOW)["on"]["pull_request"] is None  # no filter at all
    docs = (REPO_ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    section = docs.split("## Make it a required check", 1)[1].split("\n## ", 1)[0]
    for name in names:
        assert f"`{name}`" in section, name


def test_patched_aiter_has_no_moving_default() -> None:
    """The patched aiter is an exact commit: no branch fallback, and the step refuses a non-SHA."""
    steps = steps_of(load_workflow(NIGHTLY_WORKFLOW)["jobs"][NIGHTLY_JOB])
    index = find_step(steps, "aiter-src")
    assert index is not None, "amd-nightly.yml has no aiter-src step"
    build = steps[index]
    assert "'" not in build["env"]["AITER_REF"], build["env"]["AITER_REF"]
    assert "^[0-9a-f]{40}$" in build["run"]
