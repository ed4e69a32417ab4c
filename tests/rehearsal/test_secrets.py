"""Secrets reach the job and nothing else: a fake W&B key and HF token, looked for everywhere.

The driver starts its own head with a fake ``WANDB_API_KEY`` and ``HF_TOKEN`` in the
launch environment. The job proves both reached it (the entrypoint and a Ray task print
their SHA-256, never the value), then waits while the test looks for the values, and for
the head's auth token, in: ``ps`` command lines sampled every 0.2 s for the whole run, the
dashboard's job API, every file of the Ray session dir (logs included) while the head runs,
and the run dir and state dir afterwards. Each place is first shown to hold something the
job did put there (its marker, its log line), so an empty search means something.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from miles_amd.recipe.plan import RAY_HEAD_STATE_FILE, build_train_plan
from miles_amd.recipe.settings import Recipe
from miles_amd.run.driver import execute
from miles_amd.run_dir import RunDir

pytestmark = pytest.mark.rehearsal

JOB = """\
# miles_amd_rehearsal_job
import hashlib, os, time, ray

def digest(name):
    return hashlib.sha256(os.environ.get(name, "").encode()).hexdigest()[:16]

ray.init()

@ray.remote
def task_digests():
    return digest("WANDB_API_KEY"), digest("HF_TOKEN")

print("entrypoint", digest("WANDB_API_KEY"), digest("HF_TOKEN"), flush=True)
print("task", *ray.get(task_digests.remote()), flush=True)
print("canary-" + "in-the-job-log", flush=True)
print("job-" + "ready", flush=True)
deadline = time.time() + 240
while not os.path.exists({go!r}) and time.time() < deadline:
    time.sleep(0.2)
"""


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


class PsSampler(threading.Thread):
    """Every command line ``ps`` shows, sampled until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.lines: set[str] = set()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            out = subprocess.run(["ps", "-eww", "-o", "args="], capture_output=True, text=True)
            self.lines.update(out.stdout.splitlines())
            time.sleep(0.2)


def files_under(root: Path) -> dict[Path, bytes]:
    found = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            try:
                found[path] = path.read_bytes()
            except OSError:
                continue  # removed while walking
    return found


def holding(files: dict[Path, bytes], value: str) -> list[str]:
    return [str(path) for path, data in files.items() if value.encode() in data]


def test_secrets_reach_the_job_by_inheritance_and_appear_nowhere(tmp_path: Path) -> None:
    key, token = f"wandb-fake-{secrets.token_hex(8)}", f"hf_fake{secrets.token_hex(8)}"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "HF_TOKEN")}
    env.update(WANDB_API_KEY=key, HF_TOKEN=token)
    run, state_dir, go = RunDir(tmp_path / "run"), tmp_path / "state", tmp_path / "go"
    plan = build_train_plan(
        Recipe(num_rollout=3),
        env,
        run_dir=str(run.root),
        entrypoint_prefix=(sys.executable, "-c", JOB.format(go=str(go))),
    )
    echoed: list[str] = []
    sampler = PsSampler()
    sampler.start()
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            execute,
            plan,
            timeout_s=300,
            state_dir=str(state_dir),
            echo=echoed.append,
        )
        try:
            deadline = time.monotonic() + 180
            while "job-ready" not in _read(run.job_log) and time.monotonic() < deadline:
                assert not running.done(), running.result()
                time.sleep(0.5)
            state = json.loads((state_dir / RAY_HEAD_STATE_FILE).read_text())
            head_dir = Path(state["temp_dir"])
            head_token = (head_dir / "auth_token").read_text()
            jobs_api = _get(f"{state['dashboard_url']}/api/jobs/", head_token)
            session = files_under(head_dir / "ray")
        finally:
            go.touch()
            outcome = running.result(timeout=180)
    sampler.stopped.set()
    sampler.join()
    assert outcome.status == "SUCCEEDED", outcome.summary()

    log = run.job_log.read_text()
    assert f"entrypoint {digest(key)} {digest(token)}" in log, "the job lacks a secret"
    assert f"task {digest(key)} {digest(token)}" in log, "Ray's workers lack a secret"
    # Each place held what the job put there, so finding no secret in it means something.
    assert "miles_amd_rehearsal_job" in jobs_api
    assert holding(session, "canary-in-the-job-log")
    assert any("miles_amd_rehearsal_job" in line for line in sampler.lines)
    written = files_under(run.root) | files_under(state_dir)
    assert run.plan_json in written and "WANDB_API_KEY" in written[run.plan_json].decode()
    places = {
        "the dashboard's /api/jobs/": lambda v: v in jobs_api,
        "the Ray session dir": lambda v: holding(session, v),
        "a ps command line": lambda v: any(v in line for line in sampler.lines),
        "the run dir or state dir": lambda v: holding(written, v),
        "the driver's output": lambda v: any(v in line for line in echoed),
    }
    named = {"WANDB_API_KEY": key, "HF_TOKEN": token, "the head's auth token": head_token}
    leaks = [
        f"{name} in {place}" for name, v in named.items() for place, has in places.items() if has(v)
    ]
    assert not leaks


def _get(url: str, token: str) -> str:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
