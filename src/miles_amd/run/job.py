"""A submitted Ray job, followed to its end: its log streamed, stopped if lost, its end written.

Decides when a running job is stopped (the overall timeout, or the fail-fast watcher's trip,
polled with an interval's pause after each poll: ``fail-fast``, or ``look`` when a rule
crossed its boundary at a look; Ctrl-C too) and what is written when it ends: ``job.log`` rewritten
from ``get_job_logs`` (the authoritative full log; ``tail_job_logs`` ends about 5 s after the
job, measured with Ray 2.60) and ``job.json`` (:class:`~miles_amd.records.job.JobRecord`), each
atomically. It does not submit the job or start a head (``miles_amd.run.driver``), and it
does not judge the run (the watcher's rules are the gate's).

``stop_job`` reaches STOPPED in about 1.3 s on CPU (Ray 2.60); a job that is still running
when :meth:`RayJob.run` leaves, on any path, is stopped. The stop is requested once and
waited for at most :data:`STOP_WAIT_S`; the Jobs API client's deadline
(``miles_amd.run.dashboard.JobsClient``) is set when following starts to ``timeout`` plus
:data:`STOP_GRACE_S`, so a dashboard that hangs or a status that never ends cannot hold the
command past that (each request is bounded by its own timeout too;
``tests/rehearsal/test_ray_endpoint.py``). A failed request ends following with its
``DashboardError``. The job's message is stored redacted
(``miles_amd.redact``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from miles_amd.files import atomic_write_text
from miles_amd.records.job import JobRecord, LookStop
from miles_amd.redact import redact
from miles_amd.run.dashboard import JobsClient
from miles_amd.run.watcher import Trip
from miles_amd.run_dir import RunDir

if TYPE_CHECKING:
    from miles_amd.run.ray_head import RayHead


class Watcher(Protocol):
    """What following a job needs of the fail-fast watcher (local or pulling from a node)."""

    def poll(self) -> Trip | None: ...


TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
STOP_WAIT_S = 30.0  # after the stop request, for the job to reach a terminal state
STOP_GRACE_S = 60.0  # beyond --timeout: the stop's wait, the final log and job.json
Echo = Callable[[str], None]


@dataclass(frozen=True)
class Follow:
    """How a running job is followed: overall timeout, watcher interval, where to report."""

    timeout_s: float
    interval_s: float
    echo: Echo
    cancel: threading.Event | None = None  # set by another thread: stop as on Ctrl-C
    stop_wait_s: float = STOP_WAIT_S  # after the stop request, for a terminal state


class RayJob:
    """A submitted job: followed to its end, stopped if lost, its end state written."""

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
        pump = LogPump(self.client, self.job_id, self.run_dir.job_log)
        pump.start()
        try:
            self._follow(watcher, follow)
            if head is not None:  # the job's processes, so the head's stop reaches them
                head.record_descendants()
            pump.close()
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
                # the interval is a pause after a poll: a cluster poll's pull is a Ray job
                # of seconds, so polls are never back to back
                next_watch = time.monotonic() + follow.interval_s
            if self.stopped_by:
                self._stop(follow)
                return
            time.sleep(min(0.5, follow.interval_s))

    def _stop(self, follow: Follow) -> None:
        self.stop_requested_at = time.time()
        why = f" ({self.trip.rule})" if self.trip else ""
        follow.echo(f"stopping {self.job_id}: {self.stopped_by}{why}")
        self._stop_and_wait(follow.stop_wait_s)

    def _status(self) -> str:
        return str(self.client.get_job_status(self.job_id).value)

    def _stop_and_wait(self, timeout_s: float = STOP_WAIT_S) -> None:
        """Ask Ray to stop the job (once) and wait up to ``timeout_s`` for its end."""
        self.stop_sent = True
        self.client.stop_job(self.job_id)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._status() not in TERMINAL:
            time.sleep(0.2)

    def _stop_if_running(self) -> None:
        """Stop a job still running (or of unknown state), unless a stop was already sent."""
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
        """The authoritative job.log and job.json, each written atomically; the trip, timed.

        The head fetches a job's log from the agent of the node that ran it: when that node
        is lost, the fetch fails (seen in CI: aiohttp cannot connect to the lost node's
        agent), the streamed ``job.log`` is kept with the failure appended, and the record's
        ``final_log_error`` says why, so the gate cannot pass a run on a partial log.
        """
        log, lost = self._final_log()
        atomic_write_text(self.run_dir.job_log, log)
        info = self.client.get_job_info(self.job_id)
        if self.trip is not None:
            self.trip = self.trip.timed_from(log.splitlines())
        record = JobRecord(
            job_id=self.job_id,
            status=info.status.value,
            message=redact(str(info.message or "")),
            start_time=info.start_time / 1000 if info.start_time else None,
            end_time=info.end_time / 1000 if info.end_time else None,
            driver_exit_code=info.driver_exit_code,
            stopped_by=self.stopped_by,
            stop_requested_at=self.stop_requested_at,
            failfast=self.trip.to_dict() if self.trip else None,
            look=self._look_stop(),
            failfast_latency_s=self._latency(),
            final_log_error=lost or None,
        )
        atomic_write_text(self.run_dir.job_json, record.to_json())
        return record

    def _final_log(self) -> tuple[str, str]:
        """The job's full log from Ray, or the streamed one and why Ray could not give it."""
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

    def _look_stop(self) -> LookStop | None:
        """The look that stopped the job, as job.json records it (``stopped_by: "look"``)."""
        trip = self.trip
        if self.stopped_by != "look" or trip is None or trip.look is None:
            return None
        if trip.alpha_spent is None:
            return None
        return LookStop(trip.look, trip.rule, trip.alpha_spent)

    def _latency(self) -> float | None:
        trip, stopped = self.trip, self.stop_requested_at
        if trip is None or trip.fault_time is None or stopped is None:
            return None
        return round(stopped - trip.fault_time, 3)


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
