"""The driver on a real Ray cluster with real job processes, and the private heads it starts.

A job's entrypoint is a tiny Python program standing in for train.py; the recipe argv follows
it as on the node. Two real drivers (``execute`` in two subprocesses, each starting its own
head) run at once for a user with a Ray token of their own (``~/.ray/auth_token`` and
``RAY_AUTH_TOKEN``) and a ``TMPDIR`` too long for an AF_UNIX path: every socket their process
trees listen on is on loopback, on ports the tool picked (workers: kernel-assigned), shared by
neither; the dashboard answers 401 without a token and 403 to the user's. A fake W&B key and HF
token reach the job (it prints their SHA-256) and appear in no ``ps`` line, the jobs API, Ray's
session dirs, the run or state dirs, nor the drivers' output; each place is first shown to hold
what the job put there. Then one driver gets Ctrl-C (a real SIGINT): its job ends STOPPED by
``interrupt`` and every process of its head is gone, by pid.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, cast

import psutil
import pytest

from miles_amd.recipe.plan import RAY_HEAD_STATE_FILE, build_train_plan
from miles_amd.recipe.settings import Recipe
from miles_amd.records.job import JobRecord
from miles_amd.run.driver import DriverError, execute
from miles_amd.run.ray_head import (
    PORT_ENV_VARS,
    PORT_OPTIONS,
    TEMP_PREFIX,
    TEMP_ROOT,
    RayHead,
    RayHeadError,
)
from miles_amd.run_dir import RunDir
from tests.support.rehearsal import alive_pids

pytestmark = pytest.mark.rehearsal

JOB_MARK = "miles_amd_rehearsal_job"


def program(code: str) -> tuple[str, ...]:
    """An entrypoint prefix: ``python -c CODE`` (the recipe argv lands in sys.argv)."""
    return (sys.executable, "-c", f"# {JOB_MARK}\n{code}")


def plan_for(code: str, env: dict[str, str], run_dir: Path):
    return build_train_plan(
        Recipe(num_rollout=3), env, run_dir=str(run_dir), entrypoint_prefix=program(code)
    )


def job_of(run_dir: Path) -> JobRecord:
    return JobRecord.from_json(RunDir(run_dir).job_json.read_text())


def log_of(run_dir: Path) -> str:
    return RunDir(run_dir).job_log.read_text()


@pytest.mark.parametrize(
    ("code", "timeout_s", "status", "stopped_by", "driver_exit_code"),
    [
        ("import sys\nprint('about to fail', flush=True)\nsys.exit(3)\n", 120, "FAILED", None, 3),
        ("import time\nprint('about to fail', flush=True)\ntime.sleep(600)\n", 3, "STOPPED",
         "timeout", None),
    ],
)  # fmt: skip
def test_a_failed_or_timed_out_job_exits_one(
    cluster_env, tmp_path, state_dir, code, timeout_s, status, stopped_by, driver_exit_code
) -> None:
    run_dir = tmp_path / "run"
    plan = plan_for(code, cluster_env, run_dir)
    outcome = execute(plan, timeout_s=timeout_s, state_dir=state_dir)
    assert (outcome.status, outcome.stopped_by, outcome.exit_code) == (status, stopped_by, 1)
    job = job_of(run_dir)
    assert job.stopped_by == stopped_by and "about to fail" in log_of(run_dir)
    assert driver_exit_code is None or job.driver_exit_code == driver_exit_code


class TripOnLine:
    """A judge that fails once the job printed a marker line (stands in for a spike)."""

    name = "marker"
    detail = "marker line seen"
    failing_steps = (2,)

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def __call__(self, _evidence) -> list:
        return [self] if "FAULT" in log_of(self.run_dir) else []


def test_fail_fast_stops_within_two_intervals(cluster_env, tmp_path, state_dir) -> None:
    code = (
        "import time, datetime\n"
        "for k in range(60):\n"
        "    stamp = datetime.datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]\n"
        "    tag = ' FA' + 'ULT' if k == 2 else ''  # not literal: Ray echoes the code\n"
        "    print(f'(MegatronTrainRayActor pid=1) [{stamp} ] log_utils.py:1 - step {k}: "
        "{{}}{tag}', flush=True)\n"
        "    time.sleep(0.5)\n"
    )
    run_dir = tmp_path / "run"
    interval = 1.0
    outcome = execute(
        plan_for(code, cluster_env, run_dir),
        timeout_s=120,
        watch_interval_s=interval,
        watch=TripOnLine(run_dir),
        state_dir=state_dir,
    )
    assert outcome.stopped_by == "fail-fast" and outcome.status == "STOPPED"
    assert outcome.trip is not None and outcome.trip.step == 2
    job = job_of(run_dir)
    assert job.failfast is not None and job.failfast["rule"] == "marker"
    # Latency from the job's own clock: the stamp on the faulty line to the stop request.
    assert job.failfast_latency_s is not None
    assert 0 <= job.failfast_latency_s <= 2 * interval + 1.0, job
    assert "step 10:" not in log_of(run_dir)


def test_refuses_a_run_dir_with_old_evidence(cluster_env, tmp_path, state_dir) -> None:
    run_dir = tmp_path / "run"
    RunDir(run_dir).tensorboard.mkdir(parents=True)
    with pytest.raises(DriverError, match="already holds tensorboard"):
        execute(plan_for("print(1)", cluster_env, run_dir), timeout_s=30, state_dir=state_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == ["tensorboard"]


USER_TOKEN = "the-users-own-ray-token-0123456789"
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1"}

DRIVER = """\
import json, os, sys
from miles_amd.recipe.plan import build_train_plan
from miles_amd.recipe.settings import Recipe
from miles_amd.run.driver import execute

run_dir, state_dir, code = sys.argv[1:4]
plan = build_train_plan(
    Recipe(num_rollout=3), dict(os.environ), run_dir=run_dir,
    entrypoint_prefix=(sys.executable, "-c", code),
)
outcome = execute(plan, timeout_s=300, state_dir=state_dir)
print(outcome.summary())
print("head pids", json.dumps(outcome.head_pids))
raise SystemExit(outcome.exit_code)
"""

JOB = """\
# miles_amd_rehearsal_job
import hashlib, os, sys, time, ray

def digest(name):
    return hashlib.sha256(os.environ.get(name, "").encode()).hexdigest()[:16]

ray.init()

@ray.remote
def node_ip_and_digests():
    return ray.util.get_node_ip_address(), digest("WANDB_API_KEY"), digest("HF_TOKEN")

ip, *digests = ray.get(node_ip_and_digests.remote())
print("task ran on", ip, flush=True)
print("entrypoint", digest("WANDB_API_KEY"), digest("HF_TOKEN"), flush=True)
print("task", *digests, flush=True)
print("argv", len(sys.argv) > 100, "--num-rollout" in sys.argv, flush=True)
print("tb", os.environ["TENSORBOARD_DIR"], flush=True)
print("pid-" + "of-job", os.getpid(), flush=True)
print("canary-" + "in-the-job-log", flush=True)
print("job-" + "ready", flush=True)
deadline = time.time() + 240
while not os.path.exists({go!r}) and time.time() < deadline:
    time.sleep(0.2)
print("job-" + "done", flush=True)
"""


def user_env(tmp_path: Path) -> dict[str, str]:
    """A user with a Ray token of their own and a TMPDIR too long for socket paths."""
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(USER_TOKEN)
    tmpdir = tmp_path / ("t" * 60) / ("m" * 60)
    tmpdir.mkdir(parents=True)
    assert len(str(tmpdir)) > 108
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    return {**env, "HOME": str(home), "RAY_AUTH_TOKEN": USER_TOKEN, "TMPDIR": str(tmpdir)}


def wait_for(predicate, what: str, procs: list[subprocess.Popen], timeout_s: float = 180):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        for proc in procs:
            assert proc.poll() is None, f"a driver ended early: {proc.communicate()[0][-3000:]}"
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def log_has(run_dir: Path, text: str) -> bool:
    try:
        return text in RunDir(run_dir).job_log.read_text()
    except OSError:
        return False


def http_status(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10):
            return 200
    except urllib.error.HTTPError as error:
        return error.code


def http_text(url: str, token: str) -> str:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


def picked_ports(head: psutil.Process) -> set[int]:
    """The ports the tool gave ``ray start``: its argv flags and its metrics env vars."""
    argv, env = head.cmdline(), head.environ()
    ports = {int(argv[argv.index(option) + 1]) for option in PORT_OPTIONS}
    ports |= {int(env[name]) for name in PORT_ENV_VARS}
    assert len(ports) == len(PORT_OPTIONS) + len(PORT_ENV_VARS)
    assert argv[argv.index("--min-worker-port") + 1] == argv[argv.index("--max-worker-port") + 1]
    return ports


def listening(head: psutil.Process) -> list[tuple[str, int, str]]:
    """(address, port, command line) of every socket the head's process tree listens on."""
    tree = {p.pid: p for p in [head, *head.children(recursive=True)]}
    found = []
    for conn in psutil.net_connections(kind="inet"):
        if conn.pid in tree and conn.status == psutil.CONN_LISTEN:
            try:
                cmdline = " ".join(tree[conn.pid].cmdline())
            except psutil.Error:
                continue
            ip, port = cast("tuple[str, int]", conn.laddr)  # a listener has an address
            found.append((ip, port, cmdline))
    return found


def kernel_assigned(port: int) -> bool:
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return low <= port <= high


def check_private(state_file: Path) -> tuple[set[int], Path]:
    """Assert one running head is private; return the ports it listens on and its temp dir."""
    state = json.loads(state_file.read_text())
    head = psutil.Process(state["pid"])
    temp_dir = Path(state["temp_dir"])
    assert stat.S_IMODE(temp_dir.stat().st_mode) == 0o700
    token_file = temp_dir / "auth_token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text()
    assert token != USER_TOKEN and len(token) == 64
    picked = picked_ports(head)
    ports = set()
    for address, port, cmdline in listening(head):
        assert address in LOOPBACK, f"{cmdline[:80]} listens on {address}:{port}"
        is_worker = cmdline.startswith("ray::") or "miles_amd_rehearsal_job" in cmdline
        assert port in picked or (is_worker and kernel_assigned(port)), (port, cmdline[:80])
        ports.add(port)
    assert picked <= ports, f"picked but not listening: {sorted(picked - ports)}"
    jobs = f"{state['dashboard_url']}/api/jobs/"
    assert http_status(jobs, {}) == 401
    assert http_status(jobs, {"Authorization": f"Bearer {USER_TOKEN}"}) == 403
    assert http_status(jobs, {"Authorization": f"Bearer {token}"}) == 200
    return ports, temp_dir


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


def test_two_private_heads_keep_the_secrets_and_ctrl_c_stops_one(tmp_path: Path) -> None:
    key, hf_token = f"wandb-fake-{secrets.token_hex(8)}", f"hf_fake{secrets.token_hex(8)}"
    env = {**user_env(tmp_path), "WANDB_API_KEY": key, "HF_TOKEN": hf_token}
    runs = [tmp_path / f"run{i}" for i in (1, 2)]
    states = [tmp_path / f"state{i}" for i in (1, 2)]
    go = tmp_path / "go"
    sampler = PsSampler()
    sampler.start()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", DRIVER, str(run), str(state), JOB.format(go=str(go))],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for run, state in zip(runs, states, strict=True)
    ]
    try:
        wait_for(lambda: all(log_has(r, "job-ready") for r in runs), "both jobs", procs)
        (first, temp1), (second, temp2) = (check_private(s / RAY_HEAD_STATE_FILE) for s in states)
        assert not first & second, f"the two heads share ports {sorted(first & second)}"
        head_tokens = [(temp / "auth_token").read_text() for temp in (temp1, temp2)]
        state = json.loads((states[0] / RAY_HEAD_STATE_FILE).read_text())
        jobs_api = http_text(f"{state['dashboard_url']}/api/jobs/", head_tokens[0])
        session = files_under(temp1 / "ray") | files_under(temp2 / "ray")
        state = json.loads((states[1] / RAY_HEAD_STATE_FILE).read_text())
        job_pid = int(RunDir(runs[1]).job_log.read_text().split("pid-of-job")[1].split()[0])
        recorded = [state["pid"], job_pid, *(pid for pid, _ in state["descendants"])]
        procs[1].send_signal(signal.SIGINT)  # Ctrl-C while its job waits
    finally:
        go.touch()
        outputs = [proc.communicate(timeout=180)[0] for proc in procs]
        sampler.stopped.set()
        sampler.join()
    assert procs[0].returncode == 0, outputs[0][-3000:]
    job = JobRecord.from_json(RunDir(runs[0]).job_json.read_text())
    assert job.status == "SUCCEEDED" and job.end_time >= job.start_time > 0
    log = RunDir(runs[0]).job_log.read_text()
    assert "task ran on 127.0.0.1" in log and "argv True True" in log
    assert f"tb {runs[0]}/tensorboard" in log
    assert f"entrypoint {digest(key)} {digest(hf_token)}" in log, "the job lacks a secret"
    assert f"task {digest(key)} {digest(hf_token)}" in log, "Ray's workers lack a secret"
    assert procs[1].returncode != 0 and "KeyboardInterrupt" in outputs[1]
    job = JobRecord.from_json(RunDir(runs[1]).job_json.read_text())
    assert (job.status, job.stopped_by) == ("STOPPED", "interrupt")
    # each driver stopped its own head: every process it started and recorded, by pid
    (pids,) = [json.loads(x[10:]) for x in outputs[0].splitlines() if x[:10] == "head pids "]
    assert len(pids) > 3, outputs[0][-3000:]
    alive = alive_pids([*pids, *recorded])
    assert not alive, f"processes of a driver's head still alive: {alive}"
    for state_dir in states:
        assert not (state_dir / RAY_HEAD_STATE_FILE).exists()
    assert not temp1.exists() and not temp2.exists()
    # Each place held what the job put there, so finding no secret in it means something.
    assert "miles_amd_rehearsal_job" in jobs_api
    assert holding(session, "canary-in-the-job-log")
    assert any("miles_amd_rehearsal_job" in line for line in sampler.lines)
    written: dict[Path, bytes] = {}
    for root in (*runs, *states):
        written |= files_under(root)
    plan_json = RunDir(runs[0]).plan_json
    assert plan_json in written and b"WANDB_API_KEY" in written[plan_json]
    places = {
        "the dashboard's /api/jobs/": lambda v: v in jobs_api,
        "the Ray session dir": lambda v: holding(session, v),
        "a ps command line": lambda v: any(v in line for line in sampler.lines),
        "the run dir or state dir": lambda v: holding(written, v),
        "the driver's output": lambda v: any(v in out for out in outputs),
    }
    named = {"WANDB_API_KEY": key, "HF_TOKEN": hf_token}
    named |= {f"head {i}'s auth token": token for i, token in enumerate(head_tokens)}
    leaks = [
        f"{name} in {where}" for name, v in named.items() for where, has in places.items() if has(v)
    ]
    assert not leaks


def test_a_token_the_head_refuses_is_reported_as_such(ray_head: RayHead) -> None:
    wrong = dataclasses.replace(ray_head, token=USER_TOKEN)
    with pytest.raises(RayHeadError, match=r"refused this tool's own token: HTTP 403"):
        wrong._wait_ready(10)


def test_a_cluster_that_wants_a_token_says_so(cluster_env, tmp_path, state_dir) -> None:
    env = {k: v for k, v in cluster_env.items() if k != "RAY_AUTH_TOKEN_PATH"}

    def plan(run: str, **extra: str):
        return build_train_plan(
            Recipe(num_rollout=3),
            {**env, **extra},
            run_dir=str(tmp_path / run),
            entrypoint_prefix=(sys.executable, "-c", "print(1)"),
        )

    with pytest.raises(DriverError, match=r"requires token authentication \(HTTP 401"):
        execute(plan("none"), timeout_s=30, state_dir=state_dir)
    wrong = tmp_path / "wrong_token"
    wrong.write_text(USER_TOKEN)
    with pytest.raises(DriverError, match=r"requires token authentication \(HTTP 403"):
        execute(plan("wrong", RAY_AUTH_TOKEN_PATH=str(wrong)), timeout_s=30, state_dir=state_dir)
    missing = str(tmp_path / "no_such_token")
    with pytest.raises(DriverError, match=rf"RAY_AUTH_TOKEN_PATH={missing}: cannot read"):
        execute(plan("missing", RAY_AUTH_TOKEN_PATH=missing), timeout_s=30, state_dir=state_dir)


def test_a_head_that_cannot_start_says_why_and_leaves_no_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The private temp dir (and the token in it) this start made, by name: another xdist
    # worker may start a head of its own in /tmp meanwhile, so a before/after listing of
    # TEMP_ROOT is not this start's (seen in a clean .ci/run).
    made: list[Path] = []
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(**kwargs: Any) -> str:
        made.append(Path(real_mkdtemp(**kwargs)))
        return str(made[-1])

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    with pytest.raises(RayHeadError, match=r"ray start exited with code 2: .*no-such-flag"):
        RayHead.start(
            ("ray", "start", "--head", "--no-such-flag"),
            env=dict(os.environ),
            log_path=tmp_path / "head.log",
        )
    assert [(p.parent, p.name.startswith(TEMP_PREFIX)) for p in made] == [(TEMP_ROOT, True)]
    assert not made[0].exists()
