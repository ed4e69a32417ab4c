"""Which miles the conformance tier checks (options, env, else ``.conformance/``; none: skip),
each variant planned by ``miles-amd train --dry-run --json`` in process, and its argv parsed by
that miles: fresh, or forked by ``child.py batch`` after one import (docs/conformance.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from typer.testing import CliRunner

from miles_amd.cli.main import app
from miles_amd.recipe.plan import REDACTED
from miles_amd.run.probes_miles import PARSE_TIMEOUT_S, ParseOutcome, parse_with_miles, read_outcome
from tests.snapshot.test_dry_run import CASES as SNAPSHOT_CASES

HERE = Path(__file__).resolve().parent
CHILD = HERE / "child.py"
IMPORT_STUBS = HERE / "import_stubs"
DEFAULT_DIR = HERE.parents[1] / ".conformance"
OPTIONS = (
    ("--miles-src", "MILES_AMD_MILES_SRC", "upstream/miles", "miles checkout (has train.py)"),
    ("--megatron-src", "MILES_AMD_MEGATRON_SRC", "upstream/Megatron-LM", "Megatron-LM checkout"),
    ("--miles-python", "MILES_AMD_MILES_PYTHON", "venv/bin/python", "python with miles' deps"),
)
HOW_TO_PROVIDE = (
    "conformance needs a miles checkout, a Megatron-LM checkout and a python with miles' "
    "dependencies: run `.ci/conformance-env` once (builds .conformance/ from the pinned "
    "archives), or pass --miles-src DIR --megatron-src DIR --miles-python PYTHON "
    "(env MILES_AMD_MILES_SRC, MILES_AMD_MEGATRON_SRC, MILES_AMD_MILES_PYTHON; on a node "
    "/root/miles, /root/Megatron-LM, python3)"
)
DIR_FIELDS = ("model_dir", "data_dir", "miles_dir", "megatron_dir")  # the tier sets them
DIR_FLAGS = ("--model-dir", "--data-dir", "--miles-dir", "--megatron-dir", "--run-dir")
PASSTHROUGH_ENV = ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL")  # what a shell gives any launch
CI_RECORD_ENV = "MILES_CI_GATE_RECORD_DIR"  # miles/utils/arguments.py: RECORD_DIR_ENV
FORK_TIMEOUT_S = 60.0  # a forked parse takes 2-3 s; one still running is parsed afresh


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("conformance", "conformance with the real miles")
    for flag, env_name, _, what in OPTIONS:
        group.addoption(flag, default=None, help=f"{what} (env {env_name})")


@dataclass(frozen=True)
class MilesCheckout:
    miles: Path
    megatron: Path
    python: Path
    needs_import_stubs: bool  # this python lacks triton/torchvision: inert ones go last

    def parse_pythonpath(self, job_pythonpath: str) -> str:
        extra = [str(IMPORT_STUBS)] if self.needs_import_stubs else []
        return os.pathsep.join([job_pythonpath, *extra])


def given(config: pytest.Config) -> dict[str, str]:
    values = {}
    for flag, env_name, default_rel, _ in OPTIONS:
        value = config.getoption(flag) or os.environ.get(env_name)
        if not value and (DEFAULT_DIR / default_rel).exists():
            value = str(DEFAULT_DIR / default_rel)
        if value:
            values[flag] = value
    return values


def miles_src(config: pytest.Config) -> Path:
    """The miles checkout alone (miles' ``tests/ci`` needs no interpreter of its own)."""
    value = given(config).get("--miles-src")
    if value is None:
        pytest.skip(HOW_TO_PROVIDE)
    if not Path(value, "tests", "ci", "metric_history", "gate.py").is_file():
        pytest.fail(f"conformance: --miles-src {value}: no tests/ci/metric_history there")
    return Path(value).resolve()


def resolve(config: pytest.Config) -> MilesCheckout:
    values = given(config)
    if not values:
        pytest.skip(HOW_TO_PROVIDE)
    missing = [flag for flag, *_ in OPTIONS if flag not in values]
    if missing:
        pytest.fail(f"conformance: {', '.join(missing)} not given; {HOW_TO_PROVIDE}")
    miles, megatron = Path(values["--miles-src"]), Path(values["--megatron-src"])
    python = Path(values["--miles-python"])
    for path, flag, what in (
        (miles / "miles" / "utils" / "arguments.py", "--miles-src", "a miles checkout"),
        (megatron / "megatron" / "training" / "arguments.py", "--megatron-src", "Megatron-LM"),
        (python, "--miles-python", "an interpreter"),
    ):
        if not path.exists():
            pytest.fail(f"conformance: {flag} {values[flag]}: no {path} there; give {what}")
    probe = subprocess.run(
        [str(python), "-c", "import triton, torchvision"], capture_output=True, timeout=120
    )
    return MilesCheckout(miles.resolve(), megatron.resolve(), python, probe.returncode != 0)


def run_child(
    command: list[str], env: Mapping[str, str], timeout: float, cwd: Path | None = None
) -> str:
    done = subprocess.run(
        command,
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{command[1]} exited {done.returncode}: {done.stderr[-3000:]}")
    return done.stdout


# ---- planning ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    recipe: dict[str, Any]
    train_argv: list[str]
    env: dict[str, str]

    def with_env(self, **changes: str | None) -> Job:
        env = {k: v for k, v in self.env.items() if changes.get(k, v) is not None}
        env.update({k: v for k, v in changes.items() if v is not None})
        return Job(self.recipe, self.train_argv, env)


def without_dir_flags(args: tuple[str, ...]) -> list[str]:
    kept: list[str] = []
    for i, token in enumerate(args):
        if token not in DIR_FLAGS and (i == 0 or args[i - 1] not in DIR_FLAGS):
            kept.append(token)
    return kept


# every ``train`` case of the snapshot suite -> (its flags without dirs, its environment)
TRAIN_CASES: dict[str, tuple[list[str], dict[str, str]]] = {
    case: (without_dir_flags(args[1:]), env)
    for case, (args, env) in SNAPSHOT_CASES.items()
    if args[0] == "train"
}


def dry_run(argv: list[str], env: Mapping[str, str]) -> dict[str, Any]:
    with mock.patch.dict(os.environ, env, clear=True):  # nothing of this shell's env
        result = CliRunner().invoke(app, [*argv, "--dry-run", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, f"miles-amd {' '.join(argv)}: {result.output}"
    printed: dict[str, Any] = json.loads(result.stdout)
    return printed


def snapshot_recipe(case: str) -> dict[str, Any]:
    """The recipe the snapshot suite plans for ``case`` (its own dirs and environment)."""
    args, env = SNAPSHOT_CASES[case]
    recipe: dict[str, Any] = dry_run(list(args), {"PATH": "/usr/bin", **env})["recipe"]
    return recipe


def plan_with_cli(
    checkout: MilesCheckout,
    inputs: tuple[Path, Path],
    run_dir: Path,
    cli_args: list[str],
    launch_env: Mapping[str, str],
) -> Job:
    dirs = (*inputs, checkout.miles, checkout.megatron, run_dir)
    argv = ["train", *(str(x) for pair in zip(DIR_FLAGS, dirs, strict=True) for x in pair)]
    argv += cli_args
    env = {**{k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}, **launch_env}
    printed = dry_run(argv, env)
    entrypoint: list[str] = printed["job"]["entrypoint"]
    assert entrypoint[:2] == ["python3", f"{checkout.miles}/train.py"], entrypoint[:2]
    job_env = {
        name: launch_env[name] if value == REDACTED else value  # the secret the driver sends
        for name, value in printed["job"]["runtime_env"]["env_vars"].items()
    }
    parse_env = {
        **{k: env[k] for k in PASSTHROUGH_ENV if k in env},
        **printed["process_env"],
        **job_env,
    }
    parse_env["PYTHONPATH"] = checkout.parse_pythonpath(job_env["PYTHONPATH"])
    return Job(printed["recipe"], entrypoint[2:], parse_env)


# ---- parsing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParseRun:
    """Outcomes by job; each forked job's env keys beyond its batch's; why a job was sent back."""

    outcomes: dict[str, ParseOutcome]
    forked: dict[str, set[str]]
    sent_back: dict[str, str]


def parse_fresh(checkout: MilesCheckout, job: Job) -> ParseOutcome:
    return parse_with_miles(job.train_argv, job.env, python=checkout.python, gpu_stubs=True)


def parse_batch(checkout: MilesCheckout, group: Mapping[str, Job]) -> ParseRun | None:
    """``child.py batch`` in the env ``group`` shares; None when the import failed."""
    first, *rest = group.values()
    shared = {k: v for k, v in first.env.items() if all(j.env.get(k) == v for j in rest)}
    with tempfile.TemporaryDirectory(prefix="miles-parse-batch-") as tmp:
        stems = {name: Path(tmp, str(i)) for i, name in enumerate(group)}
        jobs = [
            {"argv": job.train_argv, "env": job.env}
            | {kind: f"{stems[name]}.{kind}" for kind in ("result", "stderr", "status")}
            for name, job in group.items()
        ]
        spec = {"workers": os.cpu_count() or 1, "fork_timeout_s": FORK_TIMEOUT_S, "jobs": jobs}
        Path(tmp, "spec.json").write_text(json.dumps(spec))
        try:
            command = [str(checkout.python), str(CHILD), "batch", str(Path(tmp, "spec.json"))]
            run_child(command, shared, PARSE_TIMEOUT_S + len(group) * FORK_TIMEOUT_S)
        except RuntimeError:
            return None
        run = ParseRun({}, {}, {})
        for name, stem in stems.items():
            status = json.loads(Path(f"{stem}.status").read_text())
            if status["fresh_because"] is not None:
                run.sent_back[name] = status["fresh_because"]
                continue
            stderr = Path(f"{stem}.stderr").read_text(errors="replace")
            run.outcomes[name] = read_outcome(
                status["returncode"], Path(f"{stem}.result"), stderr, status["seconds"]
            )
            run.forked[name] = set(group[name].env) - set(shared)
    return run


def parse_all(checkout: MilesCheckout, jobs: Mapping[str, Job]) -> ParseRun:
    """One batch per ``PYTHONPATH`` several jobs share; any other job parsed fresh."""
    groups: dict[str, dict[str, Job]] = {}
    for name, job in jobs.items():
        groups.setdefault(job.env.get("PYTHONPATH", ""), {})[name] = job
    run = ParseRun({}, {}, {})
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        fresh = {}
        for group in sorted(groups.values(), key=len):  # the fresh ones start first
            batch = parse_batch(checkout, group) if len(group) > 1 else None
            if batch is not None:
                run.outcomes.update(batch.outcomes)
                run.forked.update(batch.forked)
                run.sent_back.update(batch.sent_back)
            for name in (n for n in group if n not in run.outcomes):
                fresh[name] = pool.submit(parse_fresh, checkout, group[name])
        run.outcomes.update({name: future.result() for name, future in fresh.items()})
    return run
