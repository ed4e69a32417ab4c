"""Execute a launch plan as a Ray job and leave a complete run directory behind.

Decides the side effects of a run, in order: clear this tool's own leftovers, start a Ray
head unless the plan names a cluster, submit through Ray's Jobs SDK
(``JobSubmissionClient``, never ``ray job submit``), stream the job's log to ``job.log``
while it runs, let the fail-fast watcher stop a lost job early, enforce the overall timeout,
and write ``job.json`` when the job ends. On every exit path (success, failure, timeout,
Ctrl-C, exception) the job is stopped if still running and the head this call started is
stopped by pid; nothing else is touched. Judging the run is the gate's job; this module
only calls it at the end when a baseline is asked for.

``job.json``: Ray's ``status``, ``message``, ``start_time``/``end_time`` (seconds; Ray
reports milliseconds), ``driver_exit_code``, and ``stopped_by`` (``null``, ``"timeout"``,
``"interrupt"`` or ``"fail-fast"``) with the watcher's trip and the fail-fast latency
(stop request minus the moment the fault appeared on the job's own clock).

Facts measured with Ray 2.60 on CPU: ``tail_job_logs`` ends about 5 s after the job does,
so the final ``job.log`` is rewritten from ``get_job_logs`` (the authoritative full log)
once the job is terminal; ``stop_job`` reaches STOPPED in about 1.3 s.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from miles_amd.recipe.plan import RAY_HEAD_STATE_FILE, LaunchPlan
from miles_amd.run.watcher import FailFastWatcher, Trip

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
EVIDENCE_DIR_VARS = ("TENSORBOARD_DIR", "MILES_CI_GATE_RECORD_DIR")
STALE_EVIDENCE = ("tensorboard", "ci_history", "job.json", "job.log", "report")
EXIT_PASS, EXIT_FAIL, EXIT_UNUSABLE = 0, 1, 2


class DriverError(RuntimeError):
    """The run could not be driven (no Ray head, submit refused, ...)."""


@dataclass(frozen=True)
class RunOutcome:
    run_dir: Path
    job_id: str
    status: str
    stopped_by: str | None
    trip: Trip | None
    failfast_latency_s: float | None
    verdict: str | None  # the gate's, when a baseline was given
    exit_code: int
    head_pids: tuple[int, ...] = ()  # the Ray head this run started and all it spawned

    def summary(self) -> str:
        parts = [f"job {self.job_id}: {self.status}"]
        if self.stopped_by == "fail-fast" and self.trip:
            parts.append(
                f"stopped by fail-fast: {self.trip.rule} at step {self.trip.step} "
                f"({self.failfast_latency_s:.1f} s after it appeared)"
                if self.failfast_latency_s is not None
                else f"stopped by fail-fast: {self.trip.rule}"
            )
        elif self.stopped_by:
            parts.append(f"stopped by {self.stopped_by}")
        if self.verdict:
            parts.append(f"gate: {self.verdict.upper()} (report in {self.run_dir}/report/)")
        parts.append(f"run dir: {self.run_dir}")
        return "; ".join(parts)


def write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


class LogPump(threading.Thread):
    """Appends the job's log to ``job.log`` as Ray streams it (``tail_job_logs``)."""

    def __init__(self, client: Any, job_id: str, path: Path) -> None:
        super().__init__(name=f"log-pump-{job_id}", daemon=True)
        self.client, self.job_id, self.path = client, job_id, path
        self.closed = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._pump())
        except BaseException as exc:  # reported, the final log is fetched anyway
            self.error = exc

    async def _pump(self) -> None:
        with self.path.open("a", encoding="utf-8") as out:
            async for chunk in self.client.tail_job_logs(self.job_id):
                if self.closed.is_set():
                    return
                out.write(chunk)
                out.flush()

    def close(self, wait_s: float = 1.0) -> None:
        self.closed.set()
        self.join(timeout=wait_s)


def execute(
    plan: LaunchPlan,
    *,
    timeout_s: float,
    baseline: str | None = None,
    watch_interval_s: float = 10.0,
    state_dir: str | None = None,
    judge_partial: Callable[[Any], Any] | None = None,
    echo: Callable[[str], None] = print,
) -> RunOutcome:
    """Run ``plan`` to the end, write the run dir, gate it if ``baseline`` is given.

    ``judge_partial`` overrides the watcher's rules (default: the gate's ``hard_failures``
    against ``baseline``, or the patched baseline when none is given: the spike threshold,
    finiteness and fatal sentinels are the same in both).
    """
    from miles_amd.baseline.model import BaselineError, load_baseline
    from miles_amd.run.ray_head import RayHead, clear_leftovers, write_state

    if plan.job is None or plan.run_dir is None:
        raise DriverError("the plan has no job or no run dir; build it with build_train_plan")
    try:  # a bad baseline must fail before an hour of GPUs is spent, not after
        reference = load_baseline(baseline) if baseline is not None else None
        watch_reference = reference or load_baseline("patched")
    except BaselineError as exc:
        raise DriverError(f"--gate: {exc}") from exc
    run_dir = Path(plan.run_dir)
    stale = [name for name in STALE_EVIDENCE if (run_dir / name).exists()]
    if stale:
        raise DriverError(
            f"run dir {run_dir} already holds {', '.join(stale)} from an earlier run; "
            "pass a fresh --run-dir (old evidence would mix into this run's)"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    for key in EVIDENCE_DIR_VARS:  # made here, so a job that writes nothing there is seen
        if key in plan.job.env_vars:
            Path(plan.job.env_vars[key]).mkdir(parents=True, exist_ok=True)
    (run_dir / "job.log").write_text("")
    write_json(run_dir / "plan.json", plan.to_dict())
    state_file = Path(os.path.expanduser(state_dir or "~/.cache/miles_amd")) / RAY_HEAD_STATE_FILE
    cleared = clear_leftovers(state_file)
    if cleared:
        echo(f"cleanup: stopped this tool's leftover Ray processes {cleared}")

    head = None
    head_pids: tuple[int, ...] = ()
    client = None
    job_id = f"miles-amd-{uuid.uuid4().hex[:12]}"
    submitted = False
    stopped_by: str | None = None
    trip: Trip | None = None
    stop_requested_at: float | None = None
    try:
        if plan.ray_address is None:
            step = next(s for s in plan.steps if s.name == "ray-start")
            head = RayHead.start(
                step.argv,
                env={**os.environ, **plan.process_env},
                log_path=run_dir / "ray_head.log",
            )
            write_state(state_file, head)
            address = head.dashboard_url
        else:
            address = plan.ray_address
        client = _client(address)
        client.submit_job(
            entrypoint=shlex.join(plan.job.entrypoint),
            runtime_env=plan.job.runtime_env(),
            submission_id=job_id,
        )
        submitted = True
        echo(f"submitted {job_id} to {address}; log: {run_dir / 'job.log'}")
        pump = LogPump(client, job_id, run_dir / "job.log")
        pump.start()
        watcher = FailFastWatcher(run_dir, judge_partial or _hard_failures(watch_reference))
        started = time.monotonic()
        next_watch = started + watch_interval_s
        while True:
            status = client.get_job_status(job_id).value
            if status in TERMINAL:
                break
            now = time.monotonic()
            if now - started > timeout_s:
                stopped_by = "timeout"
            elif now >= next_watch:
                next_watch = now + watch_interval_s
                trip = watcher.poll()
                if trip is not None:
                    stopped_by = "fail-fast"
            if stopped_by:
                stop_requested_at = time.time()
                echo(f"stopping {job_id}: {stopped_by}" + (f" ({trip.rule})" if trip else ""))
                _stop_and_wait(client, job_id)
                break
            time.sleep(min(0.5, watch_interval_s))
        if head is not None:
            head.record_descendants()
        pump.close()
        trip = _write_final(client, job_id, run_dir, stopped_by, trip, stop_requested_at)
    except KeyboardInterrupt:
        stopped_by = "interrupt"
        raise
    except Exception as exc:
        if not submitted:
            raise DriverError(f"could not start the job: {exc}") from exc
        raise
    finally:
        if client is not None and submitted:
            _stop_if_running(client, job_id)
            if stopped_by == "interrupt":
                _write_final(client, job_id, run_dir, stopped_by, trip, time.time())
        if head is not None:
            head.stop()
            state_file.unlink(missing_ok=True)
            head_pids = tuple(p.pid for p in (head.owned, *head.descendants))

    job = json.loads((run_dir / "job.json").read_text())
    latency = job.get("failfast_latency_s")
    verdict = None
    exit_code = EXIT_PASS if job["status"] == "SUCCEEDED" and not stopped_by else EXIT_FAIL
    if reference is not None:
        from miles_amd.report.gate_run import gate_run_dir

        judged, _ = gate_run_dir(run_dir, reference, expected_rollouts=plan.recipe.num_rollout)
        verdict, exit_code = judged.verdict, judged.exit_code
    return RunOutcome(
        run_dir, job_id, job["status"], stopped_by, trip, latency, verdict, exit_code, head_pids
    )


def _client(address: str) -> Any:
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address)
    except Exception as exc:
        raise DriverError(f"no Ray Jobs API at {address}: {exc}") from exc


def _hard_failures(reference: Any) -> Callable[[Any], Any]:
    from miles_amd.judge.gate import hard_failures

    return lambda evidence: hard_failures(evidence, reference)


def _stop_and_wait(client: Any, job_id: str, timeout_s: float = 60.0) -> None:
    client.stop_job(job_id)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if client.get_job_status(job_id).value in TERMINAL:
            return
        time.sleep(0.2)


def _stop_if_running(client: Any, job_id: str) -> None:
    try:
        if client.get_job_status(job_id).value not in TERMINAL:
            _stop_and_wait(client, job_id)
    except Exception:  # the head may already be gone; its stop ends the job too
        pass


def _write_final(
    client: Any,
    job_id: str,
    run_dir: Path,
    stopped_by: str | None,
    trip: Trip | None,
    stop_requested_at: float | None,
) -> Trip | None:
    """The authoritative job.log and job.json, each written atomically; the trip, timed."""
    log = client.get_job_logs(job_id)
    tmp = run_dir / ".job.log.tmp"
    tmp.write_text(log, encoding="utf-8")
    os.replace(tmp, run_dir / "job.log")
    info = client.get_job_info(job_id)
    if trip is not None:
        trip = trip.timed_from(log.splitlines())
    latency = None
    if trip is not None and trip.fault_time is not None and stop_requested_at is not None:
        latency = round(stop_requested_at - trip.fault_time, 3)
    write_json(
        run_dir / "job.json",
        {
            "job_id": job_id,
            "status": info.status.value,
            "message": info.message or "",
            "start_time": info.start_time / 1000 if info.start_time else None,
            "end_time": info.end_time / 1000 if info.end_time else None,
            "driver_exit_code": info.driver_exit_code,
            "stopped_by": stopped_by,
            "stop_requested_at": stop_requested_at,
            "failfast": trip.to_dict() if trip else None,
            "failfast_latency_s": latency,
        },
    )
    return trip
