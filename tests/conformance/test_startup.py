"""Start-up smoke: miles' real ``train()`` runs the planned recipe on CPU under the plan's own
``ray start`` (made private) and must stop exactly at SGLang's engine init ("No accelerator");
an earlier stop names its stage and the driver's last error. Every process carrying the head's
private ``TMPDIR`` is stopped by pid (docs/conformance.md, "Start-up smoke").
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from miles_amd.files import atomic_write_text
from miles_amd.recipe.plan import LaunchPlan, build_train_plan
from miles_amd.recipe.settings import Recipe
from miles_amd.run.ray_head import (
    PORT_ENV_VARS,
    PORT_OPTIONS,
    TOKEN_FILE,
    WORKER_PORTS,
    OwnedProcess,
    free_ports,
    head_environment,
    signal_and_wait,
    spawn_logged,
)
from tests.conformance.fake_inputs import MODEL_SUBDIR, STAND_IN_TOKENIZER_SCRIPT, make_fake_inputs
from tests.conformance.harness import CHILD, MilesCheckout, run_child

pytestmark = [pytest.mark.conformance, pytest.mark.xdist_group("startup")]

DRIVER_TIMEOUT_S = 420.0  # a wedged start, not a slow one: the run takes ~3 min
UNUSED_PORT_OPTIONS = ("--dashboard-port", "--ray-client-server-port")  # no dashboard, no client
JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # ray/_private/runtime_env/constants.py
NO_ACCELERATOR = (
    "RuntimeError: No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is available."
)
ENGINE_INIT_FRAMES = (
    r'sglang_engine\.py", line \d+, in _init_normal',
    r"launch_server_process\(ServerArgs\(\*\*server_args_dict\)\)",
    r'sglang/srt/utils/common\.py", line \d+, in get_device',
)
# train.py's own end: create_rollout_manager's ray.get on the dead RolloutManager
DRIVER_STOP = (
    r"ray\.exceptions\.ActorDiedError: The actor died because of an error raised in its "
    r"creation task, ray::RolloutManager\.__init__\(\)"
)
ERROR_LINE = re.compile(r"^(?:\S+\.)?\w*(?:Error|Exception|Exit)\b.*:|^\S+: error: ")
BUNDLE = r"bundle\s+(\d+), actual_bundle_index"
GPUS = Recipe().num_gpus
ENGINES = GPUS // Recipe().rollout_num_gpus_per_engine
ENGINE_PORTS = r"Ports for engine (\d+)"


def count(pattern: str, log: str) -> int:
    return len(set(re.findall(pattern, log)))


@dataclass(frozen=True)
class Stage:
    name: str
    reached: Callable[[str], bool]
    defect: str  # what a stop just before this stage means


# In the order train() reaches them (pinned miles 31f1ca961), each with the line that proves it.
STAGES = (
    Stage(
        "parse",
        lambda log: f"Creating placement group with {GPUS} GPUs" in log,
        "parse_args() or an import refused the argv / env before train() ran",
    ),
    Stage(
        "placement group",
        lambda log: count(BUNDLE, log) == GPUS,
        "Ray did not place the GPU bundles (the head's --num-gpus, or the job's device env)",
    ),
    Stage(
        "rollout manager",
        lambda log: (
            re.search(r"rollout_manager\.py:\d+ - import \S+ as generate_rollout", log) is not None
        ),
        "the rollout manager did not start: the data source (--prompt-data, --input-key, "
        "--label-key, --apply-chat-template, the checkpoint's tokenizer) or a function path",
    ),
    Stage(
        "router",
        lambda log: "Router launched at" in log,
        "miles' router did not start (--sglang-router-* flags, sglang-router)",
    ),
    Stage(
        "engines",
        lambda log: count(ENGINE_PORTS, log) == ENGINES,
        "not all rollout engines (--rollout-num-gpus-per-engine, --num-gpus-per-node)",
    ),
    Stage(
        "engine init",
        lambda log: NO_ACCELERATOR in log and all(re.search(f, log) for f in ENGINE_INIT_FRAMES),
        "SGLang's engine init failed for another reason than the missing accelerator: miles' "
        "server args (the --sglang-* flags) or SGLang refused them",
    ),
)


def first_missing(log: str) -> Stage | None:
    return next((stage for stage in STAGES if not stage.reached(log)), None)


def last_error(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if ERROR_LINE.search(line.strip())]
    return lines[-1] if lines else "(no exception line in the driver log)"


@dataclass
class Run:
    """A private head, miles' driver under it, and every process seen with its ``TMPDIR``."""

    temp_dir: Path
    head: subprocess.Popen[bytes]
    head_owned: OwnedProcess
    driver: subprocess.Popen[bytes] | None = None
    seen: set[OwnedProcess] = field(default_factory=set)

    def owned_now(self) -> list[OwnedProcess]:
        found = []
        for proc in psutil.process_iter(["pid", "create_time"]):
            with contextlib.suppress(psutil.Error):
                if proc.environ().get("TMPDIR") == str(self.temp_dir):
                    found.append(OwnedProcess(proc.pid, proc.info["create_time"]))
        self.seen.update(found)
        return found

    def stop(self) -> list[int]:
        """Stop the driver and the head, then every process seen; the pids still alive."""
        self.owned_now()
        if self.driver is not None and self.driver.poll() is None:
            self.driver.terminate()
        self.head_owned.signal(signal.SIGTERM)  # `ray start --block` stops what it spawned
        signal_and_wait([self.head_owned], None, 20.0)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for proc in [*self.seen, *self.owned_now()]:
                proc.signal(sig)
            signal_and_wait(list(self.seen), None, 5.0)
        for process in (self.driver, self.head):
            if process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=5)
        left = [p.pid for p in {*self.seen, *self.owned_now()} if p.alive()]
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return left


def start(plan: LaunchPlan, checkout: MilesCheckout, logs: Path) -> Run:
    """The plan's ``ray start``, private; ``train.py`` in the env Ray's job supervisor gives."""
    assert plan.job is not None
    (ray_start,) = [step for step in plan.steps if step.name == "ray-start"]
    names = (*PORT_OPTIONS, *PORT_ENV_VARS)
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    temp_dir = Path(tempfile.mkdtemp(prefix="miles-startup-", dir="/tmp"))
    atomic_write_text(temp_dir / TOKEN_FILE, secrets.token_hex(32), mode=0o600)
    base = {k: os.environ[k] for k in ("HOME", "LANG", "LC_ALL") if k in os.environ}
    base["PATH"] = os.pathsep.join([str(checkout.python.parent), os.environ.get("PATH", "")])
    env = head_environment({**base, **plan.process_env}, temp_dir, temp_dir / TOKEN_FILE, ports)
    # miles asks one CPU per GPU bundle, its rollout manager and that manager's lock one each
    cpus = plan.recipe.num_gpus + 2
    argv = [str(checkout.python), "-m", "ray.scripts.scripts", *ray_start.argv[1:]]
    argv += ["--include-dashboard=false", "--num-cpus", str(cpus), "--block"]
    argv += ["--temp-dir", str(temp_dir / "ray"), *WORKER_PORTS]
    argv += [str(x) for o in PORT_OPTIONS if o not in UNUSED_PORT_OPTIONS for x in (o, ports[o])]
    run = Run(temp_dir, *spawn_logged(argv, env, logs / "head.log"))
    deadline = time.monotonic() + 120.0
    while "Ray runtime started" not in (logs / "head.log").read_text(errors="replace"):
        if run.head.poll() is not None or time.monotonic() > deadline:
            left = run.stop()
            tail = (logs / "head.log").read_text(errors="replace")[-2000:]
            raise AssertionError(f"the private Ray head did not start (left: {left}): {tail}")
        time.sleep(0.5)
    runtime_env = plan.job.runtime_env()
    env_vars = dict(runtime_env["env_vars"])  # type: ignore[call-overload]
    env_vars["PYTHONPATH"] = checkout.parse_pythonpath(env_vars["PYTHONPATH"])
    job_config = {"runtime_env": {**runtime_env, "env_vars": env_vars}, "metadata": {}}
    driver_env = {
        **env,
        **env_vars,
        "RAY_ADDRESS": f"127.0.0.1:{ports['--port']}",
        JOB_CONFIG_ENV: json.dumps(job_config),
        "PYTHONUNBUFFERED": "1",
    }
    python, train_script, *train_argv = plan.job.entrypoint
    run.driver, _ = spawn_logged(
        [python, str(CHILD), "train", train_script, *train_argv], driver_env, logs / "driver.log"
    )
    return run


@dataclass(frozen=True)
class Startup:
    returncode: int | None
    log: str
    log_path: Path
    left: list[int]


@pytest.fixture(scope="module")
def started(checkout: MilesCheckout, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Startup]:
    root = tmp_path_factory.mktemp("startup")
    model_dir, data_dir = make_fake_inputs(root / "inputs")
    tokenizer = (STAND_IN_TOKENIZER_SCRIPT, str(model_dir / MODEL_SUBDIR))
    run_child([str(checkout.python), "-c", *tokenizer], os.environ, 300)
    recipe = Recipe(
        model_dir=str(model_dir),
        data_dir=str(data_dir),
        miles_dir=str(checkout.miles),
        megatron_dir=str(checkout.megatron),
    )
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    plan = build_train_plan(recipe, env, run_dir=str(root / "run"), state_dir=str(root / "state"))
    run = start(plan, checkout, root)
    returncode = None
    try:
        deadline = time.monotonic() + DRIVER_TIMEOUT_S
        while returncode is None and time.monotonic() < deadline:
            run.owned_now()  # orphans too: SGLang's children outlive their actor
            returncode = run.driver.poll() if run.driver else None
            time.sleep(1.0)
    finally:
        left = run.stop()
    log = re.sub(r"\x1b\[[0-9;]*m", "", (root / "driver.log").read_text(errors="replace"))
    yield Startup(returncode, log, root / "driver.log", left)


def test_startup_stops_exactly_at_sglang_engine_init(started: Startup) -> None:
    assert started.returncode is not None, (
        f"train() did not stop within {DRIVER_TIMEOUT_S:g} s (log: {started.log_path})"
    )
    missing = first_missing(started.log)
    assert missing is None, (
        f"train() stopped before the stage '{missing.name}': {missing.defect}; "
        f"its last error: {last_error(started.log)} (log: {started.log_path})"
    )
    assert started.returncode != 0
    assert re.search(DRIVER_STOP, started.log), last_error(started.log)
    assert count(BUNDLE, started.log) == GPUS == 8
    assert count(r"Actor\(SGLangEngine, ([0-9a-f]+)\)", started.log) == ENGINES == 2
    assert count(ENGINE_PORTS, started.log) == 2
    assert started.left == [], f"processes of the start-up smoke still alive: {started.left}"


def test_startup_names_the_stage_of_an_earlier_stop(started: Startup) -> None:
    """The log cut before each stage's proof names that stage (or an earlier one it also cut)."""
    lines = started.log.splitlines()
    for index, stage in enumerate(STAGES):
        cut = next(i for i in range(len(lines) + 1) if stage.reached("\n".join(lines[:i])))
        shorter = "\n".join(lines[: cut - 1])
        assert not stage.reached(shorter), stage.name
        missing = first_missing(shorter)
        earlier_cut = [s.name for s in STAGES[:index] if not s.reached(shorter)]
        assert missing is not None and missing.name == (earlier_cut or [stage.name])[0], stage.name
