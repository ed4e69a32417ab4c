"""``miles_amd.testing`` holds what the rehearsal's Ray job imports, and nothing else.

No product module imports it (pyproject's import contract, ``lint-imports``) or spells its
name in code, and every module in it is reachable from the replay, the entry the rehearsal's
plan runs (``tests.support.rehearsal.replay_prefix``), through imports anywhere in a module
(grimp's graph: lazy ones included). Test-only support belongs in ``tests/support``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

from tests.support.rehearsal import replay_prefix

pytestmark = pytest.mark.unit

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = "miles_amd.testing"


def inside(name: str, package: str = PACKAGE) -> bool:
    return name == package or name.startswith(package + ".")


def code_strings(path: Path) -> list[str]:
    """The string constants of a module that are not docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if id(node) not in docstrings
    ]


def spelling(root: Path, package: str) -> list[str]:
    """The modules under ``root`` outside ``package`` that spell its name in code."""
    return sorted(
        ".".join(path.relative_to(root).with_suffix("").parts)
        for path in root.rglob("*.py")
        if not inside(".".join(path.relative_to(root).with_suffix("").parts), package)
        and any(package in text for text in code_strings(path))
    )


def unreached(graph: grimp.ImportGraph, entry: str, package: str) -> set[str]:
    """The modules of ``package`` (not its ``__init__``) that ``entry`` never imports."""
    reached = {entry} | graph.find_upstream_modules(entry, as_package=False)
    modules = {m for m in graph.modules if inside(m, package)} - {package}
    return modules - reached


def test_no_product_module_spells_the_package_in_code() -> None:
    assert spelling(SRC, PACKAGE) == []


def test_every_module_of_the_package_is_reachable_from_the_replay_job_entry() -> None:
    prefix = replay_prefix(Path("run"), pace_s=0.0)
    entry = prefix[prefix.index("-m") + 1]
    assert inside(entry), f"the rehearsal's job runs {entry}, outside {PACKAGE}"
    graph = grimp.build_graph("miles_amd", cache_dir=None)
    assert entry in graph.modules
    missing = sorted(unreached(graph, entry, PACKAGE))
    assert not missing, (
        f"{missing} in {PACKAGE} are not imported by the replay job ({entry}): "
        "test-only support goes to tests/support"
    )


def test_the_checks_see_a_stray_module_and_a_lazy_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two checks on a package laid out like this one: a lazy import and a module the
    entry never reaches are both found."""
    pkg = tmp_path / "strayed"
    (pkg / "testing").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "testing" / "__init__.py").write_text('"""strayed.testing in a docstring"""\n')
    (pkg / "testing" / "replay.py").write_text("from strayed.testing import faults\n")
    (pkg / "testing" / "faults.py").write_text("")
    (pkg / "testing" / "stray.py").write_text("")
    (pkg / "gate.py").write_text("def f():\n    from strayed.testing import stray\n")
    (pkg / "plan.py").write_text('ENTRY = ("-m", "strayed.testing.replay")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("strayed", cache_dir=None)
    assert unreached(graph, "strayed.testing.replay", "strayed.testing") == {
        "strayed.testing.stray"
    }
    assert graph.find_modules_directly_imported_by("strayed.gate") == {"strayed.testing.stray"}
    assert spelling(tmp_path, "strayed.testing") == ["strayed.plan"]
