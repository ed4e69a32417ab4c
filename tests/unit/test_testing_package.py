"""``miles_amd.testing`` holds what the rehearsal's Ray job imports, and nothing else.

No product module spells its name in code (an import is pyproject's contract, a ``-m
miles_amd.testing...`` string is not), and every module in it is reachable from the replay,
the entry the rehearsal's plan runs (``tests.support.rehearsal.replay_prefix``), through
imports anywhere in a module (grimp's graph: lazy ones included). Test-only support belongs
in ``tests/support``. Both checks are shown to see a stray module and a spelled name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

from tests.support.rehearsal import replay_prefix

SRC = Path(__file__).resolve().parents[2] / "src"


def spelling(root: Path, package: str) -> list[str]:
    """The modules under ``root`` outside ``package`` that spell its name in a non-docstring."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        strings = [
            n.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
        ]
        if not module.startswith(package) and any(package in s for s in strings):
            found.append(module)
    return found


def unreached(root_package: str, entry: str, package: str) -> set[str]:
    """The modules of ``package`` (not its ``__init__``) that ``entry`` never imports."""
    graph = grimp.build_graph(root_package, cache_dir=None)
    reached = {entry} | graph.find_upstream_modules(entry, as_package=False)
    return {m for m in graph.modules if m.startswith(package + ".")} - reached


def test_only_the_replay_job_uses_the_package() -> None:
    prefix = replay_prefix(Path("run"), pace_s=0.0)
    entry = prefix[prefix.index("-m") + 1]
    assert entry == "miles_amd.testing.replay"
    assert spelling(SRC, "miles_amd.testing") == []
    assert unreached("miles_amd", entry, "miles_amd.testing") == set(), (
        "test-only support goes to tests/support"
    )


def test_the_checks_see_a_stray_module_and_a_spelled_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "strayed"
    (pkg / "testing").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "testing" / "__init__.py").write_text('"""strayed.testing in a docstring"""\n')
    (pkg / "testing" / "replay.py").write_text("from strayed.testing import faults\n")
    (pkg / "testing" / "faults.py").write_text("def f():\n    from strayed.testing import lazy\n")
    (pkg / "testing" / "lazy.py").write_text("")
    (pkg / "testing" / "stray.py").write_text("")
    (pkg / "plan.py").write_text('ENTRY = ("-m", "strayed.testing.replay")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    assert unreached("strayed", "strayed.testing.replay", "strayed.testing") == {
        "strayed.testing.stray"
    }
    assert spelling(tmp_path, "strayed.testing") == ["strayed.plan"]
