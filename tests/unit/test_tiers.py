"""Tiers: a test's directory marks it, ``-m <tier>`` selects it, and a test without a tier stops
collection (``tests/conftest.py``). Each case runs a real ``pytest --collect-only``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TESTS_DIR, directory_tier

REPO = TESTS_DIR.parent


# Only the plugins these runs need (pytest.ini's -n and timeout): the others (hypothesis,
# syrupy, anyio) take seconds to import in each child and play no part here.
PLUGINS = ("-p", "xdist.plugin", "-p", "pytest_timeout", "-p", "no:cacheprovider")
ONLY_NAMED_PLUGINS = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def run_pytest(
    *args: str, cwd: Path, path: tuple[Path, ...] = (REPO,)
) -> subprocess.CompletedProcess[str]:
    """A child ``pytest ARGS`` in ``cwd`` with only :data:`PLUGINS`, ``path`` on PYTHONPATH."""
    entries = (*(str(p) for p in path), os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "pytest", *PLUGINS, *args],
        cwd=cwd,
        env={
            **os.environ,
            **ONLY_NAMED_PLUGINS,
            "PYTHONPATH": os.pathsep.join(filter(None, entries)),
        },
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
    )


def collect(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_pytest("--collect-only", "-q", *args, cwd=cwd)


def test_directory_names_the_tier() -> None:
    assert directory_tier(TESTS_DIR / "unit" / "test_x.py") == "unit"
    assert directory_tier(TESTS_DIR / "conformance" / "sub" / "test_x.py") == "conformance"
    assert directory_tier(TESTS_DIR / "test_top.py") is None
    assert directory_tier(TESTS_DIR / "helpers" / "test_x.py") is None
    assert directory_tier(Path("/elsewhere/unit/test_x.py")) is None


def test_minus_m_unit_selects_a_test_marked_only_by_its_directory() -> None:
    module = "tests/unit/test_packaging.py"
    assert "pytestmark" not in (REPO / module).read_text()
    done = collect("-n", "0", "-m", "unit", module, cwd=REPO)  # no xdist workers to collect
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{module}::test_the_wheel_holds" in done.stdout
    assert "deselected" not in done.stdout


def test_a_test_without_a_tier_or_with_two_stops_collection(tmp_path: Path) -> None:
    (tmp_path / "test_loose.py").write_text("def test_nowhere():\n    pass\n")
    (tmp_path / "test_double.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.unit\n@pytest.mark.snapshot\ndef test_both():\n    pass\n\n"
        "@pytest.mark.unit\ndef test_one():\n    pass\n"
    )
    done = collect("-p", "tests.conftest", str(tmp_path), cwd=tmp_path)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "every test needs exactly one tier marker" in done.stderr
    assert "test_loose.py::test_nowhere: no tier" in done.stderr
    assert "test_double.py::test_both: snapshot, unit" in done.stderr
    assert "test_one" not in done.stderr


def test_an_xdist_group_runs_on_one_worker(tmp_path: Path) -> None:
    """pytest.ini's ``--dist loadgroup`` really groups: every Ray test on one worker (one head).

    A real ``pytest -n 2`` over six grouped and six free tests, each leaving its worker's name
    in a file. Fails under pytest 9.2 with pytest-xdist 3.8, where the group mark is silently
    ignored (pytest-dev/pytest-xdist#1386).
    """
    seen = tmp_path / "seen"
    seen.mkdir()
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -n 2 --dist loadgroup\n")
    (tmp_path / "test_grouped.py").write_text(
        "import os, pathlib, pytest\n"
        f"SEEN = pathlib.Path({str(seen)!r})\n"
        "def leave(kind, i):\n"
        "    (SEEN / f'{kind}-{i}').write_text(os.environ['PYTEST_XDIST_WORKER'])\n"
        "@pytest.mark.xdist_group('ray')\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_grouped(i):\n"
        "    leave('grouped', i)\n"
        "@pytest.mark.parametrize('i', range(6))\n"
        "def test_free(i):\n"
        "    leave('free', i)\n"
    )
    done = run_pytest("-q", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:]
    workers = {p.name: p.read_text() for p in seen.iterdir()}
    assert len(workers) == 12, workers
    grouped = {w for name, w in workers.items() if name.startswith("grouped-")}
    assert len(grouped) == 1, workers


def test_every_ray_test_is_grouped_by_the_cluster_it_uses(tmp_path: Path) -> None:
    """The real collection of ``tests/rehearsal``: each test in the group of its cluster."""
    (tmp_path / "groups_seen.py").write_text(
        "import pytest\n"
        "@pytest.hookimpl(trylast=True)\n"
        "def pytest_collection_modifyitems(items):\n"
        "    for item in items:\n"
        "        mark = item.get_closest_marker('xdist_group')\n"
        "        print('GROUP', item.nodeid, mark.args[0] if mark else None)\n"
    )
    done = run_pytest(
        "-p", "groups_seen", "--collect-only", "-q", "-n", "0", "-m", "rehearsal",
        "tests/rehearsal", cwd=REPO, path=(tmp_path, REPO),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    groups = dict(
        line.removeprefix("GROUP ").rsplit(" ", 1)  # a node id may hold spaces
        for line in done.stdout.splitlines()
        if line.startswith("GROUP")
    )
    no_ray = ("tests/rehearsal/test_canary_harness.py", "tests/rehearsal/test_ray_endpoint.py")
    assert groups and all(
        g in ("ray", "ray-two-node", "ray-own-head") or (g == "None" and n.startswith(no_ray))
        for n, g in groups.items()
    ), groups
    by_test = {nodeid.split("[")[0]: group for nodeid, group in groups.items()}
    assert by_test["tests/rehearsal/test_rehearsal.py::test_healthy_replay_passes"] == "ray"
    two_node = (
        "tests/rehearsal/test_cluster.py::test_two_runs_concurrent_pinned_pulled_back_and_gated"
    )
    assert by_test[two_node] == "ray-two-node"
    own = "tests/rehearsal/test_private_head.py::test_two_private_heads_side_by_side"
    assert by_test[own] == "ray-own-head"
    gloo = "tests/rehearsal/test_canary_harness.py::test_a_reducer_that_raises_is_a_named_exit_2"
    assert by_test[gloo] == "None"  # no_ray: starts no Ray, so joins no group
