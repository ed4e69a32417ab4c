"""A Ray head this tool starts, owns and stops: private to its user, stopped by process id.

``docs/ray-head-and-secrets.md``.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from miles_amd.files import atomic_write_text
from miles_amd.run.dashboard import DashboardAuthError, DashboardError, auth_headers, get_json


@dataclass(frozen=True)
class OwnedProcess:
    """One process, identified by pid and create time (a recycled pid is another process)."""

    pid: int
    create_time: float

    def alive(self, sig: int | None = None) -> bool:
        """Whether it runs (not a zombie); ``sig`` is sent to it if so."""
        import psutil

        try:
            proc = psutil.Process(self.pid)
            if proc.create_time() != self.create_time or proc.status() == "zombie":
                return False
            if sig is not None:
                proc.send_signal(sig)
            return True
        except psutil.Error:
            return False

    def signal(self, sig: int) -> None:
        self.alive(sig)


def signal_and_wait(procs: list[OwnedProcess], sig: int | None, timeout_s: float) -> None:
    """Send ``sig`` (if any) to each, then wait up to ``timeout_s`` until none is alive."""
    for proc in procs:
        proc.alive(sig)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(p.alive() for p in procs):
        time.sleep(0.2)


def spawn_logged(
    argv: list[str], env: dict[str, str], log_path: Path
) -> tuple[subprocess.Popen[bytes], OwnedProcess]:
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
    """A spawned root process, its log and every descendant recorded so far."""

    process: subprocess.Popen[bytes]
    owned: OwnedProcess
    log_path: Path
    descendants: set[OwnedProcess] = field(default_factory=set)

    def members(self) -> list[OwnedProcess]:
        return [self.owned, *self.descendants]

    def record_descendants(self) -> None:
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
        self.owned.alive(signal.SIGTERM)
        signal_and_wait(self.members(), None, grace_s)
        signal_and_wait(list(self.descendants), signal.SIGTERM, 5.0)
        signal_and_wait(self.members(), signal.SIGKILL, 5.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)

    def kill(self) -> None:
        """SIGKILL the whole tree at once (a machine dying)."""
        self.record_descendants()
        signal_and_wait(self.members(), signal.SIGKILL, 10.0)

    def pids(self) -> tuple[int, ...]:
        return tuple(p.pid for p in self.members())

    def leftovers(self) -> list[OwnedProcess]:
        return [p for p in self.members() if p.alive()]

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no output)"
        return " | ".join(text[-lines:]) or "(no output)"


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
PORT_ENV_VARS = ("AUTOSCALER_METRIC_PORT", "DASHBOARD_METRIC_PORT")
WORKER_PORTS = ("--min-worker-port", "0", "--max-worker-port", "0")  # kernel-assigned
TEMP_ROOT = Path("/tmp")  # not TMPDIR: AF_UNIX paths must stay under 108 bytes
TEMP_PREFIX = "miles-ray-"
TOKEN_FILE = "auth_token"


class RayHeadError(RuntimeError):
    """The head could not be started; the message ends with its output's tail."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free now (each held open until all are picked)."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def head_environment(
    env: Mapping[str, str], temp_dir: Path, token_path: Path, ports: Mapping[str, int]
) -> dict[str, str]:
    """``env`` plus loopback only, token auth, the metrics ports and TMPDIR."""
    return {
        **{k: v for k, v in env.items() if k != "RAY_AUTH_TOKEN"},
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token_path),
        "TMPDIR": str(temp_dir),
        **{name: str(ports[name]) for name in PORT_ENV_VARS},
    }


def ray_executable() -> str:
    sibling = Path(sys.executable).parent / "ray"
    return str(sibling) if sibling.exists() else (shutil.which("ray") or "ray")


@dataclass(kw_only=True)
class RayHead(ProcessTree):
    """A running head started by :meth:`start`; call :meth:`stop` on every exit path."""

    ports: dict[str, int]  # every port the head listens on except workers' (kernel-assigned)
    temp_dir: Path
    token: str = field(repr=False)

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['--dashboard-port']}"

    @property
    def token_path(self) -> Path:
        return self.temp_dir / TOKEN_FILE

    def auth_headers(self) -> dict[str, str]:
        return auth_headers(self.token)

    @classmethod
    def start(
        cls,
        base_argv: tuple[str, ...],
        *,
        env: Mapping[str, str],
        log_path: Path,
        timeout_s: float = 90.0,
    ) -> RayHead:
        names = (*PORT_OPTIONS, *PORT_ENV_VARS)
        ports = dict(zip(names, free_ports(len(names)), strict=True))
        temp_dir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=TEMP_ROOT))
        token = secrets.token_hex(32)
        atomic_write_text(temp_dir / TOKEN_FILE, token, mode=0o600)
        ray_temp = temp_dir / "ray"  # Ray makes its temp dir 0777; ours around it is 0700
        argv = [ray_executable(), *base_argv[1:], "--block", "--temp-dir", str(ray_temp)]
        argv += [str(x) for option in PORT_OPTIONS for x in (option, ports[option])]
        argv += WORKER_PORTS
        head_env = head_environment(env, temp_dir, temp_dir / TOKEN_FILE, ports)
        try:
            process, owned = spawn_logged(argv, head_env, log_path)
        except BaseException:
            shutil.rmtree(temp_dir, ignore_errors=True)  # the token must not outlive a failure
            raise
        head = cls(process, owned, log_path, ports=ports, temp_dir=temp_dir, token=token)
        try:
            head._wait_ready(timeout_s)
        except BaseException:
            head.stop()
            raise
        head.record_descendants()
        return head

    def _wait_ready(self, timeout_s: float) -> None:
        """Poll ``/api/version`` until it answers; a 401/403 is no slow start."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RayHeadError(
                    f"ray start exited with code {self.process.returncode}: {self.log_tail()}"
                )
            try:
                get_json(self.dashboard_url, "/api/version", self.auth_headers(), timeout_s=2)
                return
            except DashboardAuthError as error:
                raise RayHeadError(
                    f"the Ray dashboard at {self.dashboard_url} refused this tool's own "
                    f"token: HTTP {error.status}; the head did not load "
                    f"{self.token_path}: {self.log_tail()}"
                ) from None
            except DashboardError:
                pass
            time.sleep(0.5)
        raise RayHeadError(f"Ray dashboard not ready after {timeout_s:.0f} s: {self.log_tail()}")

    def stop(self, grace_s: float = 15.0) -> None:
        super().stop(grace_s)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def write_state(state_file: Path, head: RayHead) -> None:
    """What :func:`clear_leftovers` needs; no token."""
    state = {
        "pid": head.owned.pid,
        "create_time": head.owned.create_time,
        "dashboard_url": head.dashboard_url,
        "temp_dir": str(head.temp_dir),
        "descendants": [[p.pid, p.create_time] for p in head.descendants],
    }
    atomic_write_text(state_file, json.dumps(state), mode=0o600)


def clear_leftovers(state_file: Path) -> list[int]:
    """Stop the processes an earlier run recorded (pid and create time); the pids found alive."""
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
    signal_and_wait(alive, signal.SIGTERM, 15.0)
    signal_and_wait(alive, signal.SIGKILL, 5.0)
    temp_dir = Path(str(state.get("temp_dir", "")))
    if temp_dir.parent == TEMP_ROOT and temp_dir.name.startswith(TEMP_PREFIX):
        shutil.rmtree(temp_dir, ignore_errors=True)
    state_file.unlink(missing_ok=True)
    return [p.pid for p in alive]
