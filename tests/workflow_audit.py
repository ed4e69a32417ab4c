"""The AMD lanes' promises, each broken one named: pure, parsed YAML in, lines out.

:func:`nightly_workflow_problems` reads ``amd-nightly.yml`` (the whole 8-GPU node, every
night) and :func:`pr_workflow_problems` ``amd-pr.yml`` (one 4-GPU runner, every pull request),
both parsed by ``tests.workflow_yaml.load_workflow``, and name every broken promise: runner
labels and the GPUs each lane expects, ROCm container options and the fleet's cache mounts,
which steps run and in which order, evidence upload on ``always()``, timeout ordering, one run
at a time, read-only permissions, the CPU job, the checks a repository can require (no path
filter, a fork told why without a red, a baseline change without a red), the triggers and
every job's hygiene; an empty list means the workflow is sound. :func:`pin_problems` holds
every ``uses:`` to ``.github/action-pins.json``; :func:`owners_of` reads CODEOWNERS as GitHub
does. Runs no tool (those are in ``tests.workflow_tools``).

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
    mount_target,
    resolve_env,
    runner_labels,
    steps_of,
)

ACTION_PINS = REPO_ROOT / ".github" / "action-pins.json"
CODEOWNERS = REPO_ROOT / ".github" / "CODEOWNERS"
NIGHTLY_JOB = "nightly"
PR_JOB = "amd-4gpu"
CPU_JOB = "cpu"
# The fleet's labels (miles' pr-test-rocm.yml at 31f1ca961: each MI350 host is two 4-GPU
# runners); the nightly keeps `8gpu`, a runner that holds the whole node.
NIGHTLY_LABELS = frozenset({"self-hosted", "amd", "mi350", "8gpu"})
PR_LABELS = frozenset({"self-hosted", "amd", "mi350", "4gpu"})
IMAGE_REPOSITORY = "rocm/sgl-dev"
IMAGE_TAG = "miles-rocm720-mi35x"
REQUIRED_CONTAINER_FLAGS = (
    "--device=/dev/kfd",
    "--device=/dev/dri",
    "--env=HIP_VISIBLE_DEVICES",
    "--group-add=video",
    "--group-add=render",
    "--ipc=host",
    "--security-opt=seccomp=unconfined",
    "--cap-add=SYS_PTRACE",
)
# A bigger blast radius than ROCm needs, or a shared PID namespace that would let the
# job's cleanup reach other jobs' processes.
FORBIDDEN_CONTAINER_FLAGS = ("--privileged", "--pid=host")
# container path -> the host path miles' ROCm CI mounts there (_run-ci-rocm.yml at 31f1ca961)
CACHE_MOUNTS = {
    "/root/models": "/data/miles_ci/models",
    "/root/datasets": "/data/miles_ci/datasets",
    "/root/.cache/huggingface": "/data/miles_ci/hf_cache",
}
AITER_VARIANTS = ["stock", "patched", "rccl"]
# Fork pull requests never run on the self-hosted runner.
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
DEFAULT_BRANCH = "github.event.repository.default_branch"
REVIEW_NEEDED = "baselines changed: review needed"
# The check to require (docs/ci.md, "Make it a required check"), and the other checks' names.
REQUIRED_CHECK = "AMD 4-GPU verdict (patched aiter)"
PR_CHECKS = (
    "CPU suite",
    REQUIRED_CHECK,
    "AMD 4-GPU lane: fork pull request",
    "Baselines against the base branch",
)
NIGHTLY_CHECK = "AMD 8-GPU nightly (${{ matrix.aiter }} aiter)"
# The nightly run's own timeout (`miles-amd train --timeout 5400`): 90 minutes.
RUN_TIMEOUT_MINUTES = 90
RUN_DIR_FILES = ("report.md", "report.json", "metrics.png", "job.log", "env.json", "canary.json")
# What needs a maintainer's review: the references, the rules that judge against them, CI.
REVIEWED_PATHS = (
    "baselines/gpt_oss_20b_lora/8gpu/mi355x/stock.json",
    "src/miles_amd/rules/registry.py",
    "src/miles_amd/rules/kinds.py",
    "src/miles_amd/rules/bands.py",
    "src/miles_amd/baseline/baseline.schema.json",
    ".github/workflows/amd-nightly.yml",
    ".github/workflows/amd-pr.yml",
    ".github/action-pins.json",
)
DISPATCH_INPUTS = ("aiter_variant", "num_rollouts")
SHA_PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")
# `pip install ... aiter` with the bare PyPI name: an unrelated package, never AMD's.
PYPI_AITER_INSTALL = re.compile(r"pip3?\s+install\b[^\n]*(?<![\w/.-])aiter(?![\w/.-])")
# `${{ secrets.X }}`: a secret given to a step (Python's `import secrets` in a script is not)
SECRET_EXPRESSION = re.compile(r"\$\{\{[^}]*\bsecrets\.")
BLANKET_KILL = re.compile(r"\b(pkill|killall)\b")


def nightly_trigger_problems(on: Any) -> list[str]:
    if not isinstance(on, dict):
        return ["on: must be a mapping with workflow_dispatch and schedule"]
    problems = []
    if "pull_request" in on:
        problems.append("on.pull_request: the nightly takes a whole node; pull requests use amd-pr")
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


def pr_trigger_problems(on: Any) -> list[str]:
    """Every pull request reports every check: a filter would leave a required one waiting."""
    if not isinstance(on, dict) or "pull_request" not in on:
        return ["on.pull_request: the per-PR lane must run on pull requests"]
    problems = []
    trigger = on.get("pull_request") or {}
    for key in ("paths", "paths-ignore", "branches", "branches-ignore"):
        if key in trigger:
            problems.append(
                f"on.pull_request.{key}: a filtered pull request leaves a required check waiting"
            )
    if "workflow_dispatch" not in on:
        problems.append("on.workflow_dispatch: a maintainer runs a fork's commit by dispatch")
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
        return ["container: missing"]
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
    mounts = {mount_target(str(v)): str(v) for v in container.get("volumes") or []}
    for target, host in CACHE_MOUNTS.items():
        volume = mounts.get(target)
        if volume is None:
            problems.append(f"container.volumes: nothing mounted at {target} (a cache)")
        elif expression_default(volume) != host or not volume.endswith(":ro"):
            problems.append(f"container.volumes: {target} must default to {host}, read-only")
    return problems


def runner_problems(job: Mapping[str, Any], where: str, labels: frozenset[str]) -> list[str]:
    found = runner_labels(job.get("runs-on"))
    if found is None:
        return [f"{where}.runs-on: cannot read labels from {job.get('runs-on')!r}"]
    if set(found) != labels:
        return [f"{where}.runs-on: default labels {sorted(found)}, not {sorted(labels)}"]
    return []


def expected_gpus_problems(job: Mapping[str, Any], where: str, gpus: int) -> list[str]:
    """The job expects ``gpus`` GPUs: its env says so, and every preflight and canary asks
    for that many (a default of 8 on a 4-GPU runner fails at once)."""
    env = job.get("env") or {}
    if str(env.get("EXPECTED_GPUS")) != str(gpus):
        return [f"{where}.env.EXPECTED_GPUS: must be {gpus}"]
    problems = []
    for index, step in enumerate(steps_of(job)):
        script = str(step.get("run", ""))
        for command, flag in (
            ("miles-amd preflight", "--num-gpus"),
            ("miles-amd canary", "--world-size"),
        ):
            if command in script and gpus != 8 and flag_value(script, flag) != "$EXPECTED_GPUS":
                problems.append(f'{where}.steps[{index}]: {command} needs {flag} "$EXPECTED_GPUS"')
    return problems


def nightly_job_problems(job: Mapping[str, Any]) -> list[str]:
    where = f"jobs.{NIGHTLY_JOB}"
    problems = runner_problems(job, where, NIGHTLY_LABELS)
    problems += expected_gpus_problems(job, where, 8)
    if "if" in job:
        problems.append(f"{where}.if: the nightly has no pull request to keep off the node")
    if job.get("needs") != CPU_JOB:
        problems.append(f"{where}.needs: must be {CPU_JOB!r} (CPU suite first)")
    if job.get("name") != NIGHTLY_CHECK:
        problems.append(f"{where}.name: must be {NIGHTLY_CHECK!r}")
    strategy = job.get("strategy") or {}
    if strategy.get("fail-fast") is not False:
        problems.append("strategy.fail-fast: must be false (each variant is its own verdict)")
    if (strategy.get("matrix") or {}).get("aiter") != AITER_VARIANTS:
        problems.append(f"strategy.matrix.aiter: must be {AITER_VARIANTS}")
    if str(job.get("continue-on-error")).replace(" ", "") != "${{matrix.aiter=='stock'}}":
        problems.append(f"{where}.continue-on-error: the stock leg is informational (issue 33)")
    return problems


def pr_job_problems(job: Mapping[str, Any]) -> list[str]:
    where = f"jobs.{PR_JOB}"
    problems = runner_problems(job, where, PR_LABELS)
    problems += expected_gpus_problems(job, where, 4)
    if job.get("if") != SAME_REPO_ONLY:
        problems.append(f"{where}.if: must be {SAME_REPO_ONLY!r} (forks stay off the runner)")
    if job.get("needs") != CPU_JOB:
        problems.append(f"{where}.needs: must be {CPU_JOB!r} (CPU suite first)")
    if job.get("name") != REQUIRED_CHECK:
        problems.append(f"{where}.name: must be {REQUIRED_CHECK!r} (the check to require)")
    if "strategy" in job or "continue-on-error" in job:
        problems.append(f"{where}: one verdict, patched's: no matrix, no job continue-on-error")
    env = job.get("env") or {}
    if env.get("SHAPE") != "4gpu":
        problems.append(f"{where}.env.SHAPE: must be 4gpu (the recipe's 4-GPU shape)")
    return problems


def _variant_word(step: Mapping[str, Any], job: Mapping[str, Any], flag: str) -> str | None:
    env = {**(job.get("env") or {}), **(step.get("env") or {})}
    word = flag_value(str(step.get("run", "")), flag)
    return None if word is None else resolve_env(word, env).replace(" ", "")


def nightly_step_problems(job: Mapping[str, Any]) -> list[str]:
    """The steps exist in their order; the run and the verdict are the variant's."""
    steps = steps_of(job)
    order = {
        "wait for all GPUs": find_step(steps, "amd-smi", "rocm-smi", "HIP_VISIBLE_DEVICES"),
        "clean this variant's run dir": find_step(steps, 'rm -rf -- "$RUN_DIR"'),
        "set up the suite": find_step(steps, "pip install", "-e '.[test]'"),
        "miles-amd preflight": find_step(steps, "miles-amd preflight"),
        "miles-amd canary": find_step(steps, "miles-amd canary"),
        "miles-amd train": find_step(steps, "miles-amd train"),
        "miles-amd gate --baseline auto": find_step(steps, "miles-amd gate", "--baseline auto"),
    }
    problems = [f"steps: no {name!r} step" for name, index in order.items() if index is None]
    found = [(index, name) for name, index in order.items() if index is not None]
    if sorted(found) != found:
        problems.append(f"steps: expected the order {list(order)}")
    for name, flag in (
        ("miles-amd preflight", "--aiter-variant"),
        ("miles-amd canary", "--variant"),
        ("miles-amd train", "--aiter-variant"),
    ):
        index = order[name]
        if index is not None and _variant_word(steps[index], job, flag) != "${{matrix.aiter}}":
            problems.append(f"{name.split()[1]} step: {flag} must be the matrix variant")
    train, gate = order["miles-amd train"], order["miles-amd gate --baseline auto"]
    if train is not None:
        problems += run_step_problems(steps[train], minimum=RUN_TIMEOUT_MINUTES)
        if "secrets.WANDB_API_KEY" not in str((steps[train].get("env") or {}).get("WANDB_API_KEY")):
            problems.append("train step: WANDB_API_KEY must come from the secret via env")
    if gate is not None:
        problems += verdict_step_problems(steps[gate])
    problems += secret_problems(job, steps, allowed=train)
    return [*problems, *evidence_problems(steps), *timeout_problems(job, steps)]


def pr_step_problems(job: Mapping[str, Any]) -> list[str]:
    """Stock's preflight and canary (informational), patched's preflight and canary, the
    4-GPU smoke, its verdict on the evidence checks: in that order, each the lane's."""
    steps = steps_of(job)
    order = {
        "wait for the GPUs": find_step(steps, "amd-smi", "HIP_VISIBLE_DEVICES"),
        "set up the suite": find_step(steps, "pip install", "-e '.[test]'"),
        "stock preflight and canary": find_step(
            steps, "preflight --aiter-variant stock", "canary --variant stock"
        ),
        "patched preflight": find_step(steps, "miles-amd preflight", "--aiter-variant patched"),
        "patched canary": find_step(steps, "miles-amd canary --variant patched"),
        "4-GPU smoke": find_step(steps, "miles-amd train", '--shape "$SHAPE"'),
        "verdict": find_step(steps, "miles-amd gate", "--baseline auto", "--require-env"),
    }
    problems = [f"steps: no {name!r} step" for name, index in order.items() if index is None]
    found = [(index, name) for name, index in order.items() if index is not None]
    if sorted(found) != found:
        problems.append(f"steps: expected the order {list(order)}")
    for name, index in order.items():
        if index is None:
            continue
        informational = steps[index].get("continue-on-error") is True
        if informational != (name == "stock preflight and canary"):
            problems.append(
                f"{name} step: continue-on-error only for stock (the control), never patched"
            )
        if name.startswith("patched") or name == "4-GPU smoke":
            patched_dir = (steps[index].get("env") or {}).get("AITER_PATCHED_DIR")
            if patched_dir != "/opt/aiter-patched":
                problems.append(f"{name} step: AITER_PATCHED_DIR must name the mounted build")
    smoke, verdict = order["4-GPU smoke"], order["verdict"]
    if smoke is not None:
        problems += run_step_problems(steps[smoke], minimum=0)
        if _variant_word(steps[smoke], job, "--aiter-variant") != "patched":
            problems.append("4-GPU smoke step: --aiter-variant must be patched")
    if verdict is not None:
        problems += verdict_step_problems(steps[verdict])
    problems += secret_problems(job, steps, allowed=None)
    return [*problems, *evidence_problems(steps), *timeout_problems(job, steps)]


def run_step_problems(step: Mapping[str, Any], *, minimum: int) -> list[str]:
    script = str(step["run"])
    problems = [f"train step: missing {flag}" for flag in ("--no-canary",) if flag not in script]
    if not int(step.get("timeout-minutes", 0)) > minimum:
        problems.append(f"train step: timeout-minutes must exceed {minimum}")
    if "::stop-commands::" not in script:
        problems.append("train step: model text must not be read as workflow commands")
    return problems


def verdict_step_problems(step: Mapping[str, Any]) -> list[str]:
    """The verdict judges a red run too (``always()``) and needs the node's env.json."""
    problems = []
    if step.get("if") != "always()":
        problems.append("verdict step: needs if: always() (a red run is judged and recorded)")
    if "--require-env" not in str(step.get("run")):
        problems.append("verdict step: needs --require-env (the hardware path)")
    return problems


def secret_problems(
    job: Mapping[str, Any], steps: Sequence[Mapping[str, Any]], *, allowed: int | None
) -> list[str]:
    problems = []
    for index, step in enumerate(steps):
        if "${{" in str(step.get("run", "")):
            problems.append(f"steps[{index}].run: pass values through env, not ${{{{ }}}}")
        if SECRET_EXPRESSION.search(json.dumps(step)) and index != allowed:
            problems.append(f"steps[{index}]: only the run step may see a secret")
    if SECRET_EXPRESSION.search(json.dumps(job.get("env") or {})):
        problems.append("env: secrets belong to the run step's env only")
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
    unbounded = [s.get("name", "?") for s in steps if "timeout-minutes" not in s]
    if unbounded:
        problems.append(f"steps without timeout-minutes: {unbounded}")
    total = sum(int(s.get("timeout-minutes", 0)) for s in steps)
    if job_timeout <= total:
        problems.append(f"timeout-minutes: {job_timeout} must exceed the steps' sum {total}")
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
    """A fork's pull request is told why, without a red: the required check stays pending."""
    if not isinstance(job, dict) or job.get("if") != FORK_PR_ONLY:
        return [f"jobs.{FORK_JOB}: needs if: {FORK_PR_ONLY!r}"]
    steps = steps_of(job)
    if find_step(steps, "::notice") is None:
        return [f"jobs.{FORK_JOB}: must say why (a ::notice) the GPU lane did not run"]
    if find_step(steps, "exit 1") is not None:
        return [f"jobs.{FORK_JOB}: must not fail (a fork's author cannot fix it)"]
    if job.get("name") == REQUIRED_CHECK:
        return [f"jobs.{FORK_JOB}: must not carry the required check's name (green, no evidence)"]
    return []


def _checkout_of(steps: Sequence[Mapping[str, Any]], ref: str) -> tuple[int, str] | None:
    """The checkout step of ``ref``'s files and its path, if any."""
    for index, step in enumerate(steps):
        given = step.get("with") or {}
        if str(step.get("uses", "")).startswith("actions/checkout@") and ref in str(
            given.get("ref", "")
        ):
            return index, str(given.get("path", ""))
    return None


def reviewed_baselines_problems(job: Mapping[str, Any], ref: str) -> list[str]:
    """The GPU job judges with the reviewed baselines (``ref``'s), never its commit's: a
    checkout of ``ref``, then MILES_AMD_BASELINES_DIR set to its baselines/ before the verdict,
    and nothing else setting that variable."""
    steps = steps_of(job)
    base = _checkout_of(steps, ref)
    if base is None or not base[1]:
        return [f"no checkout of {ref} into a path: the commit's own baselines would judge it"]
    index, path = base
    exports = [
        i
        for i, s in enumerate(steps)
        if f"{BASELINES_DIR_ENV}=" in str(s.get("run", "")) and "GITHUB_ENV" in str(s.get("run"))
    ]
    verdict = find_step(steps, "miles-amd gate")
    problems = []
    exported = [
        line
        for i in exports
        for line in str(steps[i]["run"]).splitlines()
        if f"{BASELINES_DIR_ENV}=" in line
    ]
    if not exported or any(f"/{path}/baselines" not in line for line in exported):
        problems.append(f"{BASELINES_DIR_ENV} must name {path}/baselines")
    elif not index < exports[0] < (verdict if verdict is not None else len(steps)):
        problems.append(f"{BASELINES_DIR_ENV} must be set before the verdict")
    others = [
        name
        for name, env in [
            ("job", job.get("env")),
            *((s.get("name", "?"), s.get("env")) for s in steps),
        ]
        if BASELINES_DIR_ENV in (env or {})
    ]
    if others:
        problems.append(f"{BASELINES_DIR_ENV} also set by env of {others}")
    return problems


def baselines_job_problems(job: Any) -> list[str]:
    """A pull request that changes baselines/ shows the diff against its base, as a warning:
    the code owners' review decides, no admin override."""
    if not isinstance(job, dict) or job.get("if") != "github.event_name == 'pull_request'":
        return [f"jobs.{BASELINES_JOB}: needs if: github.event_name == 'pull_request'"]
    steps = steps_of(job)
    base = _checkout_of(steps, BASE_REF)
    if base is None:
        return [f"jobs.{BASELINES_JOB}: no checkout of {BASE_REF}"]
    diff = find_step(steps, "miles-amd baseline diff")
    if diff is None:
        return [f"jobs.{BASELINES_JOB}: no miles-amd baseline diff step"]
    script = str(steps[diff]["run"])
    problems = []
    if "GITHUB_STEP_SUMMARY" not in script:
        problems.append(f"jobs.{BASELINES_JOB}: the diff must go to the job summary")
    if f"::warning title={REVIEW_NEEDED}::" not in script:
        problems.append(f"jobs.{BASELINES_JOB}: a changed baseline must warn {REVIEW_NEEDED!r}")
    if "exit 1" in script:
        problems.append(
            f"jobs.{BASELINES_JOB}: a changed baseline must not fail (an admin override to "
            "merge); CODEOWNERS' review decides"
        )
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


def _prefixed(where: str, problems: list[str]) -> list[str]:
    return [
        p if p.startswith(("jobs.", "on", "permissions", "concurrency")) else f"{where}: {p}"
        for p in problems
    ]


def nightly_workflow_problems(doc: Mapping[str, Any]) -> list[str]:
    """Every broken promise of the nightly lane, one line each; [] means sound."""
    jobs = doc.get("jobs") or {}
    job = jobs.get(NIGHTLY_JOB)
    if not isinstance(job, dict):
        return [f"jobs.{NIGHTLY_JOB}: missing"]
    where = f"jobs.{NIGHTLY_JOB}"
    return [
        *nightly_trigger_problems(doc.get("on")),
        *permission_problems(doc),
        *concurrency_problems(doc, job),
        *nightly_job_problems(job),
        *_prefixed(where, container_problems(job)),
        *_prefixed(where, nightly_step_problems(job)),
        *cpu_job_problems(jobs.get(CPU_JOB)),
        *_prefixed(where, reviewed_baselines_problems(job, DEFAULT_BRANCH)),
        *hygiene_problems(doc),
    ]


def pr_workflow_problems(doc: Mapping[str, Any]) -> list[str]:
    """Every broken promise of the per-PR lane, one line each; [] means sound."""
    jobs = doc.get("jobs") or {}
    job = jobs.get(PR_JOB)
    if not isinstance(job, dict):
        return [f"jobs.{PR_JOB}: missing"]
    where = f"jobs.{PR_JOB}"
    names = [j.get("name") for j in jobs.values() if isinstance(j, dict)]
    return [
        *pr_trigger_problems(doc.get("on")),
        *permission_problems(doc),
        *concurrency_problems(doc, job),
        *pr_job_problems(job),
        *_prefixed(where, container_problems(job)),
        *_prefixed(where, pr_step_problems(job)),
        *cpu_job_problems(jobs.get(CPU_JOB)),
        *fork_job_problems(jobs.get(FORK_JOB)),
        *_prefixed(where, reviewed_baselines_problems(job, BASE_REF)),
        *baselines_job_problems(jobs.get(BASELINES_JOB)),
        *[f"jobs: no check named {n!r}" for n in PR_CHECKS if n not in names],
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
