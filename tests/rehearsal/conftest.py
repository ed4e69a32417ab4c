"""One real Ray head on 127.0.0.1 (the driver's own ``RayHead``) for the rehearsal, started
when a test first needs it and stopped, every process checked gone, after the last test of its
xdist group; after each test no job entrypoint it started may be alive.
"""

from __future__ import annotations

import contextlib
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
    yield
    holder = item.config.stash.get(SESSION_HEAD, None)
    if holder is not None and uses_session_head(item) and not uses_session_head(nextitem):
        holder.stop()


def uses_session_head(item: pytest.Item | None) -> bool:
    return item is not None and "session_head" in getattr(item, "fixturenames", ())


def no_job_left(head: RayHead, by: str) -> None:
    with contextlib.suppress(psutil.Error):
        children = psutil.Process(head.owned.pid).children(recursive=True)
        jobs = []
        for child in children:
            with contextlib.suppress(psutil.Error):
                if any(marker in " ".join(child.cmdline()) for marker in JOB_MARKERS):
                    jobs.append(child)
        _gone, alive = psutil.wait_procs(jobs, timeout=10)
        assert not alive, f"job processes left by {by}: {[p.pid for p in alive]}"


def head_env(head: RayHead) -> dict[str, str]:
    return {
        **os.environ,
        "RAY_ADDRESS": head.dashboard_url,
        "RAY_AUTH_TOKEN_PATH": str(head.token_path),
    }


@pytest.fixture
def cluster_env(ray_head: RayHead) -> Iterator[dict[str, str]]:
    yield head_env(ray_head)
    no_job_left(ray_head, "the test")


@pytest.fixture(scope="session")
def healthy_run(session_head: SessionHead, tmp_path_factory: pytest.TempPathFactory) -> TrainResult:
    from tests.support.rehearsal import rehearse

    root = tmp_path_factory.mktemp("healthy")
    head = session_head.running()
    outcome = rehearse(head_env(head), root / "run", state_dir=str(root / "state"))
    no_job_left(head, "the healthy run")
    return outcome


@pytest.fixture
def state_dir(tmp_path: Path) -> str:
    return str(tmp_path / "state")
