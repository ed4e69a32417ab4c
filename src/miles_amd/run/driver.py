"""Run a launch plan as a Ray job, follow it to its end, leave a complete run dir; no judging.

On every exit path a running job is stopped and a head this call started is stopped by pid; a
failure before submission removes what was laid out (exit 2). ``docs/cli.md`` ("How a run is
executed").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from miles_amd.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from miles_amd.files import atomic_write_text
from miles_amd.recipe.plan import RAY_HEAD_STATE_FILE, JobSpec, LaunchPlan
from miles_amd.records.job import JobRecord, LookStop
from miles_amd.redact import redact
from miles_amd.run.dashboard import DashboardError, JobsClient, jobs_client, token_headers
from miles_amd.run.watcher import FailFastWatcher, Trip
from miles_amd.run_dir import RunDir

if TYPE_CHECKING:
    from miles_amd.evidence.types import RunEvidence
    from miles_amd.run.pullback import PullBack
    from miles_amd.run.ray_head import RayHead


TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
STOP_WAIT_S = 30.0  # after the stop request, for the job to reach a terminal state
STOP_GRACE_S = 60.0  # beyond --timeout: the stop's wait, the final log and job.json
Echo = Callable[[str], None]


@dataclass(frozen=True)
class Follow:
    timeout_s: float
    interval_s: float
    echo: Echo
    cancel: threading.Event | None = None  # set by another thread: stop as on Ctrl-C
    stop_wait_s: float = STOP_WAIT_S  # after the stop request, for a terminal state


class Watcher(Protocol):
    def poll(self) -> Trip | None: ...


class RayJob:
    def __init__(self, client: Any, job_id: str, run_dir: RunDir) -> None:
        self.client, self.job_id, self.run_dir = client, job_id, run_dir
        self.stopped_by: str | None = None
        self.trip: Trip | None = None
        self.stop_requested_at: float | None = None
        self.stop_sent = False

    def run(self, watcher: Watcher, follow: Follow, head: RayHead | None) -> JobRecord:
        """Follow the job to its end and write job.log and job.json; Ctrl-C stops it too."""
        if isinstance(self.client, JobsClient):
            self.client.deadline = time.monotonic() + follow.timeout_s + STOP_GRACE_S
        close_stream = _stream_log(self.client, self.job_id, self.run_dir.job_log)
        try:
            self._follow(watcher, follow)
            if head is not None:  # the job's processes, so the head's stop reaches them
                head.record_descendants()
            close_stream()
            return self.write_final()
        except KeyboardInterrupt:
            self.stopped_by = "interrupt"
            self.stop_requested_at = time.time()
            raise
        finally:
            self._stop_if_running()
            if self.stopped_by == "interrupt":
                self.write_final()

    def _follow(self, watcher: Watcher, follow: Follow) -> None:
        started = time.monotonic()
        next_watch = started + follow.interval_s
        while self._status() not in TERMINAL:
            now = time.monotonic()
            if follow.cancel is not None and follow.cancel.is_set():
                self.stopped_by = "interrupt"
            elif now - started > follow.timeout_s:
                self.stopped_by = "timeout"
            elif now >= next_watch:
                self.trip = watcher.poll()
                self.stopped_by = self.trip.reason if self.trip is not None else None
                next_watch = time.monotonic() + follow.interval_s
            if self.stopped_by:
                self.stop_requested_at = time.time()
                why = f" ({self.trip.rule})" if self.trip else ""
                follow.echo(f"stopping {self.job_id}: {self.stopped_by}{why}")
                self._stop_and_wait(follow.stop_wait_s)
                return
            time.sleep(min(0.5, follow.interval_s))

    def _status(self) -> str:
        return str(self.client.get_job_status(self.job_id).value)

    def _stop_and_wait(self, timeout_s: float = STOP_WAIT_S) -> None:
        self.stop_sent = True
        self.client.stop_job(self.job_id)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._status() not in TERMINAL:
            time.sleep(0.2)

    def _stop_if_running(self) -> None:
        if self.stop_sent:
            return
        try:
            running = self._status() not in TERMINAL
        except Exception:  # unknown: ask for the stop anyway
            running = True
        if running:
            with contextlib.suppress(Exception):  # the head may be gone; its stop ends the job
                self._stop_and_wait()

    def write_final(self) -> JobRecord:
        """job.log (a lost node's: the streamed one, ``final_log_error`` says why) and job.json."""
        log, lost = self._final_log()
        atomic_write_text(self.run_dir.job_log, log)
        info = self.client.get_job_info(self.job_id)
        trip, stopped = self.trip, self.stop_requested_at
        if trip is not None:
            self.trip = trip = trip.timed_from(log.splitlines())
        look, latency = None, None
        if self.stopped_by == "look" and trip and trip.look and trip.alpha_spent is not None:
            look = LookStop(trip.look, trip.rule, trip.alpha_spent)
        if trip and trip.fault_time is not None and stopped is not None:
            latency = round(stopped - trip.fault_time, 3)
        record = JobRecord(
            job_id=self.job_id,
            status=info.status.value,
            message=redact(str(info.message or "")),
            start_time=info.start_time / 1000 if info.start_time else None,
            end_time=info.end_time / 1000 if info.end_time else None,
            driver_exit_code=info.driver_exit_code,
            stopped_by=self.stopped_by,
            stop_requested_at=self.stop_requested_at,
            failfast=asdict(trip) if trip else None,
            look=look,
            failfast_latency_s=latency,
            final_log_error=lost or None,
        )
        atomic_write_text(self.run_dir.job_json, record.to_json())
        return record

    def _final_log(self) -> tuple[str, str]:
        try:
            return str(self.client.get_job_logs(self.job_id)), ""
        except Exception as exc:  # the job's node is gone (or the head cannot reach it)
            first = redact((str(exc).strip().splitlines() or [type(exc).__name__])[0])
            lost = f"the final log could not be fetched from the job's node ({first})"
            try:
                streamed = self.run_dir.job_log.read_text(encoding="utf-8", errors="replace")
            except OSError:
                streamed = ""
            ending = "" if not streamed or streamed.endswith("\n") else "\n"
            return f"{streamed}{ending}[miles-amd] {lost}\n", lost


def _stream_log(client: Any, job_id: str, path: Path) -> Callable[[], None]:
    """Append the job's log to ``path`` as Ray streams it; the call returned ends that."""
    closed = threading.Event()

    async def pump() -> None:
        with path.open("a", encoding="utf-8") as out:
            async for chunk in client.tail_job_logs(job_id):
                if closed.is_set():
                    return
                out.write(chunk)
                out.flush()

    def run() -> None:
        with contextlib.suppress(BaseException):  # a lost stream: the final log decides
            asyncio.run(pump())

    thread = threading.Thread(target=run, name=f"log-pump-{job_id}", daemon=True)
    thread.start()

    def close() -> None:
        closed.set()
        thread.join(timeout=1.0)

    return close


EVIDENCE_DIR_VARS = ("TENSORBOARD_DIR", "MILES_CI_GATE_RECORD_DIR")


class DriverError(RuntimeError):
    """The run could not be driven; redacted; ``exit_code`` 2 when nothing was submitted."""

    def __init__(
        self, message: str, exit_code: int = EXIT_FAILED, *, secrets: Iterable[str] = ()
    ) -> None:
        super().__init__(redact(message, secrets))
        self.exit_code = exit_code


@dataclass(frozen=True)
class RunOutcome:
    run_dir: Path
    job_id: str
    status: str
    stopped_by: str | None
    trip: Trip | None
    failfast_latency_s: float | None
    exit_code: int  # 0 when the job succeeded and was not stopped, else 1
    head_pids: tuple[int, ...] = ()  # the Ray head this run started and all it spawned
    pullback_error: str | None = None  # cluster mode: why the evidence did not come back

    def summary(self) -> str:
        parts = [f"job {self.job_id}: {self.status}"]
        if self.stopped_by == "fail-fast" and self.trip:
            parts.append(
                f"stopped by fail-fast: {self.trip.rule} at step {self.trip.step} "
                f"({self.failfast_latency_s:.1f} s after it appeared)"
                if self.failfast_latency_s is not None
                else f"stopped by fail-fast: {self.trip.rule}"
            )
        elif self.stopped_by == "look" and self.trip and self.trip.look is not None:
            alpha = f", α spent {self.trip.alpha_spent:.3g}" if self.trip.alpha_spent else ""
            parts.append(
                f"stopped at the look at rollout {self.trip.look}: {self.trip.rule}{alpha}"
            )
        elif self.stopped_by:
            parts.append(f"stopped by {self.stopped_by}")
        if self.pullback_error:
            parts.append(self.pullback_error)
        parts.append(f"run dir: {self.run_dir}")
        return "; ".join(parts)


def execute(
    plan: LaunchPlan,
    *,
    timeout_s: float,
    watch: Callable[[RunEvidence], Sequence[object]] | None = None,
    watch_interval_s: float = 10.0,
    state_dir: str | None = None,
    echo: Echo = print,
    cancel: threading.Event | None = None,
) -> RunOutcome:
    """``watch`` maps the evidence so far to the hard failures that stop the job; ``cancel``,
    set from another thread, stops it as Ctrl-C would."""
    from miles_amd.escape import terminal

    if plan.job is None or plan.run_dir is None:
        raise DriverError("the plan has no job or no run dir; build it with build_train_plan")
    spec, run_dir, said = plan.job, RunDir(Path(plan.run_dir)), echo
    echo = lambda line: said(terminal(line))  # noqa: E731  (paths, job ids)
    laid_out = _prepare_run_dir(plan, spec, run_dir)
    from miles_amd.run.ray_head import clear_leftovers

    state_file = Path(os.path.expanduser(state_dir or "~/.cache/miles_amd")) / RAY_HEAD_STATE_FILE
    if cleared := clear_leftovers(state_file):
        echo(f"cleanup: stopped this tool's leftover Ray processes {cleared}")
    watcher = FailFastWatcher(run_dir.root, watch or (lambda _evidence: []))
    follow = Follow(timeout_s=timeout_s, interval_s=watch_interval_s, echo=echo, cancel=cancel)
    with _unsubmitted_undone(laid_out) as submitted, _cluster(plan, run_dir, state_file) as cluster:
        job_id, client = f"miles-amd-{uuid.uuid4().hex[:12]}", None
        try:
            with _bad_input():  # a bad token is named first
                ready = jobs_client(cluster.address, cluster.headers)
            if spec.entrypoint_resources:  # cluster mode: a whole node for the job
                from miles_amd.run.cluster import check_cluster

                check_cluster(cluster.address, cluster.headers, gpus=plan.recipe.num_gpus)
            if cancel is not None and cancel.is_set():
                raise KeyboardInterrupt
            client = ready
            job = _submit(spec, client, job_id, cluster.address, run_dir, echo)
        except KeyboardInterrupt:  # before the job is followed: its end is still written
            submitted.set()
            record = _interrupted_before_follow(client, job_id, run_dir)
            if cancel is None or not cancel.is_set():
                raise
            return _outcome(run_dir, record, None, cluster.pids())
        submitted.set()
        pull = None
        if plan.node_run_dir is not None:
            from miles_amd.run.pullback import PullBack

            pull = PullBack(job.client, job.job_id, plan.node_run_dir, job.run_dir)
        try:
            record = job.run(
                PullingWatcher(watcher, pull) if pull else watcher, follow, cluster.head
            )
        except DashboardError as exc:
            raise DriverError(
                f"job {job_id}: the Ray Jobs API failed while following it ({exc}); a stop was "
                f"requested; run dir: {run_dir.root}"
            ) from None
        if isinstance(job.client, JobsClient):  # the final pull has its own bound
            job.client.deadline = None
        pull_error = pull.final() if pull else None
    outcome = _outcome(run_dir, record, job.trip, cluster.pids())
    if pull_error is None:
        return outcome
    return replace(outcome, pullback_error=redact(pull_error), exit_code=EXIT_FAILED)


class PullingWatcher:
    def __init__(self, watcher: FailFastWatcher, pull: PullBack) -> None:
        self.watcher, self.pull = watcher, pull

    def poll(self) -> Trip | None:
        self.pull.try_pull()
        return self.watcher.poll()


def _prepare_run_dir(plan: LaunchPlan, spec: JobSpec, run_dir: RunDir) -> list[Path]:
    """Refuse old evidence, lay out the run dir; what it created, outermost first."""
    stale = [path.name for path in run_dir.evidence if path.exists()]
    if stale:
        raise DriverError(
            f"run dir {run_dir.root} already holds {', '.join(stale)} from an earlier run; "
            "pass a fresh --run-dir (old evidence would mix into this run's)"
        )
    created = [p for p in (run_dir.root, *run_dir.root.parents) if not p.exists()][::-1]
    run_dir.root.mkdir(parents=True, exist_ok=True)
    for key in EVIDENCE_DIR_VARS:  # made here, so a job that writes nothing there is seen
        if key in spec.env_vars and plan.node_run_dir is None:  # not a path on another node
            path = Path(spec.env_vars[key])
            created += [p for p in (path, *path.parents) if not p.exists()][::-1]
            path.mkdir(parents=True, exist_ok=True)
    created.append(run_dir.job_log)
    run_dir.job_log.write_text("")
    created.append(run_dir.plan_json)
    atomic_write_text(
        run_dir.plan_json, json.dumps(plan.to_dict(), indent=2, sort_keys=True) + "\n"
    )
    return created


@contextlib.contextmanager
def _unsubmitted_undone(laid_out: list[Path]) -> Iterator[threading.Event]:
    """On an exception before the yielded event is set (nothing submitted): remove ``laid_out``."""
    submitted = threading.Event()
    try:
        yield submitted
    except BaseException:
        for path in reversed(laid_out) if not submitted.is_set() else ():
            with contextlib.suppress(OSError):  # a directory something else wrote into stays
                if path.is_dir() and not path.is_symlink():
                    path.rmdir()
                else:
                    path.unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class Cluster:
    address: str
    headers: dict[str, str]
    head: RayHead | None = None

    def pids(self) -> tuple[int, ...]:
        return self.head.pids() if self.head is not None else ()


@contextlib.contextmanager
def _cluster(plan: LaunchPlan, run_dir: RunDir, state_file: Path) -> Iterator[Cluster]:
    """The plan's cluster, or a head started here and stopped on every exit path."""
    if plan.ray_address is not None:
        with _bad_input():  # RAY_AUTH_TOKEN_PATH unreadable or empty
            headers = token_headers(plan.ray_auth_token_path)
        yield Cluster(plan.ray_address, headers)
        return
    from miles_amd.run.ray_head import RayHead, write_state

    step = next(s for s in plan.steps if s.name == "ray-start")
    try:
        head = RayHead.start(
            step.argv, env={**os.environ, **plan.head_env()}, log_path=run_dir.ray_head_log
        )
    except Exception as exc:
        raise DriverError(f"could not start the job: {exc}") from exc
    try:
        write_state(state_file, head)
        yield Cluster(head.dashboard_url, head.auth_headers(), head)
    finally:
        head.stop()
        state_file.unlink(missing_ok=True)


def _submit(
    spec: JobSpec, client: Any, job_id: str, address: str, run_dir: RunDir, echo: Echo
) -> RayJob:
    try:
        client.submit_job(
            entrypoint=spec.command(),
            runtime_env=spec.runtime_env(),
            submission_id=job_id,
            entrypoint_resources=dict(spec.entrypoint_resources) or None,
        )
    except Exception as exc:
        with contextlib.suppress(Exception):  # a submission that timed out may have arrived
            client.stop_job(job_id)
        raise DriverError(
            f"could not start the job: {exc}", EXIT_BAD_INPUT, secrets=spec.secret_env_vars.values()
        ) from None
    echo(redact(f"submitted {job_id} to {address}; log: {run_dir.job_log}"))
    return RayJob(client, job_id, run_dir)


def _interrupted_before_follow(client: Any, job_id: str, run_dir: RunDir) -> JobRecord:
    """Stop a job whose submission may have reached Ray, and write its ``job.json``."""
    submitted = False
    if client is not None:
        with contextlib.suppress(Exception):  # not found: the submission never arrived
            client.stop_job(job_id)
            submitted = True
    record = JobRecord(
        job_id=job_id,
        status="STOPPED",
        message="interrupted while submitting; stop requested"
        if submitted
        else "interrupted before the job was submitted; nothing ran",
        stopped_by="interrupt",
        stop_requested_at=time.time(),
    )
    atomic_write_text(run_dir.job_json, record.to_json())
    return record


@contextlib.contextmanager
def _bad_input() -> Iterator[None]:
    try:
        yield
    except DashboardError as exc:
        raise DriverError(str(exc), EXIT_BAD_INPUT) from None


def _outcome(
    run_dir: RunDir, record: JobRecord, trip: Trip | None, head_pids: tuple[int, ...]
) -> RunOutcome:
    passed = record.status == "SUCCEEDED" and not record.stopped_by
    return RunOutcome(
        run_dir=run_dir.root,
        job_id=record.job_id,
        status=record.status,
        stopped_by=record.stopped_by,
        trip=trip,
        failfast_latency_s=record.failfast_latency_s,
        exit_code=EXIT_OK if passed else EXIT_FAILED,
        head_pids=head_pids,
    )
