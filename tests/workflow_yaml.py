"""Reading a GitHub workflow file: parsing it, and the pieces the audit looks at.

Decides how a workflow's YAML becomes the mapping the audit (``tests.workflow_audit``) and
the tool runs (``tests.workflow_tools``) read: the YAML 1.1 key ``on`` (PyYAML parses the bare
key as the boolean ``True``) back to ``"on"``, runner labels behind a ``fromJSON`` default,
Docker options as ``--flag=value``, steps and the words of their scripts. Also where the
workflows are, and a mutated copy of a lane's workflow for tests that show a check can fail.
Judges nothing.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS_DIR = REPO_ROOT / ".github" / "workflows"
NIGHTLY_WORKFLOW = WORKFLOWS_DIR / "amd-nightly.yml"
PR_WORKFLOW = WORKFLOWS_DIR / "amd-pr.yml"


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


def resolve_env(word: str, env: Mapping[str, Any]) -> str:
    """``$NAME`` / ``${NAME}`` looked up in the step's and job's ``env``; else the word."""
    match = re.fullmatch(r"\$\{?(\w+)\}?", word)
    return str(env.get(match.group(1), word)) if match else word


def workflow_files() -> list[Path]:
    files = sorted([*WORKFLOWS_DIR.glob("*.yml"), *WORKFLOWS_DIR.glob("*.yaml")])
    for lane in (NIGHTLY_WORKFLOW, PR_WORKFLOW):
        assert lane in files, f"{lane} is missing"
    return files


def mutated_copy(tmp_path: Path, old: str, new: str, workflow: Path = NIGHTLY_WORKFLOW) -> Path:
    """``workflow`` with one exact, unique fragment replaced, under tmp_path."""
    text = workflow.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"mutation anchor {old!r} must occur exactly once"
    target = tmp_path / ".github" / "workflows" / workflow.name
    target.parent.mkdir(parents=True)
    target.write_text(text.replace(old, new), encoding="utf-8")
    return target
