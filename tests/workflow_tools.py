"""The workflow tools, run offline as real processes: zizmor, check-jsonschema, shellcheck.

Decides how each tool is found (beside this interpreter, the test extra, else on PATH, else
the test is skipped) and run (no GitHub token reaches the child, colours off); the tests
judge the results.

Quirks (zizmor 1.32, check-jsonschema 0.39): zizmor exits 0 with no findings, 1 on an error,
10-14 with findings whose highest severity is unknown / informational / low / medium / high.
``--offline`` disables the online audits and remote fetches; a ``GH_TOKEN``/``GITHUB_TOKEN``
in the environment would otherwise switch zizmor to online mode. Its default ``regular``
persona suppresses code smells (a tag-pinned image, a missing workflow concurrency);
``pedantic`` reports them, ``auditor`` adds findings that need runtime context (every
self-hosted runner). check-jsonschema vendors the GitHub workflow schema, so it runs offline.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.workflow_yaml import steps_of

GITHUB_EXPRESSION = re.compile(r"\$\{\{.*?\}\}", re.S)
ZIZMOR_PERSONA = "pedantic"
ZIZMOR_FINDING_EXIT_CODES = range(10, 15)


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


def shellcheck_problems(doc: Mapping[str, Any]) -> list[str]:
    """shellcheck's findings for every ``run:`` script, as bash (the shell these jobs use).

    ``${{ ... }}`` expressions are replaced by a plain word first: GitHub substitutes them
    before the shell runs, and the invariants (``tests.workflow_audit``) keep them out of scripts.
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
