"""A Ray head this tool starts, owns, and stops: by process id, never by name.

Decides how a local head is started and stopped; it does not submit jobs (``driver``).

- Started as ``ray start --head ... --block`` in a new session, with every fixed port Ray
  would otherwise use replaced by a free one and a private ``--temp-dir``, so it never
  collides with another cluster on the node (nor with a test session's head).
- ``ray start --block`` registers a SIGTERM handler that shuts down the processes it
  spawned; :meth:`RayHead.stop` sends it SIGTERM, then terminates (and after a grace period
  kills) every descendant it recorded, matched by pid *and* create time so a recycled pid
  is never touched. ``ray stop`` is never used: it stops every Ray process of the user.
- A state file records the head so a later run can clear this tool's own leftovers
  (:func:`clear_leftovers`), again only by recorded pid and create time.

Measured on a 2-core CPU machine (Ray 2.60): start to dashboard-ready about 5 s, stop
about 2-6 s; by default Ray binds a non-loopback address, hence ``--node-ip-address``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

PORT_OPTIONS = (
    "--port",
    "--dashboard-port",
    "--ray-client-server-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--metrics-export-port",
    "--runtime-env-agent-port",
    "--node-manager-port",
    "--object-manager-port",
)


class RayHeadError(RuntimeError):
    """The head could not be started; the message carries the tail of its output."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ray_executable() -> str:
    """The ``ray`` next to this interpreter first (the venv's), then the one on PATH."""
    sibling = Path(sys.executable).parent / "ray"
    return str(sibling) if sibling.exists() else (shutil.which("ray") or "ray")


@dataclass(frozen=True)
class OwnedProcess:
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


@dataclass
class RayHead:
    """A running head started by :meth:`start`; call :meth:`stop` on every exit path."""

    process: subprocess.Popen[bytes]
    owned: OwnedProcess
    dashboard_url: str
    gcs_address: str
    temp_dir: Path
    log_path: Path
    descendants: set[OwnedProcess] = field(default_factory=set)

    @classmethod
    def start(
        cls,
        base_argv: tuple[str, ...],
        *,
        env: dict[str, str],
        log_path: Path,
        timeout_s: float = 90.0,
    ) -> RayHead:
        import psutil

        ports = {option: free_port() for option in PORT_OPTIONS}
        temp_dir = Path(tempfile.mkdtemp(prefix="miles_amd_ray_"))
        argv = [ray_executable(), *base_argv[1:], "--block", "--temp-dir", str(temp_dir)]
        for option, port in ports.items():
            argv += [option, str(port)]
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
        owned = OwnedProcess(process.pid, psutil.Process(process.pid).create_time())
        head = cls(
            process=process,
            owned=owned,
            dashboard_url=f"http://127.0.0.1:{ports['--dashboard-port']}",
            gcs_address=f"127.0.0.1:{ports['--port']}",
            temp_dir=temp_dir,
            log_path=log_path,
        )
        try:
            head._wait_ready(timeout_s)
        except BaseException:
            head.stop()
            raise
        head.record_descendants()
        return head

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RayHeadError(
                    f"ray start exited with code {self.process.returncode}: {self._log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.dashboard_url}/api/version", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RayHeadError(f"Ray dashboard not ready after {timeout_s:.0f} s: {self._log_tail()}")

    def _log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no output)"
        return " | ".join(text[-lines:]) or "(no output)"

    def record_descendants(self) -> None:
        """Remember every process under the head now (workers, job entrypoints included)."""
        import psutil

        try:
            children = psutil.Process(self.owned.pid).children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            try:
                self.descendants.add(OwnedProcess(child.pid, child.create_time()))
            except psutil.Error:
                continue

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the head, then terminate/kill whatever it spawned that is still alive."""
        self.record_descendants()
        self.owned.signal(signal.SIGTERM)
        _wait_gone([self.owned, *self.descendants], grace_s)
        for proc in self.descendants:
            proc.signal(signal.SIGTERM)
        _wait_gone(list(self.descendants), 5.0)
        for proc in (self.owned, *self.descendants):
            proc.signal(signal.SIGKILL)
        _wait_gone([self.owned, *self.descendants], 5.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def pids(self) -> tuple[int, ...]:
        """The head's pid and every descendant's recorded so far."""
        return tuple(p.pid for p in (self.owned, *self.descendants))

    def leftovers(self) -> list[OwnedProcess]:
        return [p for p in (self.owned, *self.descendants) if p.alive()]

    def state(self) -> dict[str, object]:
        return {
            "pid": self.owned.pid,
            "create_time": self.owned.create_time,
            "dashboard_url": self.dashboard_url,
            "temp_dir": str(self.temp_dir),
            "descendants": [[p.pid, p.create_time] for p in self.descendants],
        }


def _wait_gone(procs: list[OwnedProcess], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(p.alive() for p in procs):
        time.sleep(0.2)


def write_state(state_file: Path, head: RayHead) -> None:
    state_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(head.state()))
    os.replace(tmp, state_file)


def clear_leftovers(state_file: Path) -> list[int]:
    """Stop a head (and its processes) that an earlier run of this tool recorded.

    Only processes whose pid *and* create time match the record are signalled. Returns the
    pids that were still alive and got stopped; removes the state file.
    """
    if not state_file.exists():
        return []
    try:
        state = json.loads(state_file.read_text())
        procs = [OwnedProcess(int(state["pid"]), float(state["create_time"]))]
        procs += [OwnedProcess(int(p), float(t)) for p, t in state.get("descendants", [])]
    except (OSError, ValueError, KeyError, TypeError):
        state_file.unlink(missing_ok=True)
        return []
    alive = [p for p in procs if p.alive()]
    for proc in alive:
        proc.signal(signal.SIGTERM)
    _wait_gone(alive, 15.0)
    for proc in alive:
        proc.signal(signal.SIGKILL)
    _wait_gone(alive, 5.0)
    temp_dir = str(state.get("temp_dir", ""))
    if Path(temp_dir).name.startswith("miles_amd_ray_"):
        shutil.rmtree(temp_dir, ignore_errors=True)
    state_file.unlink(missing_ok=True)
    return [p.pid for p in alive]
