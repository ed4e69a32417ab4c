"""``miles_amd.testing`` holds what the rehearsal's Ray job imports, and nothing else.

Read from the source with ``ast`` (``tests.unit.test_import_cycles``' import graph: imports
anywhere in a module, lazy ones included): no product module outside the package imports it
or spells its name in code, and every module in it is reachable from the replay, the entry
the rehearsal's plan runs (``tests.support.rehearsal.replay_prefix``). Test-only support
belongs in ``tests/support``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.rehearsal import replay_prefix
from tests.unit.test_import_cycles import SRC, import_graph, module_names

pytestmark = pytest.mark.unit

PACKAGE = "miles_amd.testing"


def inside(name: str) -> bool:
    return name == PACKAGE or name.startswith(PACKAGE + ".")


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


def reachable(graph: dict[str, set[str]], entry: str) -> set[str]:
    seen, frontier = {entry}, [entry]
    while frontier:
        for nxt in graph[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return seen


def test_no_product_module_outside_the_package_imports_it() -> None:
    graph = import_graph(SRC)
    assert any(inside(name) for name in graph)
    importers = {
        name: sorted(m for m in imported if inside(m))
        for name, imported in graph.items()
        if not inside(name)
    }
    offenders = {name: found for name, found in importers.items() if found}
    assert not offenders, f"product modules importing {PACKAGE}: {offenders}"
    spelled = [
        name
        for name, path in module_names(SRC).items()
        if not inside(name) and any(PACKAGE in text for text in code_strings(path))
    ]
    assert not spelled, f"product modules naming {PACKAGE} in code: {spelled}"


def test_every_module_of_the_package_is_reachable_from_the_replay_job_entry() -> None:
    prefix = replay_prefix(Path("run"), pace_s=0.0)
    entry = prefix[prefix.index("-m") + 1]
    assert inside(entry), f"the rehearsal's job runs {entry}, outside {PACKAGE}"
    graph = import_graph(SRC)
    modules = {name for name in graph if inside(name)} - {PACKAGE}
    unreached = sorted(modules - reachable(graph, entry))
    assert not unreached, (
        f"{unreached} in {PACKAGE} are not imported by the replay job ({entry}): "
        "test-only support goes to tests/support"
    )


def test_the_checks_see_a_stray_module_and_a_lazy_import(tmp_path: Path) -> None:
    """The two checks on a package laid out like this one: a lazy import and a module the
    entry never reaches are both found."""
    pkg = tmp_path / "miles_amd"
    (pkg / "testing").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "testing" / "__init__.py").write_text('"""miles_amd.testing in a docstring"""\n')
    (pkg / "testing" / "replay.py").write_text("from miles_amd.testing import faults\n")
    (pkg / "testing" / "faults.py").write_text("")
    (pkg / "testing" / "stray.py").write_text("")
    (pkg / "gate.py").write_text("def f():\n    from miles_amd.testing import stray\n")
    (pkg / "plan.py").write_text('ENTRY = ("-m", "miles_amd.testing.replay")\n')
    graph = import_graph(tmp_path)
    assert reachable(graph, "miles_amd.testing.replay") == {
        "miles_amd.testing.replay",
        "miles_amd.testing.faults",
    }
    assert graph["miles_amd.gate"] == {"miles_amd.testing.stray"}
    names = module_names(tmp_path)
    assert [n for n, p in names.items() if any(PACKAGE in s for s in code_strings(p))] == [
        "miles_amd.plan"
    ]
