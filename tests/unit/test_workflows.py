"""The CI workflows are valid, audited, and keep the promises the AMD gate depends on.

Three kinds of check, each shown able to fail by a mutated copy:

- schema: ``check-jsonschema --builtin-schema vendor.github-workflows`` (the schema is
  vendored in the tool, so it runs offline) accepts every file in ``.github/workflows/``;
- audit: ``zizmor --offline --persona pedantic`` reports no finding for any workflow, and
  the hardware workflow is also clean for the ``auditor`` persona. Findings a workflow
  accepts on purpose are silenced in the file itself with ``# zizmor: ignore[<audit>]``
  next to a comment that says why;
- invariants: :func:`mi355x_workflow_problems` reads ``amd-mi355x.yml`` and names every
  broken promise (8-GPU runner labels, ROCm container options, the aiter matrix, evidence
  upload on ``always()``, the step summary, timeout ordering, one run at a time,
  read-only permissions, the CPU job, the triggers). It is pure: parsed YAML in, a list
  of problems out; empty means the workflow is sound.

Quirks learned on the way (zizmor 1.32, check-jsonschema 0.39, PyYAML 6):

- PyYAML speaks YAML 1.1, where the bare key ``on`` is the boolean ``True``.
- zizmor exit codes: 0 no findings, 1 error, 10-14 findings whose highest severity is
  unknown / informational / low / medium / high. ``--offline`` disables the online audits
  and remote fetches; a ``GH_TOKEN``/``GITHUB_TOKEN`` in the environment would otherwise
  switch zizmor to online mode, so those are removed from the child's environment.
- zizmor's default ``regular`` persona suppresses code smells (e.g. a tag-pinned image,
  a missing workflow concurrency); ``pedantic`` reports them, ``auditor`` adds findings
  that need runtime context (every self-hosted runner).
- zizmor's default ``unpinned-uses`` policy lets ``actions/*`` be pinned by tag; this suite
  demands a full commit SHA for every action, so the invariants check that.
- A GitHub concurrency group keeps at most one pending run; a newer one replaces it even
  with ``cancel-in-progress: false``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS_DIR = REPO_ROOT / ".github" / "workflows"
MI355X_WORKFLOW = WORKFLOWS_DIR / "amd-mi355x.yml"
ACTION_PINS = REPO_ROOT / ".github" / "action-pins.json"

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
# The hardware test's own pytest-timeout (tests/mi355x): 5400 s.
TEST_TIMEOUT_MINUTES = 90
RUN_DIR_FILES = ("report.md", "report.json", "metrics.png", "job.log", "env.json")
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
CODEOWNERS = REPO_ROOT / ".github" / "CODEOWNERS"
# What needs a maintainer's review: the references, the rules that judge against them, CI.
REVIEWED_PATHS = (
    "baselines/gpt_oss_20b_lora/stock.json",
    "src/miles_amd/rules/registry.py",
    "src/miles_amd/rules/kinds/all_below.py",
    "src/miles_amd/rules/bands.py",
    "src/miles_amd/baseline/baseline.schema.json",
    ".github/workflows/amd-mi355x.yml",
    ".github/action-pins.json",
)
GITHUB_EXPRESSION = re.compile(r"\$\{\{.*?\}\}", re.S)
DISPATCH_INPUTS = ("aiter_variant", "num_rollouts")
SHA_PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")
# `pip install ... aiter` with the bare PyPI name: an unrelated package, never AMD's.
PYPI_AITER_INSTALL = re.compile(r"pip3?\s+install\b[^\n]*(?<![\w/.-])aiter(?![\w/.-])")
BLANKET_KILL = re.compile(r"\b(pkill|killall)\b")
ZIZMOR_PERSONA = "pedantic"
ZIZMOR_FINDING_EXIT_CODES = range(10, 15)


# --- reading the workflow -----------------------------------------------------------------


def load_workflow(path: Path) -> dict[str, Any]:
    """Parse a workflow file; the YAML 1.1 key ``True`` (from ``on:``) becomes ``"on"``."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a YAML mapping")
    if True in doc:
        doc["on"] = doc.pop(True)
    return doc


def expression_default(value: str) -> str | None:
    """The quoted fallback literal of ``${{ vars.X || '<literal>' }}``, else ``None``."""
    match = re.search(r"\$\{\{.*'([^']+)'\s*\)?\s*\}\}", value)
    return match.group(1) if match else None


def runner_labels(runs_on: Any) -> list[str] | None:
    """Labels of ``runs-on``: a list, or the JSON default of a ``fromJSON(...)`` expression."""
    if isinstance(runs_on, list):
        return [str(label) for label in runs_on]
    if isinstance(runs_on, str):
        if "${{" not in runs_on:
            return [runs_on]
        default = expression_default(runs_on)
        if default is not None:
            try:
                labels = json.loads(default)
            except json.JSONDecodeError:
                return None
            if isinstance(labels, list):
                return [str(label) for label in labels]
    return None


def container_flags(options: str) -> set[str]:
    """Docker options normalised to ``--flag=value`` (``--group-add video`` too)."""
    flags: set[str] = set()
    tokens = shlex.split(options)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        takes_value = "=" not in token and i + 1 < len(tokens)
        if token.startswith("--") and takes_value and not tokens[i + 1].startswith("-"):
            flags.add(f"{token}={tokens[i + 1]}")
            i += 2
        else:
            flags.add(token)
            i += 1
    return flags


def mount_target(volume: str) -> str | None:
    """The container side of ``<host>:<target>[:ro|:rw]`` (the host may be an expression)."""
    match = re.search(r":(/[^:]*)(?::r[ow])?$", volume)
    return match.group(1) if match else None


def steps_of(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    steps = job.get("steps")
    return [s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []


def find_step(steps: Sequence[Mapping[str, Any]], *needles: str) -> int | None:
    """Index of the first step whose ``run`` script contains every needle."""
    for index, step in enumerate(steps):
        script = step.get("run")
        if isinstance(script, str) and all(n in script for n in needles):
            return index
    return None


def flag_value(script: str, flag: str) -> str | None:
    """The word after ``flag`` in a shell script (``--flag value`` or ``--flag=value``)."""
    match = re.search(rf"{re.escape(flag)}(?:=|\s+)(\"[^\"]*\"|'[^']*'|\S+)", script)
    return match.group(1).strip("\"'") if match else None


def junit_guard(script: str) -> str | None:
    """The ``python3 - <junit> <<'PY' ... PY`` heredoc that fails a run that skipped."""
    match = re.search(r"python3 - [^\n]*<<'PY'\n(.*?)\nPY\n", script, re.DOTALL)
    return match.group(1) if match else None


def resolve_env(word: str, env: Mapping[str, Any]) -> str:
    """``$NAME`` / ``${NAME}`` looked up in the step's and job's ``env``; else the word."""
    match = re.fullmatch(r"\$\{?(\w+)\}?", word)
    return str(env.get(match.group(1), word)) if match else word


# --- the invariants -----------------------------------------------------------------------


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
        "pytest -m mi355x": find_step(steps, "pytest", "-m mi355x"),
    }
    problems = [f"steps: no {name!r} step" for name, index in order.items() if index is None]
    found = [(index, name) for name, index in order.items() if index is not None]
    if sorted(found) != found:
        problems.append(f"steps: expected the order {list(order)}")
    test = order["pytest -m mi355x"]
    if test is not None:
        problems += hardware_test_step_problems(job, steps[test])
    preflight = order["miles-amd preflight"]
    if preflight is not None:  # env.json's variant sets the job env it records and is judged by
        env = {**(job.get("env") or {}), **(steps[preflight].get("env") or {})}
        variant = flag_value(str(steps[preflight]["run"]), "--aiter-variant")
        if variant is None or resolve_env(variant, env).replace(" ", "") != "${{matrix.aiter}}":
            problems.append("preflight step: --aiter-variant must be the matrix variant")
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
        *hygiene_problems(doc),
    ]


# --- the tools ----------------------------------------------------------------------------


def tool(name: str) -> Path:
    """The CLI installed next to this interpreter (the test extra), else on PATH, else skip."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return beside
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed: pip install -e '.[test]' provides it")
    return Path(found)


def run_tool(*argv: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run offline: no GitHub token reaches the child, colours off."""
    env = {k: v for k, v in os.environ.items() if k not in ("GH_TOKEN", "GITHUB_TOKEN")}
    env.pop("ZIZMOR_GITHUB_TOKEN", None)
    env["NO_COLOR"] = "1"
    return subprocess.run(
        [str(a) for a in argv],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def zizmor(persona: str, *paths: Path) -> subprocess.CompletedProcess[str]:
    return run_tool(
        tool("zizmor"),
        "--offline",
        "--persona",
        persona,
        "--no-progress",
        "--color",
        "never",
        *paths,
    )


def check_schema(*paths: Path) -> subprocess.CompletedProcess[str]:
    return run_tool(tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows", *paths)


def hardware_test_script() -> str:
    steps = steps_of(load_workflow(MI355X_WORKFLOW)["jobs"][GPU_JOB])
    index = find_step(steps, "pytest", "-m mi355x")
    assert index is not None, "amd-mi355x.yml has no pytest -m mi355x step"
    return str(steps[index]["run"])


def junit_of(tmp_path: Path, test_source: str) -> Path:
    """A real JUnit file: pytest runs ``test_source`` in an empty project under tmp_path."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    (project / "test_sample.py").write_text(test_source, encoding="utf-8")
    junit = tmp_path / "junit.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert junit.is_file(), f"pytest wrote no {junit}"
    return junit


def run_junit_guard(junit: Path) -> subprocess.CompletedProcess[str]:
    guard = junit_guard(hardware_test_script())
    assert guard is not None, "the hardware test step has no JUnit guard"
    return subprocess.run(
        [sys.executable, "-", str(junit)],
        input=guard,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def workflow_files() -> list[Path]:
    files = sorted([*WORKFLOWS_DIR.glob("*.yml"), *WORKFLOWS_DIR.glob("*.yaml")])
    assert MI355X_WORKFLOW in files, f"{MI355X_WORKFLOW} is missing"
    return files


def mutated_copy(tmp_path: Path, old: str, new: str) -> Path:
    """amd-mi355x.yml with one exact, unique fragment replaced, under tmp_path."""
    text = MI355X_WORKFLOW.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"mutation anchor {old!r} must occur exactly once"
    target = tmp_path / ".github" / "workflows" / MI355X_WORKFLOW.name
    target.parent.mkdir(parents=True)
    target.write_text(text.replace(old, new), encoding="utf-8")
    return target


# --- tests --------------------------------------------------------------------------------


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


def shellcheck_problems(doc: Mapping[str, Any]) -> list[str]:
    """shellcheck's findings for every ``run:`` script, as bash (the shell these jobs use).

    ``${{ ... }}`` expressions are replaced by a plain word first: GitHub substitutes them
    before the shell runs, and the invariants above already keep them out of scripts.
    """
    problems = []
    for name, job in (doc.get("jobs") or {}).items():
        for index, step in enumerate(steps_of(job)):
            if "run" not in step:
                continue
            script = GITHUB_EXPRESSION.sub("GITHUB_EXPRESSION", str(step["run"]))
            result = run_tool(tool("shellcheck"), "--shell=bash", "--format=gcc", "-", stdin=script)
            problems += [
                f"jobs.{name}.steps[{index}]: {line}" for line in result.stdout.splitlines()
            ]
    return problems


def test_every_run_script_passes_shellcheck() -> None:
    for workflow in workflow_files():
        assert shellcheck_problems(load_workflow(workflow)) == [], workflow.name


def test_shellcheck_catches_an_unquoted_variable(tmp_path: Path) -> None:
    broken = mutated_copy(tmp_path, 'rm -rf -- "$RUN_DIR"', "rm -rf -- $RUN_DIR")
    assert any("SC2086" in p for p in shellcheck_problems(load_workflow(broken)))


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
        "    timeout-minutes: 240\n",
        "    timeout-minutes: 90\n",
        "must exceed the test's 90",
        id="job-timeout-below-test",
    ),
    pytest.param(
        "    timeout-minutes: 240\n",
        "    timeout-minutes: 200\n",
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
    build = steps[find_step(steps, "aiter-src")]
    assert "'" not in build["env"]["AITER_REF"], build["env"]["AITER_REF"]
    assert "^[0-9a-f]{40}$" in build["run"]
