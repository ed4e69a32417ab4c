"""One real Ray head on 127.0.0.1 for the whole rehearsal session, and process checks.

The head is started by the same :class:`~miles_amd.run.ray_head.RayHead` the driver uses
(loopback, token auth, ports chosen by the tool, private temp dir; declaring 8 GPUs and the
whole-node resource cluster mode asks for, which a CPU raylet accepts), so it never collides
with another cluster; tests hand its dashboard URL to the driver as ``RAY_ADDRESS`` and its
token file as ``RAY_AUTH_TOKEN_PATH``, the external-cluster path. After each test no job
entrypoint the test started may still be alive.

The head (:class:`SessionHead`) starts when a test first needs it and stops, every process it
spawned checked gone by pid, after the last test of its xdist group (``tests/conftest.py``):
an idle head costs CPU. A later test that needs it starts it again.
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


class SessionHead:
    """The session's Ray head: started by :meth:`running`, stopped by :meth:`stop`."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.head: RayHead | None = None
        self.starts = 0

    def running(self) -> RayHead:
        if self.head is None:
            argv = (*ray_start_argv(8, "127.0.0.1"), "--resources", json.dumps({NODE_RESOURCE: 1}))
            # A job's `python3` is the node's: this interpreter, as the image's python3 on a node.
            path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
            self.starts += 1
            log = self.log_dir / f"head-{self.starts}.log"
            self.head = RayHead.start(argv, env={**os.environ, "PATH": path}, log_path=log)
        return self.head

    def stop(self) -> None:
        """Stop the head if it runs, and fail when any of its processes is left."""
        head, self.head = self.head, None
        if head is not None:
            head.stop()
            left = head.leftovers()
            assert not left, f"Ray processes left by the session head: {[p.pid for p in left]}"


SESSION_HEAD = pytest.StashKey[SessionHead]()


@pytest.fixture(scope="session")
def session_head(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SessionHead]:
    holder = SessionHead(tmp_path_factory.mktemp("ray"))
    request.config.stash[SESSION_HEAD] = holder
    try:
        yield holder
    finally:
        holder.stop()


@pytest.fixture
def ray_head(session_head: SessionHead) -> RayHead:
    return session_head.running()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the test's own teardown: stop the session head when the next test does not need
    it (its group is done on this worker)."""
    yield
    holder = item.config.stash.get(SESSION_HEAD, None)
    if holder is not None and uses_session_head(item) and not uses_session_head(nextitem):
        holder.stop()


def uses_session_head(item: pytest.Item | None) -> bool:
    return item is not None and "session_head" in getattr(item, "fixturenames", ())


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
def healthy_run(session_head: SessionHead, tmp_path_factory: pytest.TempPathFactory) -> TrainResult:
    """One healthy replay of the embedded example on the session head, run once for the tests
    that only read it (its verdict, its report, a baseline recorded from it)."""
    from tests.support.rehearsal import rehearse

    root = tmp_path_factory.mktemp("healthy")
    ray_head = session_head.running()
    outcome = rehearse(head_env(ray_head), root / "run", state_dir=str(root / "state"))
    _gone, alive = psutil.wait_procs(job_processes(ray_head), timeout=10)
    assert not alive, f"job processes left by the healthy run: {[p.pid for p in alive]}"
    return outcome


@pytest.fixture
def state_dir(tmp_path: Path) -> str:
    return str(tmp_path / "state")
