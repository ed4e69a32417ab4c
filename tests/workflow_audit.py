"""The hardware workflow's promises, each broken one named: pure, parsed YAML in, lines out.

:func:`mi355x_workflow_problems` reads ``amd-mi355x.yml`` (parsed by
``tests.workflow_yaml.load_workflow``) and names every broken promise: 8-GPU runner labels,
ROCm container options, the aiter matrix, evidence upload on ``always()``, the step summary,
timeout ordering, one run at a time, read-only permissions, the CPU job, the fork job, the
triggers and every job's hygiene; an empty list means the workflow is sound.
:func:`pin_problems` holds every ``uses:`` to ``.github/action-pins.json``;
:func:`owners_of` reads ``.github/CODEOWNERS`` as GitHub does. Runs no tool (those are in
``tests.workflow_tools``).

Learned on the way: zizmor's default ``unpinned-uses`` policy lets ``actions/*`` be pinned by
tag, so the SHA pins are checked here; a GitHub concurrency group keeps at most one pending
run, and a newer one replaces it even with ``cancel-in-progress: false``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tests.workflow_yaml import (
    REPO_ROOT,
    container_flags,
    expression_default,
    find_step,
    flag_value,
    junit_guard,
    mount_target,
    resolve_env,
    runner_labels,
    steps_of,
)

ACTION_PINS = REPO_ROOT / ".github" / "action-pins.json"
CODEOWNERS = REPO_ROOT / ".github" / "CODEOWNERS"
GPU_JOB = "mi355x"
CPU_JOB = "cpu"
REQUIRED_RUNNER_LABELS = frozenset({"self-hosted", "amd", "mi355x", "8gpu"})
IMAGE_REPOSITORY = "rocm/sgl-dev"
IMAGE_TAG = "miles-rocm720-mi35x"
REQUIRED_CONTAINER_FLAGS = (
    "--device=/dev/kfd",
    "--device=/dev/dri",
    "--group-add=video",
    "--group-add=render",
    "--ipc=host",
    "--security-opt=seccomp=unconfined",
    "--cap-add=SYS_PTRACE",
)
# A bigger blast radius than ROCm needs, or a shared PID namespace that would let the
# job's cleanup reach other jobs' processes.
FORBIDDEN_CONTAINER_FLAGS = ("--privileged", "--pid=host")
CACHE_MOUNT_TARGETS = ("/root/models", "/root/datasets")
AITER_VARIANTS = ["stock", "patched", "rccl"]
# Fork pull requests never run on the self-hosted node; they get a failing job instead of a
# skipped one, because a skipped check reads as a pass.
SAME_REPO_ONLY = (
    "github.event_name != 'pull_request' || "
    "github.event.pull_request.head.repo.full_name == github.repository"
)
FORK_PR_ONLY = (
    "github.event_name == 'pull_request' && "
    "github.event.pull_request.head.repo.full_name != github.repository"
)
FORK_JOB = "fork-pr"
BASELINES_JOB = "baselines"
BASELINES_DIR_ENV = "MILES_AMD_BASELINES_DIR"
BASE_REF = "github.event.pull_request.base.sha"
REVIEW_NEEDED = "baselines changed: review needed"
# The hardware test's own pytest-timeout (tests/mi355x): 5400 s.
TEST_TIMEOUT_MINUTES = 90
RUN_DIR_FILES = ("report.md", "report.json", "metrics.png", "job.log", "env.json", "canary.json")
# Everything the cpu job tests: a pull request touching any of it must run the workflow.
REQUIRED_PR_PATHS = (
    "src/**",
    "tests/**",
    "baselines/**",
    "examples/**",
    "benchmarks/**",
    "conftest.py",
    "pyproject.toml",
    "pytest.ini",
    "tox.ini",
    ".ci/**",
    ".github/**",
)
# What needs a maintainer's review: the references, the rules that judge against them, CI.
REVIEWED_PATHS = (
    "baselines/gpt_oss_20b_lora/8gpu/mi355x/stock.json",
    "src/miles_amd/rules/registry.py",
    "src/miles_amd/rules/kinds/all_below.py",
    "src/miles_amd/rules/bands.py",
    "src/miles_amd/baseline/baseline.schema.json",
    ".github/workflows/amd-mi355x.yml",
    ".github/action-pins.json",
)
DISPATCH_INPUTS = ("aiter_variant", "num_rollouts")
SHA_PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")
# `pip install ... aiter` with the bare PyPI name: an unrelated package, never AMD's.
PYPI_AITER_INSTALL = re.compile(r"pip3?\s+install\b[^\n]*(?<![\w/.-])aiter(?![\w/.-])")
BLANKET_KILL = re.compile(r"\b(pkill|killall)\b")


def trigger_problems(on: Any) -> list[str]:
    if not isinstance(on, dict):
        return ["on: must be a mapping with pull_request, workflow_dispatch and schedule"]
    problems = []
    paths = (on.get("pull_request") or {}).get("paths") or []
    problems += [
        f"on.pull_request.paths: missing {p!r}" for p in REQUIRED_PR_PATHS if p not in paths
    ]
    inputs = (on.get("workflow_dispatch") or {}).get("inputs") or {}
    problems += [
        f"on.workflow_dispatch.inputs: missing {name!r}"
        for name in DISPATCH_INPUTS
        if name not in inputs
    ]
    variant = inputs.get("aiter_variant") or {}
    if variant and not set(AITER_VARIANTS) <= set(variant.get("options") or []):
        problems.append(
            "on.workflow_dispatch.inputs.aiter_variant: must offer stock, patched and rccl"
        )
    crons = [c.get("cron") for c in on.get("schedule") or [] if isinstance(c, dict)]
    if not any(isinstance(c, str) and len(c.split()) == 5 for c in crons):
        problems.append("on.schedule: needs a nightly cron entry")
    return problems


def permission_problems(doc: Mapping[str, Any]) -> list[str]:
    problems = []
    if doc.get("permissions") != {"contents": "read"}:
        problems.append(
            f"permissions: must be exactly {{contents: read}}, got {doc.get('permissions')!r}"
        )
    for name, job in doc.get("jobs", {}).items():
        granted = job.get("permissions")
        if granted is not None and granted not in ({}, {"contents": "read"}):
            problems.append(f"jobs.{name}.permissions: grants more than contents: read")
    return problems


def concurrency_problems(doc: Mapping[str, Any], gpu_job: Mapping[str, Any]) -> list[str]:
    concurrency = gpu_job.get("concurrency") or doc.get("concurrency")
    if not isinstance(concurrency, dict) or not concurrency.get("group"):
        return ["concurrency: the GPU run needs a concurrency group (one run at a time)"]
    if concurrency.get("cancel-in-progress") is not False:
        return ["concurrency.cancel-in-progress: must be false (never kill a run midway)"]
    return []


def container_problems(job: Mapping[str, Any]) -> list[str]:
    container = job.get("container")
    if not isinstance(container, dict):
        return [f"jobs.{GPU_JOB}.container: missing"]
    problems = []
    image = str(container.get("image", ""))
    default = expression_default(image) if "${{" in image else image
    repository, _, reference = (default or "").partition("@")
    if reference:
        if repository != IMAGE_REPOSITORY or not reference.startswith("sha256:"):
            problems.append(f"container.image: {default!r} is not a {IMAGE_REPOSITORY} digest")
    elif not (default or "").startswith(f"{IMAGE_REPOSITORY}:{IMAGE_TAG}"):
        problems.append(
            f"container.image: default {default!r} is not {IMAGE_REPOSITORY}:{IMAGE_TAG}"
        )
    flags = container_flags(str(container.get("options", "")))
    problems += [
        f"container.options: missing {f}" for f in REQUIRED_CONTAINER_FLAGS if f not in flags
    ]
    if not any(f.startswith("--shm-size=") for f in flags):
        problems.append("container.options: missing --shm-size=<size>")
    problems += [
        f"container.options: must not use {f}" for f in FORBIDDEN_CONTAINER_FLAGS if f in flags
    ]
    targets = {mount_target(str(v)) for v in container.get("volumes") or []}
    problems += [
        f"container.volumes: nothing mounted at {t} (model/dataset cache)"
        for t in CACHE_MOUNT_TARGETS
        if t not in targets
    ]
    return problems


def gpu_runner_problems(job: Mapping[str, Any]) -> list[str]:
    problems = []
    labels = runner_labels(job.get("runs-on"))
    if labels is None:
        problems.append(f"jobs.{GPU_JOB}.runs-on: cannot read labels from {job.get('runs-on')!r}")
    elif missing := REQUIRED_RUNNER_LABELS - set(labels):
        problems.append(f"jobs.{GPU_JOB}.runs-on: missing labels {sorted(missing)}")
    if job.get("if") != SAME_REPO_ONLY:
        problems.append(f"jobs.{GPU_JOB}.if: must be {SAME_REPO_ONLY!r} (forks stay off the node)")
    if job.get("needs") != CPU_JOB:
        problems.append(f"jobs.{GPU_JOB}.needs: must be {CPU_JOB!r} (CPU suite first)")
    strategy = job.get("strategy") or {}
    if strategy.get("fail-fast") is not False:
        problems.append("strategy.fail-fast: must be false (each variant is its own verdict)")
    if (strategy.get("matrix") or {}).get("aiter") != AITER_VARIANTS:
        problems.append(f"strategy.matrix.aiter: must be {AITER_VARIANTS}")
    if str((job.get("env") or {}).get("EXPECTED_GPUS")) != "8":
        problems.append(f"jobs.{GPU_JOB}.env.EXPECTED_GPUS: must be 8 (a whole node)")
    return problems


def step_problems(job: Mapping[str, Any]) -> list[str]:
    """The steps exist in their order; the test step is complete; secrets stay in it."""
    steps = steps_of(job)
    order = {
        "wait for all GPUs": find_step(steps, "amd-smi", "rocm-smi", "HIP_VISIBLE_DEVICES"),
        "clean this variant's run dir": find_step(steps, 'rm -rf -- "$RUN_DIR"'),
        "set up the suite": find_step(steps, "pip install", "-e '.[test]'"),
        "miles-amd preflight": find_step(steps, "miles-amd preflight"),
        "miles-amd canary": find_step(steps, "miles-amd canary"),
        "pytest -m mi355x": find_step(steps, "pytest", "-m mi355x"),
    }
    problems = [f"steps: no {name!r} step" for name, index in order.items() if index is None]
    found = [(index, name) for name, index in order.items() if index is not None]
    if sorted(found) != found:
        problems.append(f"steps: expected the order {list(order)}")
    test = order["pytest -m mi355x"]
    if test is not None:
        problems += hardware_test_step_problems(job, steps[test])
    # env.json's variant sets the job env it records and is judged by; the canary tests the
    # all-reduce of the variant the run is
    for name, flag in (
        ("miles-amd preflight", "--aiter-variant"),
        ("miles-amd canary", "--variant"),
    ):
        index = order[name]
        if index is None:
            continue
        env = {**(job.get("env") or {}), **(steps[index].get("env") or {})}
        variant = flag_value(str(steps[index]["run"]), flag)
        if variant is None or resolve_env(variant, env).replace(" ", "") != "${{matrix.aiter}}":
            problems.append(f"{name.split()[1]} step: {flag} must be the matrix variant")
    for index, step in enumerate(steps):
        if "${{" in str(step.get("run", "")):
            problems.append(f"steps[{index}].run: pass values through env, not ${{{{ }}}}")
        if "secrets." in json.dumps(step) and index != test:
            problems.append(f"steps[{index}]: only the test step may see a secret")
    if "secrets." in json.dumps(job.get("env") or {}):
        problems.append(f"jobs.{GPU_JOB}.env: secrets belong to the test step's env only")
    return [*problems, *evidence_problems(steps), *timeout_problems(job, steps)]


def hardware_test_step_problems(job: Mapping[str, Any], step: Mapping[str, Any]) -> list[str]:
    script = str(step["run"])
    env = {**(job.get("env") or {}), **(step.get("env") or {})}
    problems = [
        f"test step: missing {flag}" for flag in ("--runslow", "--junitxml") if flag not in script
    ]
    variant = flag_value(script, "--aiter-variant")
    if variant is None or resolve_env(variant, env).replace(" ", "") != "${{matrix.aiter}}":
        problems.append("test step: --aiter-variant must be the matrix variant")
    if junit_guard(script) is None:
        problems.append("test step: no JUnit guard (a skipped hardware test must fail the job)")
    if not int(step.get("timeout-minutes", 0)) > TEST_TIMEOUT_MINUTES:
        problems.append(f"test step: timeout-minutes must exceed {TEST_TIMEOUT_MINUTES}")
    if "secrets.WANDB_API_KEY" not in str((step.get("env") or {}).get("WANDB_API_KEY")):
        problems.append("test step: WANDB_API_KEY must come from the secret via env")
    return problems


def evidence_problems(steps: Sequence[Mapping[str, Any]]) -> list[str]:
    problems = []
    uploads = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    if not uploads:
        problems.append("steps: no actions/upload-artifact step for the run dir")
    for upload in uploads:
        if upload.get("if") != "always()":
            problems.append("upload step: needs if: always() (failed runs need evidence most)")
        path = str((upload.get("with") or {}).get("path", ""))
        missing = [name for name in RUN_DIR_FILES if name not in path]
        if missing:
            problems.append(f"upload step: path misses {missing}")
    summary = find_step(steps, "GITHUB_STEP_SUMMARY", "report.md")
    if summary is None:
        problems.append("steps: no step appends report.md to $GITHUB_STEP_SUMMARY")
    elif steps[summary].get("if") != "always()":
        problems.append("summary step: needs if: always()")
    return problems


def timeout_problems(job: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]) -> list[str]:
    """Job timeout > sum of step timeouts, each step bounded, so always() steps get to run."""
    job_timeout = int(job.get("timeout-minutes", 0))
    problems = []
    if job_timeout <= TEST_TIMEOUT_MINUTES:
        problems.append(
            f"jobs.{GPU_JOB}.timeout-minutes: {job_timeout} must exceed the test's "
            f"{TEST_TIMEOUT_MINUTES}"
        )
    unbounded = [s.get("name", "?") for s in steps if "timeout-minutes" not in s]
    if unbounded:
        problems.append(f"steps without timeout-minutes: {unbounded}")
    total = sum(int(s.get("timeout-minutes", 0)) for s in steps)
    if job_timeout <= total:
        problems.append(
            f"jobs.{GPU_JOB}.timeout-minutes: {job_timeout} must exceed the steps' sum {total}"
        )
    return problems


def cpu_job_problems(job: Any) -> list[str]:
    if not isinstance(job, dict):
        return [f"jobs.{CPU_JOB}: missing (the CPU suite on a hosted runner)"]
    problems = []
    if job.get("runs-on") != "ubuntu-latest":
        problems.append(f"jobs.{CPU_JOB}.runs-on: must be ubuntu-latest")
    steps = steps_of(job)
    python = [s for s in steps if str(s.get("uses", "")).startswith("actions/setup-python@")]
    if not python or str((python[0].get("with") or {}).get("python-version")) != "3.11":
        problems.append(f"jobs.{CPU_JOB}: needs actions/setup-python with python-version 3.11")
    if find_step(steps, "pip install", "-e '.[test]'") is None:
        problems.append(f"jobs.{CPU_JOB}: needs pip install -e '.[test]'")
    if find_step(steps, "pytest") is None:
        problems.append(f"jobs.{CPU_JOB}: needs a pytest step")
    return problems


def fork_job_problems(job: Any) -> list[str]:
    if not isinstance(job, dict) or job.get("if") != FORK_PR_ONLY:
        return [f"jobs.{FORK_JOB}: needs if: {FORK_PR_ONLY!r}"]
    if find_step(steps_of(job), "exit 1") is None:
        return [f"jobs.{FORK_JOB}: must fail (a skipped GPU check would read as a pass)"]
    return []


def _base_checkout(steps: Sequence[Mapping[str, Any]]) -> tuple[int, str] | None:
    """The checkout step of the base branch's files and its path, if any."""
    for index, step in enumerate(steps):
        given = step.get("with") or {}
        if str(step.get("uses", "")).startswith("actions/checkout@") and BASE_REF in str(
            given.get("ref", "")
        ):
            return index, str(given.get("path", ""))
    return None


def reviewed_baselines_problems(job: Mapping[str, Any]) -> list[str]:
    """The hardware job judges with the base branch's baselines, never the pull request's:
    a checkout of the base ref, then MILES_AMD_BASELINES_DIR set to its baselines/ before
    the test step, and nothing else setting that variable."""
    steps = steps_of(job)
    base = _base_checkout(steps)
    if base is None or not base[1]:
        return [
            f"jobs.{GPU_JOB}: no checkout of {BASE_REF} into a path: the pull request's "
            "own baselines would judge it"
        ]
    index, path = base
    exports = [
        i
        for i, s in enumerate(steps)
        if f"{BASELINES_DIR_ENV}=" in str(s.get("run", "")) and "GITHUB_ENV" in str(s.get("run"))
    ]
    test = find_step(steps, "pytest", "-m mi355x")
    problems = []
    exported = [
        line
        for i in exports
        for line in str(steps[i]["run"]).splitlines()
        if f"{BASELINES_DIR_ENV}=" in line
    ]
    if not exported or any(f"/{path}/baselines" not in line for line in exported):
        problems.append(f"jobs.{GPU_JOB}: {BASELINES_DIR_ENV} must name {path}/baselines")
    elif not index < exports[0] < (test if test is not None else len(steps)):
        problems.append(f"jobs.{GPU_JOB}: {BASELINES_DIR_ENV} must be set before the test step")
    others = [
        name
        for name, env in [
            ("job", job.get("env")),
            *((s.get("name", "?"), s.get("env")) for s in steps),
        ]
        if BASELINES_DIR_ENV in (env or {})
    ]
    if others:
        problems.append(f"jobs.{GPU_JOB}: {BASELINES_DIR_ENV} also set by env of {others}")
    return problems


def baselines_job_problems(job: Any) -> list[str]:
    """A pull request that changes baselines/ shows the diff against its base and is red."""
    if not isinstance(job, dict) or job.get("if") != "github.event_name == 'pull_request'":
        return [f"jobs.{BASELINES_JOB}: needs if: github.event_name == 'pull_request'"]
    steps = steps_of(job)
    base = _base_checkout(steps)
    if base is None:
        return [f"jobs.{BASELINES_JOB}: no checkout of {BASE_REF}"]
    diff = find_step(steps, "miles-amd baseline diff")
    if diff is None:
        return [f"jobs.{BASELINES_JOB}: no miles-amd baseline diff step"]
    script = str(steps[diff]["run"])
    problems = []
    if "GITHUB_STEP_SUMMARY" not in script:
        problems.append(f"jobs.{BASELINES_JOB}: the diff must go to the job summary")
    if f"::error title={REVIEW_NEEDED}::" not in script or "exit 1" not in script:
        problems.append(f"jobs.{BASELINES_JOB}: a changed baseline must fail as {REVIEW_NEEDED!r}")
    if f"{base[1]}/baselines" not in script:
        problems.append(f"jobs.{BASELINES_JOB}: the diff must compare against {base[1]}/baselines")
    return problems


def hygiene_problems(doc: Mapping[str, Any]) -> list[str]:
    """Every job: actions pinned by SHA, checkout without credentials, no blanket kills."""
    problems = []
    for name, job in (doc.get("jobs") or {}).items():
        for index, step in enumerate(steps_of(job)):
            where = f"jobs.{name}.steps[{index}]"
            uses = step.get("uses")
            if uses is not None and not SHA_PINNED.match(str(uses)):
                problems.append(f"{where}.uses: {uses!r} is not pinned to a commit SHA")
            if (
                str(uses).startswith("actions/checkout@")
                and (step.get("with") or {}).get("persist-credentials") is not False
            ):
                problems.append(f"{where}: checkout needs persist-credentials: false")
            script = str(step.get("run", ""))
            if BLANKET_KILL.search(script):
                problems.append(f"{where}.run: never pkill/killall; stop this job's PIDs only")
            if PYPI_AITER_INSTALL.search(script):
                problems.append(f"{where}.run: PyPI `aiter` is unrelated; AMD's is amd-aiter")
    return problems


USES_LINE = re.compile(
    r"^\s*(?:-\s+)?uses:\s*(?P<action>[^@\s]+)@(?P<ref>\S+)(?:\s+#\s*(?P<tag>\S+))?"
)


def pin_problems(text: str, pins: Mapping[str, Any]) -> list[str]:
    """Every ``uses:`` names an action of the pin file, at its verified SHA, tag in a comment.

    A SHA of the right shape can still name no commit (GitHub then fails the job at "Set up
    job", before any step): only a SHA that was resolved from the tag in the action's own
    repository, recorded in ``.github/action-pins.json``, is accepted. Pins the workflows no
    longer use are stale and reported too.
    """
    problems, used = [], set()
    for number, line in enumerate(text.splitlines(), start=1):
        match = USES_LINE.match(line)
        if match is None:
            continue
        action, ref, tag = match["action"], match["ref"], match["tag"]
        used.add(action)
        pin = pins.get(action)
        if pin is None:
            problems.append(f"line {number}: {action} is not in {ACTION_PINS.name}")
        elif ref != pin["sha"]:
            problems.append(f"line {number}: {action}@{ref} is not the verified {pin['sha']}")
        elif tag != pin["tag"]:
            problems.append(f"line {number}: {action} comment says {tag!r}, pin is {pin['tag']}")
    return problems + [f"{a}: pinned but unused" for a in sorted(set(pins) - used)]


def load_pins() -> dict[str, Any]:
    return json.loads(ACTION_PINS.read_text(encoding="utf-8"))["actions"]


def mi355x_workflow_problems(doc: Mapping[str, Any]) -> list[str]:
    """Every broken promise of the hardware workflow, as one line each; [] means sound."""
    jobs = doc.get("jobs") or {}
    gpu_job = jobs.get(GPU_JOB)
    if not isinstance(gpu_job, dict):
        return [f"jobs.{GPU_JOB}: missing"]
    return [
        *trigger_problems(doc.get("on")),
        *permission_problems(doc),
        *concurrency_problems(doc, gpu_job),
        *gpu_runner_problems(gpu_job),
        *container_problems(gpu_job),
        *step_problems(gpu_job),
        *cpu_job_problems(jobs.get(CPU_JOB)),
        *fork_job_problems(jobs.get(FORK_JOB)),
        *reviewed_baselines_problems(gpu_job),
        *baselines_job_problems(jobs.get(BASELINES_JOB)),
        *hygiene_problems(doc),
    ]


def codeowners_rules() -> list[tuple[str, list[str]]]:
    rules = []
    for line in CODEOWNERS.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            pattern, *owners = line.split()
            rules.append((pattern, owners))
    return rules


def owners_of(path: str, rules: Sequence[tuple[str, list[str]]]) -> list[str]:
    """GitHub's rule: the last matching pattern wins (directory patterns end in ``/``)."""
    owners: list[str] = []
    for pattern, names in rules:
        anchored = pattern.lstrip("/")
        if (anchored.endswith("/") and path.startswith(anchored)) or path == anchored:
            owners = names
    return owners
