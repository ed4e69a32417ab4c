"""A process tree this tool started and owns: spawned in its own session, stopped by pid.

Decides how an owned process (a ``ray start --block``: the driver's Ray head,
``miles_amd.run.ray_head``, and each node of the test cluster, ``tests/support/two_node.py``)
is started, remembered and stopped. It is spawned in a new session with its output in a log
file; every descendant seen is recorded by pid *and* create time, so a recycled pid is not
signalled; stopping is SIGTERM to the root, a grace period, SIGTERM to what is left, then
SIGKILL, each step waiting until the processes are gone. It does not use ``ray stop`` (it stops
every Ray process of the user) or a signal by name. Does not decide what runs in the tree.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class OwnedProcess:
    """One process, identified by pid and create time (a recycled pid is another process)."""

    pid: int
    create_time: float

    def alive(self) -> bool:
        import psutil

        try:
            proc = psutil.Process(self.pid)
            return proc.create_time() == self.create_time and proc.status() != "zombie"
        except psutil.Error:
            return False

    def signal(self, sig: int) -> None:
        import psutil

        try:
            proc = psutil.Process(self.pid)
            if proc.create_time() == self.create_time:
                proc.send_signal(sig)
        except psutil.Error:
            pass


def wait_gone(procs: list[OwnedProcess], timeout_s: float) -> None:
    """Until none of ``procs`` is alive, or ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(p.alive() for p in procs):
        time.sleep(0.2)


def spawn_logged(
    argv: list[str], env: dict[str, str], log_path: Path
) -> tuple[subprocess.Popen[bytes], OwnedProcess]:
    """Start ``argv`` in its own session, output to ``log_path``; the process and its identity."""
    import psutil

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    return process, OwnedProcess(process.pid, psutil.Process(process.pid).create_time())


@dataclass
class ProcessTree:
    """A spawned root process, its log, and every descendant recorded so far."""

    process: subprocess.Popen[bytes]
    owned: OwnedProcess
    log_path: Path
    descendants: set[OwnedProcess] = field(default_factory=set)

    def members(self) -> list[OwnedProcess]:
        return [self.owned, *self.descendants]

    def record_descendants(self) -> None:
        """Remember every process under the root now (workers, job entrypoints included)."""
        import psutil

        try:
            children = psutil.Process(self.owned.pid).children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            with contextlib.suppress(psutil.Error):
                self.descendants.add(OwnedProcess(child.pid, child.create_time()))

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the root, then terminate/kill whatever it spawned that is still alive."""
        self.record_descendants()
        self.owned.signal(signal.SIGTERM)
        wait_gone(self.members(), grace_s)
        for proc in self.descendants:
            proc.signal(signal.SIGTERM)
        wait_gone(list(self.descendants), 5.0)
        for proc in self.members():
            proc.signal(signal.SIGKILL)
        wait_gone(self.members(), 5.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)

    def kill(self) -> None:
        """SIGKILL the root and every process under it at once (a machine dying)."""
        self.record_descendants()
        for proc in self.members():
            proc.signal(signal.SIGKILL)
        wait_gone(self.members(), 10.0)

    def pids(self) -> tuple[int, ...]:
        """The root's pid and every descendant's recorded so far."""
        return tuple(p.pid for p in self.members())

    def leftovers(self) -> list[OwnedProcess]:
        return [p for p in self.members() if p.alive()]

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no output)"
        return " | ".join(text[-lines:]) or "(no output)"
