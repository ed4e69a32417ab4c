"""The README's map of the code names files that exist.

Walks README.md's "Architecture" section (the package table and the "Where to add" list):
every backticked token that looks like a path (ends in ``/`` or a file suffix such as
``.py``, ``.json``) must exist. A name resolves against the repo root, ``src/miles_amd/``,
or any directory its table row or list item names (so ``settings.py`` in the ``recipe/``
row is ``src/miles_amd/recipe/settings.py``); a placeholder such as ``<kind>`` matches any
name, and at least one file must match. Names of files outside this repo (:data:`FOREIGN`)
are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "miles_amd"
PATH_TOKEN = re.compile(r"^[\w.<>/-]*(/|\.(py|json|md|yml|yaml|toml|sh))$")
PLACEHOLDER = re.compile(r"<[^>/]+>")
# names the section uses for files that are not in this repo
FOREIGN = {
    "job.json": "a file of a run dir (run_dir.py)",
    "train.py": "miles' entry point, which testing/replay.py stands in for",
}


def architecture_entries(readme: str) -> list[str]:
    """The Architecture section's table rows and list items, each as one string."""
    section = re.split(r"^## Architecture$", readme, maxsplit=1, flags=re.M)[1]
    section = re.split(r"^## ", section, maxsplit=1, flags=re.M)[0]
    entries: list[str] = []
    for line in section.splitlines():
        if line.startswith(("|", "- ")) or not entries:
            entries.append(line)
        elif line.startswith("  "):  # a list item's continuation
            entries[-1] += " " + line.strip()
        else:
            entries.append(line)
    return [e for e in entries if e.startswith(("|", "- "))]


def path_tokens(entry: str) -> list[str]:
    tokens = re.findall(r"`([^`]+)`", entry)
    return [t for t in tokens if PATH_TOKEN.match(t) and t not in FOREIGN]


def exists(token: str, bases: list[Path]) -> bool:
    pattern = PLACEHOLDER.sub("*", token.rstrip("/"))
    return any(any(base.glob(pattern)) for base in bases)


def missing_paths(readme: str) -> list[str]:
    missing = []
    for entry in architecture_entries(readme):
        tokens = path_tokens(entry)
        dirs = [b / t for t in tokens if t.endswith("/") for b in (REPO, PACKAGE)]
        bases = [REPO, PACKAGE, *(d for d in dirs if d.is_dir())]
        missing += [t for t in tokens if not exists(t, bases)]
    return missing


def test_the_architecture_section_names_only_existing_paths() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    entries = architecture_entries(readme)
    assert any("Where to add" not in e and "recipe/settings.py" in e for e in entries)
    assert sum(len(path_tokens(e)) for e in entries) > 30  # the section was found and read
    assert missing_paths(readme) == []


def test_a_path_that_does_not_exist_is_reported() -> None:
    readme = (
        "## Architecture\n\n| `recipe/` | `settings.py`, `gone.py` |\n\nWhere to add:\n"
        "- **x**: `rules/kinds/<kind>.py` and\n  `tests/nowhere/`\n\n## Next\n"
    )
    assert missing_paths(readme) == ["gone.py", "tests/nowhere/"]
