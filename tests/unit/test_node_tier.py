"""The node tier cannot pass off a node (root ``conftest.py``), proven by running pytest itself.

``pytest -m mi355x --runslow`` on this CPU machine, a real "not a node", in a subprocess:
without ``--aiter-variant`` it names the choices, with one it names what the node lacks; both
exit non-zero with one line, with or without xdist. A collection under xdist with a probe
plugin shows the node tests in one xdist group, sharing the one preflight fixture.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.constants import REPO

OFF_NODE = not Path("/dev/kfd").exists()
pytestmark = pytest.mark.skipif(
    not OFF_NODE, reason="asserts what a machine that is not a node says"
)

PROBE = """
def pytest_collection_finish(session):
    for item in session.items:
        groups = ",".join(m.args[0] for m in item.iter_markers("xdist_group"))
        print("NODE-TEST", item.name, groups, "preflighted" in item.fixturenames)
"""


def pytest_run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]
    return subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=300, env=env, check=False
    )


def test_runslow_without_a_variant_fails_naming_the_choices() -> None:
    done = pytest_run("-m", "mi355x", "--runslow")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "ERROR: --runslow needs --aiter-variant stock|patched|rccl: the aiter this image has "
        "(no default)"
    ], done.stderr


@pytest.mark.parametrize("xdist", [["-n", "2"], ["-p", "no:xdist"]])
def test_runslow_off_a_node_fails_naming_what_is_missing(xdist: list[str]) -> None:
    done = pytest_run("-m", "mi355x", "--runslow", "--aiter-variant", "patched", *xdist)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) <= 100, done.stderr
    assert lines[0].startswith("ERROR: --runslow off a node: missing /dev/kfd, ROCm torch ("), lines
    assert lines[0].endswith(", 8 GPUs (0 visible)"), lines


def test_the_node_tests_are_one_xdist_group_sharing_one_preflight(tmp_path: Path) -> None:
    (tmp_path / "node_probe.py").write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    args = ["tests/mi355x", "-m", "mi355x", "--co", "-q", "-s", "-p", "node_probe", "-n", "2"]
    done = pytest_run(*args, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    found = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("NODE-")]
    names = {name for name, _, _ in found}
    assert {"test_preflight", "test_recipe_matches_baseline"} <= names, found
    assert {group for _, group, _ in found} == {"mi355x"}, found
    uses = {name: shared == "True" for name, _, shared in found}
    assert uses["test_preflight"] and uses["test_recipe_matches_baseline"], found
