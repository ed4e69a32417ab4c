"""No import cycle anywhere in ``src/``: module-level, inside functions, or for type checking.

Every ``import``/``from ... import`` of every module (``ast``: relative ones resolved,
``from pkg import module`` to the module, ``from pkg import name`` to the package's
``__init__``, whose own imports then count) is an edge; a strongly connected component of
more than one module, or a module importing itself, is a cycle and is printed as a path.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
# Imports the ast cannot see: the rule registry imports every module of the kinds package.
DYNAMIC = {"miles_amd.rules.registry": "miles_amd.rules.kinds."}


def module_names(src: Path) -> dict[str, Path]:
    names = {}
    for path in sorted(src.rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The modules of ``known`` that ``name`` (at ``path``) imports, anywhere in its body."""
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:
                submodule = f"{origin}.{alias.name}"
                found.add(submodule if submodule in known else origin)
    for importer, prefix in DYNAMIC.items():
        if name == importer:
            found.update(m for m in known if m.startswith(prefix))
    return {m for m in found if m in known and m != name} | ({name} & found)


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component that is a cycle, as a path back to its start."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                components.append(_path(graph, sorted(component)))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return components


def _path(graph: Mapping[str, set[str]], component: list[str]) -> list[str]:
    """A shortest import path from the component's first module back to it."""
    start, members = component[0], set(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt_frontier = []
        for node in frontier:
            for nxt in sorted(graph.get(node, set()) & members):
                if nxt == start:
                    path = [start]
                    while node != start:
                        path.append(node)
                        node = previous[node]
                    return [start, *reversed(path[1:]), start] if len(path) > 1 else [start, start]
                if nxt not in previous:
                    previous[nxt] = node
                    nxt_frontier.append(nxt)
        frontier = nxt_frontier
    return component


def import_graph(src: Path) -> dict[str, set[str]]:
    names = module_names(src)
    return {name: imports_of(name, path, names) for name, path in names.items()}


def test_src_has_no_import_cycle() -> None:
    graph = import_graph(SRC)
    assert "miles_amd.rules.model" in graph and graph["miles_amd.judge.gate"]
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_rules_package_imports_neither_baseline_nor_judge_nor_report() -> None:
    graph = import_graph(SRC)
    for name, imported in graph.items():
        if name.startswith("miles_amd.rules"):
            above = [m for m in imported if m.split(".")[1] in ("baseline", "judge", "report")]
            assert not above, f"{name} imports {above}"


def test_a_cycle_is_found_at_any_depth_and_printed_as_a_path(tmp_path: Path) -> None:
    """The detector itself: a function-level, a relative and a ``from pkg import module``
    import close a cycle; an ``__init__`` re-export counts."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg.c import thing\n")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("from pkg import c\n")
    (pkg / "c.py").write_text("import pkg.a\nthing = 1\n")
    (pkg / "d.py").write_text("from pkg import thing\n")
    (pkg / "e.py").write_text("from pkg.d import x\n")
    graph = import_graph(tmp_path)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"}
    assert graph["pkg.d"] == {"pkg"} and graph["pkg"] == {"pkg.c"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    (pkg / "c.py").write_text("thing = 1\n")
    assert cycles(import_graph(tmp_path)) == []
    (pkg / "c.py").write_text("from pkg.d import thing\n")  # via the package's re-export
    found = cycles(import_graph(tmp_path))
    assert found == [["pkg", "pkg.c", "pkg.d", "pkg"]]
