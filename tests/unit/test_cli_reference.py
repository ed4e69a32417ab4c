"""docs/cli.md is the reference of the CLI as it is when the test runs: every visible command
and option has a synopsis there (``full-train``: "train's options"), help points only to docs
that exist, and ``train --dry-run --json``'s keys are the documented ones. The CLI is walked
through click's command tree, so anything added later fails here until it is documented.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer

from miles_amd.cli.main import app
from tests.cli_runs import run_cli

ROOT = Path(__file__).parents[2]
DOC = ROOT / "docs" / "cli.md"
SAME_OPTIONS = {"full-train": "train"}  # documented as "train's options"


def visible_commands() -> Iterator[tuple[str, list[str], str]]:
    """(command path, its visible options, its help and its options' help)."""

    def walk(command, path: list[str]):
        params = [p for p in command.params if not getattr(p, "hidden", False)]
        names = [
            max(p.opts, key=len)
            for p in params
            if p.param_type_name == "option"
            if p.name != "help"
        ]
        helps = " ".join([command.help or "", *(getattr(p, "help", None) or "" for p in params)])
        subcommands = getattr(command, "commands", {})
        if path and (names or not subcommands):
            yield " ".join(path), names, helps
        for name, sub in subcommands.items():
            if not sub.hidden:
                yield from walk(sub, [*path, name])

    yield from walk(typer.main.get_command(app), [])


def synopses(text: str) -> dict[str, str]:
    """Command path -> the text of its synopsis lines (a ``miles-amd`` line in a fenced
    block and its indented continuation lines), longest known command path first."""
    known = sorted((path for path, _, _ in visible_commands()), key=len, reverse=True)
    found: dict[str, str] = {}
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        current = None
        for line in block.splitlines():
            if line.startswith("miles-amd "):
                rest = line[len("miles-amd ") :]
                current = next(
                    (p for p in known if rest.split()[: len(p.split())] == p.split()), None
                )
                if current is not None:
                    found[current] = found.get(current, "") + " " + rest
            elif line.startswith(" ") and current is not None:
                found[current] += " " + line
            else:
                current = None
    return found


@pytest.mark.parametrize("path", [path for path, _, _ in visible_commands()])
def test_every_command_and_option_is_in_the_reference(path: str) -> None:
    documented = synopses(DOC.read_text())
    assert path in documented, f"docs/cli.md has no synopsis `miles-amd {path} ...`"
    options = dict((p, names) for p, names, _ in visible_commands())
    if path in SAME_OPTIONS:
        assert sorted(options[path]) == sorted(options[SAME_OPTIONS[path]])
        assert f"{SAME_OPTIONS[path]}'s options" in documented[path]
        return
    missing = [
        name
        for name in options[path]
        if not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", documented[path])
    ]
    assert missing == [], f"docs/cli.md: `miles-amd {path}` synopsis lacks {missing}"


def test_help_points_only_to_docs_that_exist() -> None:
    readme_headings = {
        line.lstrip("#").strip()
        for line in (ROOT / "README.md").read_text().splitlines()
        if line.startswith("#")
    }
    for path, _, helps in visible_commands():
        for doc in re.findall(r"docs/[\w.-]+\.md", helps):
            assert (ROOT / doc).is_file(), (path, doc)
        for section in re.findall(r"README: ([^).;]+)", helps):
            assert section.strip() in readme_headings, (path, section)


def test_the_dry_run_json_keys_are_the_documented_ones(tmp_path: Path) -> None:
    result = run_cli(
        "train", "--dry-run", "--json", "--model-dir", str(tmp_path), "--data-dir", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    keys = set(json.loads(result.stdout))
    sentence = DOC.read_text().split("`--dry-run --json` prints `{", 1)[1].split("}`", 1)[0]
    documented = set(re.findall(r'"(\w+)"(?!: \{)', sentence)) | set(
        re.findall(r'"(\w+)": \{', sentence)
    )
    documented -= {"entrypoint", "aiter_fix", "runtime_env"}  # the keys of "job"
    assert documented == keys
