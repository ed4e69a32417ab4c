"""miles' real ``train()`` on CPU, started as ``miles-amd train`` starts it, and how far it got.

What is the same as ``miles-amd train`` on a node: the job's entrypoint tokens after
``train.py`` and its runtime env come from the real plan (``build_train_plan``); the head is
started with the plan's own ``ray start`` step (``--num-gpus`` = the recipe's GPU count, on
127.0.0.1) in the plan's device env; the driver process is composed the way Ray's job
supervisor composes it (``ray/dashboard/modules/job/job_supervisor.py``: the head's env, the
runtime env's ``env_vars``, ``RAY_ADDRESS``, and the runtime env in
``RAY_JOB_CONFIG_JSON_ENV_VAR``, which ``ray.init`` in the driver turns into the job's runtime
env for every worker).

What differs, and why (each is about this machine, not the recipe):

- the entrypoint is ``python3 train_entry.py <miles_parse.py> <miles>/train.py <argv>``:
  ``train.py`` runs as ``__main__`` after the parse probe's two GPU-query stubs
  (``train_entry.py`` says why); ``python3`` is the conformance python (first on ``PATH``);
- the head runs without the dashboard (``--include-dashboard=false``: the lean env has
  Ray's minimal install, and no job is submitted through it), declares
  :func:`logical_cpus` CPUs (a 2-core machine would never place miles' eight 1-CPU GPU
  bundles), and is private: a fresh 0700 temp dir under /tmp, every port chosen by
  ``ray_head.free_ports``, kernel-assigned worker ports, token auth, loopback only;
- the inert ``triton`` / ``torchvision`` stand-ins go last on the job's ``PYTHONPATH`` when
  the python lacks the real ones (``checkout.MilesCheckout.parse_pythonpath``).

Cleanup: every process that carries the head's private ``TMPDIR`` (the head, raylet, GCS,
workers, the driver, miles' router and anything SGLang spawned, orphaned or not) is found by
its environment and stopped by pid (checked with its create time); :meth:`StartupRun.stop`
returns what is still alive afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from miles_amd.files import atomic_write_text
from miles_amd.recipe.plan import LaunchPlan
from miles_amd.run.ray_head import (
    PORT_ENV_VARS,
    PORT_OPTIONS,
    TOKEN_FILE,
    WORKER_PORTS,
    OwnedProcess,
    free_ports,
    head_environment,
    spawn_logged,
)
from tests.conformance.checkout import MilesCheckout

HERE = Path(__file__).resolve().parent
TRAIN_ENTRY = HERE / "train_entry.py"
GPU_STUBS = HERE.parents[1] / "src" / "miles_amd" / "node" / "miles_parse.py"
# Ports ray start would open for parts the lean head does not run (dashboard, Ray client).
UNUSED_PORT_OPTIONS = ("--dashboard-port", "--ray-client-server-port")
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # ray/_private/runtime_env/constants.py
HEAD_READY_LINE = "Ray runtime started"
PASSTHROUGH_ENV = ("HOME", "LANG", "LC_ALL")


def logical_cpus(num_gpus: int) -> int:
    """miles' placement group asks one CPU per GPU bundle, its rollout manager and that
    manager's lock one each; more would only make Ray prestart idle workers on 2 cores."""
    return num_gpus + 2


@dataclass
class StartupRun:
    """A private head and miles' driver under it; :meth:`stop` on every exit path."""

    temp_dir: Path
    head: OwnedProcess
    head_process: subprocess.Popen[bytes]
    driver_log: Path
    head_log: Path
    driver: subprocess.Popen[bytes] | None = None
    seen: set[OwnedProcess] = field(default_factory=set)

    def owned_now(self) -> list[OwnedProcess]:
        """Every live process carrying this run's private TMPDIR (orphans included)."""
        marker = str(self.temp_dir)
        found = []
        for proc in psutil.process_iter(["pid", "create_time"]):
            with contextlib.suppress(psutil.Error):
                if proc.environ().get("TMPDIR") == marker:
                    found.append(OwnedProcess(proc.pid, proc.info["create_time"]))
        self.seen.update(found)
        return found

    def wait_driver(self, timeout_s: float) -> int | None:
        """The driver's exit code, or None if it was still running at ``timeout_s``."""
        assert self.driver is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.owned_now()
            if self.driver.poll() is not None:
                return self.driver.returncode
            time.sleep(1.0)
        return None

    def stop(self) -> list[int]:
        """Stop the driver and the head, then every process seen; pids still alive."""
        self.owned_now()
        if self.driver is not None and self.driver.poll() is None:
            self.driver.terminate()
        self.head.signal(signal.SIGTERM)  # `ray start --block` stops what it spawned
        _wait_gone([self.head], 20.0)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for proc in [*self.seen, *self.owned_now()]:
                proc.signal(sig)
            _wait_gone(list(self.seen), 5.0)
        for process in (self.driver, self.head_process):
            if process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=5)
        left = [p.pid for p in {*self.seen, *self.owned_now()} if p.alive()]
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return left


def _wait_gone(procs: list[OwnedProcess], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(p.alive() for p in procs):
        time.sleep(0.2)


def start_head(
    plan: LaunchPlan, checkout: MilesCheckout, logs: Path, timeout_s: float = 120.0
) -> tuple[StartupRun, dict[str, str], int]:
    """The plan's ``ray start`` step, private and without dashboard; waits until it serves.

    Returns the run, the head's environment (the driver inherits it) and the GCS port.
    """
    (ray_start,) = [step for step in plan.steps if step.name == "ray-start"]
    names = (*PORT_OPTIONS, *PORT_ENV_VARS)
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    temp_dir = Path(tempfile.mkdtemp(prefix="miles-startup-", dir="/tmp"))
    atomic_write_text(temp_dir / TOKEN_FILE, secrets.token_hex(32), mode=0o600)
    python_dir = str(Path(checkout.python).parent)
    base = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
    base["PATH"] = os.pathsep.join([python_dir, os.environ.get("PATH", "/usr/bin:/bin")])
    env = head_environment({**base, **plan.process_env}, temp_dir, temp_dir / TOKEN_FILE, ports)
    num_gpus = plan.recipe.num_gpus
    argv = [str(checkout.python), "-m", "ray.scripts.scripts", *ray_start.argv[1:]]
    argv += ["--include-dashboard=false", "--num-cpus", str(logical_cpus(num_gpus))]
    argv += ["--block", "--temp-dir", str(temp_dir / "ray")]
    argv += [str(x) for o in PORT_OPTIONS if o not in UNUSED_PORT_OPTIONS for x in (o, ports[o])]
    argv += WORKER_PORTS
    head_log = logs / "head.log"
    process, owned = spawn_logged(argv, env, head_log)
    run = StartupRun(temp_dir, owned, process, logs / "driver.log", head_log)
    deadline = time.monotonic() + timeout_s
    while HEAD_READY_LINE not in head_log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            left = run.stop()
            tail = head_log.read_text(errors="replace")[-2000:]
            raise AssertionError(f"the private Ray head did not start (left: {left}): {tail}")
        time.sleep(0.5)
    return run, env, ports["--port"]


def start_driver(
    run: StartupRun,
    plan: LaunchPlan,
    checkout: MilesCheckout,
    head_env: Mapping[str, str],
    gcs_port: int,
) -> None:
    """``python3 <miles>/train.py <argv>`` as Ray's job supervisor would start it."""
    assert plan.job is not None
    runtime_env = plan.job.runtime_env()
    env_vars = dict(runtime_env["env_vars"])  # type: ignore[call-overload]
    env_vars["PYTHONPATH"] = checkout.parse_pythonpath(env_vars["PYTHONPATH"])
    runtime_env = {**runtime_env, "env_vars": env_vars}
    env = {
        **head_env,
        **env_vars,
        "RAY_ADDRESS": f"127.0.0.1:{gcs_port}",
        JOB_CONFIG_ENV: json.dumps({"runtime_env": runtime_env, "metadata": {}}),
        "PYTHONUNBUFFERED": "1",
    }
    python, train_script, *train_argv = plan.job.entrypoint
    argv = [python, str(TRAIN_ENTRY), str(GPU_STUBS), train_script, *train_argv]
    run.driver, _ = spawn_logged(argv, env, run.driver_log)
