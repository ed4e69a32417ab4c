"""A broken or hostile Ray dashboard against the real ``miles-amd train --ray-address``.

The dashboard is a real HTTP server in a thread (``tests/support/fake_dashboard.py``) that
hangs, answers HTTP 500, a body that is not JSON, or JSON of the wrong shape on one route;
the command runs in-process through its entry (``tests/cli_runs.run_cli``) with each
request's read timeout at 1 s (``MILES_AMD_RAY_HTTP_TIMEOUT``). Whatever the reply: one
``miles-amd: error:`` line, no traceback, exit 2 before the job was submitted (and the run
dir left reusable) or 1 after it, within a bound, and the W&B key the reply echoes is never
printed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from miles_amd.run.dashboard import jobs_client
from miles_amd.run.driver import Follow, RayJob
from miles_amd.run.watcher import FailFastWatcher
from miles_amd.run_dir import RunDir
from tests.cli_runs import CliRun, run_cli
from tests.support.fake_dashboard import ROUTES, Reply, fake_dashboard

pytestmark = pytest.mark.no_ray  # starts no Ray: joins no Ray xdist group


SECRET = "wandb-SECRET-0123456789abcdef"
ENV = {
    **{k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH")},
    "MILES_AMD_RAY_HTTP_TIMEOUT": "1",
    "WANDB_API_KEY": SECRET,
}
ECHOED = json.dumps({"runtime_env": {"env_vars": {"WANDB_API_KEY": SECRET}}}).encode()
WRONG_TYPES = b'{"status": 5, "type": [], "entrypoint": {}}'
NO_SUITABLE_NODE = json.dumps(
    {"data": {"result": {"result": [{"node_id": "n1", "state": "ALIVE", "resources_total": {}}]}}}
).encode()

BEFORE_SUBMIT = {
    "version hangs": {"version": Reply(hang=True)},
    "version trickles": {"version": Reply(trickle=True)},
    "version 500": {"version": Reply(500, b"Internal Server Error")},
    "version not JSON": {"version": Reply(200, b"<html>")},
    "nodes 500": {"nodes": Reply(500, b"boom")},
    "nodes not JSON": {"nodes": Reply(200, b"\x00\xff junk")},
    "nodes of the wrong types": {"nodes": Reply(200, b'{"data": {"result": {"result": [1]}}}')},
    "nodes hang": {"nodes": Reply(hang=True)},
    "nodes trickle": {"nodes": Reply(trickle=True)},
    "no suitable node": {"nodes": Reply(200, NO_SUITABLE_NODE)},
    "submit 500 echoing the request": {"submit": Reply(500, b"bad: ", echo=True)},
    "submit 500 echoing the key first": {"submit": Reply(500, ECHOED)},
    "submit 500 with the key where the line is cut": {
        "submit": Reply(500, b"x" * 250 + SECRET.encode())
    },
}
AFTER_SUBMIT = {
    "status hangs": {"status": Reply(hang=True)},
    "status trickles": {"status": Reply(trickle=True)},
    "status 500": {"status": Reply(500, b"oops " + ECHOED)},
    "status not JSON": {"status": Reply(200, b"not json")},
    "status of the wrong types": {"status": Reply(200, WRONG_TYPES)},
    "status a list": {"status": Reply(200, b"[1, 2]")},
}


def train(address: str, run_dir: Path, timeout: str = "30") -> tuple[CliRun, float]:
    start = time.monotonic()
    args = ["train", "--ray-address", address, "--run-dir", str(run_dir), "--timeout", timeout]
    done = run_cli(*args, env=ENV)
    return done, time.monotonic() - start


def assert_one_line(done: CliRun) -> str:
    assert "Traceback" not in done.stderr + done.stdout
    assert SECRET[:10] not in done.stderr + done.stdout  # not even a cut-off start of it
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("miles-amd: error: "), done.stderr
    return lines[0]


@pytest.mark.parametrize("case", sorted(BEFORE_SUBMIT))
def test_a_bad_reply_before_submission_is_bad_input_and_leaves_the_run_dir_fresh(
    case: str, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    with fake_dashboard(BEFORE_SUBMIT[case]) as fake:
        done, seconds = train(fake.address, run_dir)
    line = assert_one_line(done)
    assert done.returncode == 2, line
    assert "127.0.0.1" in line or "node list" in line, line
    assert "an earlier run" not in line
    assert seconds < 8, seconds  # a hang costs one read timeout (1 s), not forever
    assert not any(path.exists() for path in RunDir(run_dir).markers)  # reusable
    if "submit" in case:
        assert fake.count("stop") == 1  # a submission that may have arrived is stopped
    else:
        assert fake.count("submit") == 0


@pytest.mark.parametrize("case", sorted(AFTER_SUBMIT))
def test_a_bad_reply_after_submission_is_a_red_run(case: str, tmp_path: Path) -> None:
    with fake_dashboard(AFTER_SUBMIT[case]) as fake:
        done, seconds = train(fake.address, tmp_path / "run")
    line = assert_one_line(done)
    assert done.returncode == 1, line
    assert "the Ray Jobs API failed while following it" in line, line
    assert seconds < 12, seconds  # a few requests, each given up on within its timeouts
    assert fake.count("stop") >= 1  # asked to stop, whatever the status said


def test_a_status_that_never_ends_is_stopped_once_and_waited_for_a_bound(tmp_path: Path) -> None:
    """The job stays RUNNING after its stop: one stop request, one bounded wait (the old
    path waited 60 s, then 60 s more), and job.json says it was stopped by the timeout."""
    run_dir = RunDir(tmp_path)
    with fake_dashboard() as fake:
        client = jobs_client(fake.address, {})
        job = RayJob(client, "job-1", run_dir)
        follow = Follow(timeout_s=0.5, interval_s=10.0, echo=lambda _: None, stop_wait_s=1.0)
        start = time.monotonic()
        record = job.run(FailFastWatcher(tmp_path, lambda _: []), follow, None)
        seconds = time.monotonic() - start
    assert fake.count("stop") == 1
    assert seconds < 0.5 + 1.0 + 2.0, seconds
    assert (record.status, record.stopped_by) == ("RUNNING", "timeout")
    assert json.loads(run_dir.job_json.read_text())["stopped_by"] == "timeout"


class SlowPoll:
    """A watcher whose poll takes ``seconds``, as a cluster poll's pull (a Ray job) does."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.polls: list[tuple[float, float]] = []  # (start, end), monotonic

    def poll(self) -> None:
        start = time.monotonic()
        time.sleep(self.seconds)
        self.polls.append((start, time.monotonic()))


def test_the_watch_interval_is_a_pause_after_each_poll(tmp_path: Path) -> None:
    """A poll slower than the interval: the next poll still waits the interval after it ends
    (scheduled from the poll's start, slow pulls ran back to back, half a second apart)."""
    watcher = SlowPoll(0.9)
    with fake_dashboard() as fake:
        job = RayJob(jobs_client(fake.address, {}), "job-1", RunDir(tmp_path))
        follow = Follow(timeout_s=3.6, interval_s=0.8, echo=lambda _: None, stop_wait_s=1.0)
        job.run(watcher, follow, None)
    assert len(watcher.polls) >= 2, watcher.polls
    pauses = [b[0] - a[1] for a, b in zip(watcher.polls, watcher.polls[1:], strict=False)]
    assert min(pauses) >= 0.8, pauses


replies = st.builds(
    Reply,
    code=st.sampled_from([200, 404, 500, 502]),
    body=st.one_of(
        st.binary(max_size=40),
        st.sampled_from([ECHOED, WRONG_TYPES, b"[]", b"null", b'{"data": 1}', b"{}"]),
        st.builds(
            lambda text: json.dumps({"message": text, "key": SECRET}).encode(),
            st.text(max_size=20),
        ),
    ),
    hang=st.booleans(),
)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bad=st.dictionaries(st.sampled_from(ROUTES), replies, min_size=1, max_size=2))
def test_whatever_the_dashboard_answers_the_command_ends_in_one_line(bad: dict) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, fake_dashboard(bad) as fake:
        fake.status = "SUCCEEDED"  # the job ends at once unless a bad reply says otherwise
        done, seconds = train(fake.address, Path(tmp) / "run", timeout="2")
        outside = sorted(p.name for p in Path(tmp).iterdir())
    assert done.returncode in (0, 1, 2), done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert SECRET not in done.stderr + done.stdout
    assert seconds < 2 + 15, seconds
    assert outside in ([], ["run"])  # nothing written beside the run dir
    if done.returncode == 2:
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not any(path.exists() for path in RunDir(Path(tmp) / "run").markers)
