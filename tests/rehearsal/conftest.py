"""One real Ray head on 127.0.0.1 for the whole rehearsal session, and process checks.

The head is started by the same :class:`~miles_amd.run.ray_head.RayHead` the driver uses
(loopback, token auth, ports chosen by the tool, private temp dir; declaring 8 GPUs and the
whole-node resource cluster mode asks for, which a CPU raylet accepts), so it never collides
with another cluster; tests hand its dashboard URL to the driver as ``RAY_ADDRESS`` and its
token file as ``RAY_AUTH_TOKEN_PATH``, the external-cluster path. At the end of the session
the head is stopped and every process it spawned is checked gone, by pid. After each test
no job entrypoint the test started may still be alive.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from miles_amd.app.train import TrainResult
from miles_amd.recipe.plan import NODE_RESOURCE, ray_start_argv
from miles_amd.run.ray_head import RayHead

JOB_MARKERS = ("miles_amd.testing.replay", "miles_amd_rehearsal_job")


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHead]:
    log = tmp_path_factory.mktemp("ray") / "head.log"
    argv = (*ray_start_argv(8, "127.0.0.1"), "--resources", json.dumps({NODE_RESOURCE: 1}))
    # A job's `python3` is the node's: this interpreter, as the image's python3 on a node.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    head = RayHead.start(argv, env={**os.environ, "PATH": path}, log_path=log)
    try:
        yield head
    finally:
        head.stop()
    left = head.leftovers()
    assert not left, f"Ray processes left after the session: {[p.pid for p in left]}"


def job_processes(head: RayHead) -> list[psutil.Process]:
    """Job entrypoints (replays, test jobs) running under the session head."""
    try:
        children = psutil.Process(head.owned.pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for child in children:
        try:
            cmdline = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if any(marker in cmdline for marker in JOB_MARKERS):
            found.append(child)
    return found


def head_env(head: RayHead) -> dict[str, str]:
    """The environment a launch sees with ``head`` as its external cluster."""
    return {
        **os.environ,
        "RAY_ADDRESS": head.dashboard_url,
        "RAY_AUTH_TOKEN_PATH": str(head.token_path),
    }


@pytest.fixture
def cluster_env(ray_head: RayHead) -> Iterator[dict[str, str]]:
    """The environment a launch sees with the session head as its external cluster."""
    yield head_env(ray_head)
    _gone, alive = psutil.wait_procs(job_processes(ray_head), timeout=10)
    assert not alive, f"job processes left by the test: {[p.pid for p in alive]}"


@pytest.fixture(scope="session")
def healthy_run(ray_head: RayHead, tmp_path_factory: pytest.TempPathFactory) -> TrainResult:
    """One healthy replay of the embedded example on the session head, run once for the tests
    that only read it (its verdict, its report, a baseline recorded from it)."""
    from tests.support.rehearsal import rehearse

    root = tmp_path_factory.mktemp("healthy")
    outcome = rehearse(head_env(ray_head), root / "run", state_dir=str(root / "state"))
    _gone, alive = psutil.wait_procs(job_processes(ray_head), timeout=10)
    assert not alive, f"job processes left by the healthy run: {[p.pid for p in alive]}"
    return outcome


@pytest.fixture
def state_dir(tmp_path: Path) -> str:
    return str(tmp_path / "state")
