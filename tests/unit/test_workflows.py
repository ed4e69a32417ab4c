"""The CI workflows are valid, audited, and keep the promises the AMD gate depends on.

Three kinds of check, each shown able to fail by a mutated copy:

- schema: ``check-jsonschema --builtin-schema vendor.github-workflows`` accepts every file in
  ``.github/workflows/``;
- audit: ``zizmor --offline --persona pedantic`` reports no finding for any workflow, and
  the hardware workflow is also clean for the ``auditor`` persona. Findings a workflow
  accepts on purpose are silenced in the file itself with ``# zizmor: ignore[<audit>]``
  next to a comment that says why; shellcheck passes every ``run:`` script;
- invariants: ``tests.workflow_audit.mi355x_workflow_problems`` names every broken promise
  of ``amd-mi355x.yml``; action pins and code owners likewise.

The helpers live beside this file's package: reading (``tests.workflow_yaml``), the audit
(``tests.workflow_audit``), the tools run as processes (``tests.workflow_tools``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.workflow_audit import (
    ACTION_PINS,
    CODEOWNERS,
    GPU_JOB,
    REVIEWED_PATHS,
    codeowners_rules,
    load_pins,
    mi355x_workflow_problems,
    owners_of,
    pin_problems,
)
from tests.workflow_tools import (
    ZIZMOR_FINDING_EXIT_CODES,
    ZIZMOR_PERSONA,
    check_schema,
    junit_of,
    run_junit_guard,
    shellcheck_problems,
    zizmor,
)
from tests.workflow_yaml import (
    MI355X_WORKFLOW,
    REPO_ROOT,
    find_step,
    load_workflow,
    mutated_copy,
    steps_of,
    workflow_files,
)


def test_workflows_match_the_github_workflow_schema() -> None:
    result = check_schema(*workflow_files())
    assert result.returncode == 0, result.stdout + result.stderr


def test_schema_check_rejects_a_misspelt_key(tmp_path: Path) -> None:
    bad = mutated_copy(
        tmp_path,
        "    runs-on: ubuntu-latest\n    timeout-minutes: 30\n",
        "    run-on: ubuntu-latest\n    timeout-minutes: 30\n",
    )
    result = check_schema(bad)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "run-on" in result.stdout + result.stderr


@pytest.mark.parametrize("workflow", workflow_files(), ids=lambda p: p.name)
def test_zizmor_reports_no_finding(workflow: Path) -> None:
    result = zizmor(ZIZMOR_PERSONA, workflow)
    assert result.returncode == 0, (
        f"zizmor exit {result.returncode}:\n{result.stdout}{result.stderr}"
    )


def test_hardware_workflow_is_clean_for_the_auditor_persona() -> None:
    result = zizmor("auditor", MI355X_WORKFLOW)
    assert result.returncode == 0, (
        f"zizmor exit {result.returncode}:\n{result.stdout}{result.stderr}"
    )


def test_zizmor_reports_template_injection(tmp_path: Path) -> None:
    injected = mutated_copy(
        tmp_path,
        "      - name: Run the CPU suite\n",
        '      - name: Greet\n        run: echo "${{ github.event.pull_request.title }}"\n'
        "      - name: Run the CPU suite\n",
    )
    result = zizmor(ZIZMOR_PERSONA, injected)
    assert result.returncode in ZIZMOR_FINDING_EXIT_CODES, result.stdout + result.stderr
    assert "template-injection" in result.stdout


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
    text = MI355X_WORKFLOW.read_text(encoding="utf-8")
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


def test_hardware_workflow_keeps_its_invariants() -> None:
    assert mi355x_workflow_problems(load_workflow(MI355X_WORKFLOW)) == []


@pytest.mark.parametrize(
    ("test_source", "expected"),
    [
        pytest.param(
            "import pytest\n\ndef test_gpu():\n    pytest.skip('no GPU')\n",
            "0 mi355x tests ran, 1 skipped: no hardware evidence",
            id="skipped",
        ),
        pytest.param(
            "import pytest\n\ndef test_gpu():\n    assert True\n\n"
            "def test_other():\n    pytest.skip('needs an AMD GPU node')\n",
            "1 mi355x tests ran, 1 skipped: no hardware evidence",
            id="one-ran-one-skipped",
        ),
        pytest.param(
            "def helper():\n    pass\n",
            "0 mi355x tests ran, 0 skipped: no hardware evidence",
            id="nothing-ran",
        ),
    ],
)
def test_junit_guard_fails_a_run_without_evidence(
    tmp_path: Path, test_source: str, expected: str
) -> None:
    result = run_junit_guard(junit_of(tmp_path, test_source))
    assert result.returncode != 0
    assert expected in result.stderr, result.stderr


def test_junit_guard_passes_a_run_that_ran(tmp_path: Path) -> None:
    result = run_junit_guard(junit_of(tmp_path, "def test_gpu():\n    assert True\n"))
    assert result.returncode == 0, result.stderr


def test_junit_guard_allows_only_the_other_variants_skip(tmp_path: Path) -> None:
    source = (
        "import pytest\n\n@pytest.mark.parametrize('v', ['stock', 'patched'])\n"
        "def test_run(v):\n"
        "    if v == 'stock':\n"
        "        pytest.skip('other aiter variant: stock runs in its own leg')\n"
    )
    result = run_junit_guard(junit_of(tmp_path, source))
    assert result.returncode == 0, result.stderr


def test_workflow_on_key_survives_yaml_1_1() -> None:
    doc = load_workflow(MI355X_WORKFLOW)
    assert True not in doc
    assert set(doc["on"]) == {"pull_request", "workflow_dispatch", "schedule"}


SUMMARY_STEP = "      - name: Append the report to the job summary\n"
UPLOAD_STEP = "      - name: Upload the run dir\n"
CLEAN_STEP_BODY = '        run: |\n          rm -rf -- "$RUN_DIR"'
PREFLIGHT_STEP = "      - name: Preflight\n"

BROKEN_WORKFLOWS = [
    pytest.param("        --device=/dev/kfd\n", "", "missing --device=/dev/kfd", id="no-kfd"),
    pytest.param("        --group-add render\n", "", "missing --group-add=render", id="no-render"),
    pytest.param("        --shm-size=64g\n", "", "missing --shm-size", id="no-shm"),
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
        "|| 'rocm/sgl-dev:miles-rocm720-mi35x'",
        "|| 'rocm/sgl-dev:latest'",
        "is not rocm/sgl-dev:miles-rocm720-mi35x",
        id="other-image",
    ),
    pytest.param(
        '"mi355x","8gpu"]\')', '"mi355x","4gpu"]\')', "missing labels ['8gpu']", id="4gpu"
    ),
    pytest.param(
        "    if: github.event_name != 'pull_request' ||",
        "    if: true ||",
        "forks stay off",
        id="forks-reach-gpu",
    ),
    pytest.param("    needs: cpu\n", "", "CPU suite first", id="no-cpu-first"),
    pytest.param(
        'workflow there."\n          exit 1\n',
        'workflow there."\n',
        "must fail",
        id="fork-job-passes",
    ),
    pytest.param(
        "aiter: [stock, patched, rccl]", "aiter: [stock]", "strategy.matrix.aiter", id="matrix"
    ),
    pytest.param("fail-fast: false", "fail-fast: true", "strategy.fail-fast", id="fail-fast"),
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
        "    timeout-minutes: 90\n",
        "must exceed the test's 90",
        id="job-timeout-below-test",
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
        "test step: timeout",
        id="test-timeout",
    ),
    pytest.param(
        "        timeout-minutes: 5\n" + CLEAN_STEP_BODY,
        CLEAN_STEP_BODY,
        "steps without timeout-minutes",
        id="unbounded-step",
    ),
    pytest.param("--runslow \\\n", "\\\n", "missing --runslow", id="no-runslow"),
    pytest.param('python3 - "$RUN_ROOT', 'cat - "$RUN_ROOT', "no JUnit guard", id="no-junit-guard"),
    pytest.param(
        '            --aiter-variant "$AITER_VARIANT" \\\n',
        "            --aiter-variant stock \\\n",
        "test step: --aiter-variant must be the matrix variant",
        id="fixed-variant",
    ),
    pytest.param(
        '          --aiter-variant "$AITER_VARIANT"\n          --run-dir',
        "          --aiter-variant stock\n          --run-dir",
        "preflight step: --aiter-variant must be the matrix variant",
        id="preflight-fixed-variant",
    ),
    pytest.param(
        "            runs/mi355x/${{ matrix.aiter }}/env.json\n",
        "",
        "path misses ['env.json']",
        id="no-env-json",
    ),
    pytest.param(
        "            runs/mi355x/${{ matrix.aiter }}/canary.json\n",
        "",
        "path misses ['canary.json']",
        id="no-canary-json",
    ),
    pytest.param(
        'miles-amd canary --variant "$AITER_VARIANT"',
        "miles-amd canary --variant stock",
        "canary step: --variant must be the matrix variant",
        id="canary-fixed-variant",
    ),
    pytest.param(
        'miles-amd canary --variant "$AITER_VARIANT" --run-dir="$RUN_DIR" || status=$?',
        "true",
        "no 'miles-amd canary' step",
        id="no-canary",
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
        "only the test step may see a secret",
        id="secret-elsewhere",
    ),
    pytest.param(
        '--run-dir "$RUN_DIR"',
        "--run-dir ${{ env.RUN_DIR }}",
        "pass values through env",
        id="template-in-run",
    ),
    pytest.param(
        'rm -rf -- "$RUN_DIR"',
        'pkill -f ray; rm -rf -- "$RUN_DIR"',
        "never pkill",
        id="blanket-kill",
    ),
    pytest.param(
        '-e "$src"',
        "aiter",
        "PyPI `aiter` is unrelated",
        id="pypi-aiter",
    ),
    pytest.param(
        "actions/upload-artifact@bbbca2ddaa5d8feaa63e36b76fdaad77386f024f",
        "actions/upload-artifact@v7",
        "is not pinned to a commit SHA",
        id="tag-pinned-action",
    ),
    pytest.param(
        '      - "baselines/**"\n', "", "missing 'baselines/**'", id="baselines-untriggered"
    ),
    pytest.param(
        "          ref: ${{ github.event.pull_request.base.sha || "
        "github.event.repository.default_branch }}\n",
        "",
        "the pull request's own baselines would judge it",
        id="gpu-job-judges-with-the-prs-baselines",
    ),
    pytest.param(
        'echo "MILES_AMD_BASELINES_DIR=$PWD/.reviewed/baselines" >> "$GITHUB_ENV"',
        'echo "MILES_AMD_BASELINES_DIR=$PWD/baselines" >> "$GITHUB_ENV"',
        "MILES_AMD_BASELINES_DIR must name .reviewed/baselines",
        id="baselines-dir-is-the-prs",
    ),
    pytest.param(
        '      HF_HUB_OFFLINE: "1"\n',
        '      HF_HUB_OFFLINE: "1"\n      MILES_AMD_BASELINES_DIR: baselines\n',
        "MILES_AMD_BASELINES_DIR also set by env of ['job']",
        id="baselines-dir-overridden",
    ),
    pytest.param(
        "          exit 1\n\n  mi355x:",
        "          exit 0\n\n  mi355x:",
        "must fail as 'baselines changed: review needed'",
        id="changed-baselines-green",
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


@pytest.mark.parametrize(("old", "new", "expected"), BROKEN_WORKFLOWS)
def test_invariant_checker_catches_a_broken_workflow(
    tmp_path: Path, old: str, new: str, expected: str
) -> None:
    problems = mi355x_workflow_problems(load_workflow(mutated_copy(tmp_path, old, new)))
    assert any(expected in p for p in problems), problems


def test_patched_aiter_has_no_moving_default() -> None:
    """The patched aiter is an exact commit: no branch fallback, and the step refuses a non-SHA."""
    steps = steps_of(load_workflow(MI355X_WORKFLOW)["jobs"][GPU_JOB])
    index = find_step(steps, "aiter-src")
    assert index is not None, "amd-mi355x.yml has no aiter-src step"
    build = steps[index]
    assert "'" not in build["env"]["AITER_REF"], build["env"]["AITER_REF"]
    assert "^[0-9a-f]{40}$" in build["run"]
