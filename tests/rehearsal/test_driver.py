"""The driver on a real Ray cluster with real job processes (no replay, no gate needed).

The job's entrypoint is a tiny Python program standing in for train.py; the recipe argv
follows it unchanged, exactly as on the node.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from miles_amd.recipe.plan import RAY_HEAD_STATE_FILE, build_train_plan
from miles_amd.recipe.settings import Recipe
from miles_amd.records.job import JobRecord
from miles_amd.run.driver import execute
from miles_amd.run_dir import RunDir
from tests.support.rehearsal import alive_pids

pytestmark = pytest.mark.rehearsal

JOB = "miles_amd_rehearsal_job"


def program(code: str) -> tuple[str, ...]:
    """An entrypoint prefix: ``python -c CODE`` (the recipe argv lands in sys.argv)."""
    return (sys.executable, "-c", f"# {JOB}\n{code}")


def plan_for(code: str, env: dict[str, str], run_dir: Path):
    return build_train_plan(
        Recipe(num_rollout=3), env, run_dir=str(run_dir), entrypoint_prefix=program(code)
    )


def job_of(run_dir: Path) -> JobRecord:
    return JobRecord.from_json(RunDir(run_dir).job_json.read_text())


def log_of(run_dir: Path) -> str:
    return RunDir(run_dir).job_log.read_text()


def test_success_writes_log_and_job_json(cluster_env, tmp_path, state_dir) -> None:
    code = (
        "import os, sys\n"
        "print('argv', len(sys.argv) > 100, '--num-rollout' in sys.argv, flush=True)\n"
        "print('tb', os.environ['TENSORBOARD_DIR'], flush=True)\n"
        "print('secret' if 'WANDB_API_KEY' in os.environ else 'no-key', flush=True)\n"
    )
    env = {**cluster_env, "WANDB_API_KEY": "wk-not-printed-123"}
    run_dir = tmp_path / "run"
    outcome = execute(plan_for(code, env, run_dir), timeout_s=120, state_dir=state_dir)
    assert outcome.status == "SUCCEEDED" and outcome.exit_code == 0
    log = log_of(run_dir)
    assert "argv True True" in log and f"tb {run_dir}/tensorboard" in log
    assert "secret" in log, "the W&B key reached the job's env"
    job = job_of(run_dir)
    assert job.status == "SUCCEEDED" and job.stopped_by is None
    assert job.end_time >= job.start_time > 0
    plan_text = RunDir(run_dir).plan_json.read_text() + log
    assert "wk-not-printed-123" not in plan_text


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
    from miles_amd.run.driver import DriverError

    run_dir = tmp_path / "run"
    RunDir(run_dir).tensorboard.mkdir(parents=True)
    with pytest.raises(DriverError, match="already holds tensorboard"):
        execute(plan_for("print(1)", cluster_env, run_dir), timeout_s=30, state_dir=state_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == ["tensorboard"]


INTERRUPTED_RUN = """\
import os, sys
from miles_amd.run.driver import execute
from miles_amd.recipe.plan import build_train_plan
from miles_amd.recipe.settings import Recipe

env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
code = (
    "# miles_amd_rehearsal_job\\nimport os, time\\n"
    "print('pid-' + 'of-job', os.getpid(), flush=True)\\ntime.sleep(600)\\n"
)
plan = build_train_plan(
    Recipe(num_rollout=3), env, run_dir=sys.argv[1],
    entrypoint_prefix=(sys.executable, "-c", code),
)
execute(plan, timeout_s=300, state_dir=sys.argv[2])
"""


def test_ctrl_c_stops_the_job_and_the_head_by_pid(tmp_path, state_dir) -> None:
    import signal
    import subprocess
    import time

    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED_RUN, str(run_dir), state_dir],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    state_file = Path(state_dir) / RAY_HEAD_STATE_FILE
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "pid-of-job" not in _read(RunDir(run_dir).job_log):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.5)
    state = json.loads(state_file.read_text())
    job_pid = int(_read(RunDir(run_dir).job_log).split("pid-of-job")[1].split()[0])
    recorded = [state["pid"], job_pid, *(pid for pid, _ in state["descendants"])]
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "KeyboardInterrupt" in out
    job = job_of(run_dir)
    assert job.status == "STOPPED" and job.stopped_by == "interrupt"
    alive = alive_pids(recorded)
    assert not alive, f"processes of the interrupted run's head still alive: {alive}"
    assert not state_file.exists()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
