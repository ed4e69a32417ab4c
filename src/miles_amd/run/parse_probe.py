"""Does the miles at hand accept the argv miles-amd will submit? Ask its own parser.

Decides how the question is put and how the answer reads: :func:`submitted_job` is the
exact ``train.py`` argv and process env the driver would give the Ray job (the env is the
launching process's, plus the plan's device env, plus the job's runtime env, as Ray's job
supervisor composes it); :func:`parse_with_miles` runs the script ``miles_parse.py`` BY FILE
PATH with the target interpreter (it imports nothing of ``miles_amd``) in a subprocess
with a time limit, and reduces a refusal to the parser's one line (``unrecognized
arguments: --x``, or the validator's exception). :func:`miles_argv_fact` is the preflight
fact ``miles_argv`` built on them; :func:`probe_miles_argv` is the probe ``preflight``
registers.

It does not decide what the argv should be (``recipe``), nor anything after parsing. GPU
stubs are opt-in (``gpu_stubs=True``, used by the CPU tests; see ``miles_parse``); the
preflight does not set them, so on a node the parse asks the real GPUs.

Facts: one parse costs ~13 s of CPU, nearly all of it imports (torch, sglang, Megatron);
the time limit (:data:`PARSE_TIMEOUT_S`) is for a wedged import, not for a slow parse.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from miles_amd.recipe.plan import LaunchPlan, build_train_plan
from miles_amd.records.env import Fact
from miles_amd.run.facts import PreflightConfig

SCRIPT = Path(__file__).with_name("miles_parse.py")
PARSE_TIMEOUT_S = 180.0
_ARGPARSE_ERROR = re.compile(r"^\S+: error: (?P<message>.+)$")


@dataclass(frozen=True)
class ParseOutcome:
    """What the parser said. ``args`` is the parsed namespace when ``ok``."""

    returncode: int | None  # None: killed at the time limit
    args: dict[str, Any] | None
    message: str  # the parser's one line when not ok; "" when ok
    stderr: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and self.args is not None


@dataclass(frozen=True)
class SubmittedJob:
    """The interpreter token, ``train.py`` path, argv after it and env of the Ray job."""

    python: str
    train_script: str
    train_argv: list[str]
    env: dict[str, str]


def submitted_job(plan: LaunchPlan, base_env: Mapping[str, str]) -> SubmittedJob:
    """What the driver submits for ``plan`` when launched from ``base_env``.

    Contains secrets (``WANDB_API_KEY``) in ``env``: hand it to a subprocess, never print it.
    """
    if plan.job is None:
        raise ValueError("the plan has no job; build it with build_train_plan")
    entrypoint = list(plan.job.entrypoint)
    scripts = [i for i, token in enumerate(entrypoint) if token.endswith("/train.py")]
    if len(scripts) != 1 or scripts[0] != 1:
        raise ValueError(f"the job's entrypoint is not `python train.py ...`: {entrypoint[:3]}")
    runtime_env: dict[str, str] = plan.job.runtime_env()["env_vars"]  # type: ignore[assignment]
    env = {**base_env, **plan.process_env, **runtime_env}
    return SubmittedJob(entrypoint[0], entrypoint[1], entrypoint[2:], env)


def parse_with_miles(
    train_argv: Sequence[str],
    env: Mapping[str, str],
    *,
    python: str | Path,
    gpu_stubs: bool = False,
    timeout: float = PARSE_TIMEOUT_S,
) -> ParseOutcome:
    """Run miles' ``parse_args()`` on ``train_argv`` with ``python`` in ``env`` (PYTHONPATH
    in ``env`` must lead to miles and Megatron-LM, as the job's does)."""
    with tempfile.TemporaryDirectory(prefix="miles-parse-") as tmp:
        result = Path(tmp) / "result.json"
        command = [str(python), str(SCRIPT), "--result", str(result)]
        command += ["--stub-gpu-queries"] if gpu_stubs else []
        command += ["--", *train_argv]
        start = time.monotonic()
        try:
            done = subprocess.run(
                command,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:  # subprocess.run has killed the child
            raw = exc.stderr or ""
            stderr = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
            message = f"the parse did not finish within {timeout:g} s"
            outcome = ParseOutcome(None, None, message, stderr, time.monotonic() - start)
        else:
            outcome = read_outcome(done.returncode, result, done.stderr, time.monotonic() - start)
    return _redacted(outcome, env)


def _redacted(outcome: ParseOutcome, env: Mapping[str, str]) -> ParseOutcome:
    """The child's words without a secret of ``env`` (its parse error may quote the argv or
    the env: ``miles_amd.redact``); they reach the terminal and ``env.json``."""
    from miles_amd.redact import SECRET_VARS, redact

    secrets = [env[name] for name in SECRET_VARS if env.get(name)]
    return replace(
        outcome,
        message=redact(outcome.message, secrets),
        stderr=redact(outcome.stderr, secrets),
    )


def read_outcome(returncode: int, result: Path, stderr: str, seconds: float) -> ParseOutcome:
    """What one run of ``miles_parse.py`` said: its exit status, the result file it wrote
    (absent when argparse or an import stopped it first) and its stderr."""
    payload = json.loads(result.read_text()) if result.is_file() else {}
    args = payload.get("args") if returncode == 0 and payload.get("ok") else None
    message = "" if args is not None else _one_line(returncode, payload, stderr)
    return ParseOutcome(returncode, args, message, stderr, seconds)


def _one_line(returncode: int, payload: Mapping[str, Any], stderr: str) -> str:
    """The parser's own words: argparse's ``error:`` line, the validator's exception, or the
    last line on stderr."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in reversed(lines):
        match = _ARGPARSE_ERROR.match(line)
        if match:
            return match["message"]
    if payload.get("error"):
        return str(payload["error"])
    return lines[-1] if lines else f"exit {returncode} with nothing on stderr"


def miles_argv_fact(
    config: PreflightConfig,
    *,
    base_env: Mapping[str, str] | None = None,
    gpu_stubs: bool = False,
    timeout: float = PARSE_TIMEOUT_S,
) -> Fact:
    """The ``miles_argv`` fact: the default recipe's argv for ``config``'s dirs and run dir,
    parsed by the interpreter the job's ``python3`` resolves to on the job's ``PATH``."""
    name = "miles_argv"
    env = dict(os.environ if base_env is None else base_env)
    plan = build_train_plan(config.recipe(), env, run_dir=str(config.run_dir))
    job = submitted_job(plan, env)
    if not Path(job.train_script).is_file():
        return Fact(
            name, "missing", "", f"no {job.train_script}; point --miles-dir at a miles checkout"
        )
    python = shutil.which(job.python, path=job.env.get("PATH"))
    if python is None:
        return Fact(name, "missing", "", f"no `{job.python}` on the job's PATH to run train.py")
    outcome = parse_with_miles(
        job.train_argv, job.env, python=python, gpu_stubs=gpu_stubs, timeout=timeout
    )
    where = f"{python} {job.train_script}"
    if outcome.ok:
        return Fact(name, "ok", f"{len(outcome.args or {})} args parsed by {where}")
    if outcome.returncode is None:
        return Fact(
            name,
            "wrong",
            where,
            f"{outcome.message}: importing miles hangs in this image; run `{where} --help` "
            "to see where",
        )
    return Fact(
        name,
        "wrong",
        where,
        f"miles' parse_args rejects the argv train would submit: {outcome.message}; "
        "the job would fail the same way before training (README: Conformance with the real "
        "miles)",
    )


def probe_miles_argv(config: PreflightConfig) -> Fact:
    """``miles_argv``: this image's miles parses the exact argv and env ``train`` submits.

    No GPU stubs: on a node the parse asks the real GPUs, as ``train.py`` will.
    """
    return miles_argv_fact(config)
