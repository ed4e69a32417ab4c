"""Starting the canary's ranks as real processes and bounding them in time.

Decides how the ranks run: one ``python -m miles_amd.canary.worker SPEC RANK`` subprocess per
rank (the same interpreter, ``OMP_NUM_THREADS=1``, this package's source first on
``PYTHONPATH``), each in its own session so that its process group is its own; the spec and
the results live in a temp dir removed afterwards. No fixed port: rank 0's store takes a
free one (``canary.worker``). The bound:

- a rank that exits non-zero (its reducer raised, a communicator was disabled) ends the run
  after ``GRACE_S`` more seconds for the others to write theirs: :class:`HarnessError`
  naming the rank that failed first (the ranks stamp their errors; the others then fail on
  the broken collective) and its error;
- ranks still running ``timeout_s`` after the start (a reducer that hangs, a collective that
  does not complete) are killed: :class:`HarnessError` saying which ranks hung.

- a rank that exits 0 without a readable result file: :class:`HarnessError` naming it.

Only the process groups of the ranks it started are signalled (``os.killpg`` of each
child's own group, SIGKILL), also when this process gets SIGTERM or SIGHUP while they run
(:func:`_signals_raise`: the signal ends the run as a :class:`HarnessError`, the ranks are
stopped and the temp dir removed).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from miles_amd.canary.worker import result_path

GRACE_S = 3.0
POLL_S = 0.05
SRC_DIR = Path(__file__).resolve().parents[2]


class HarnessError(RuntimeError):
    """The ranks could not give a result; ``str()`` is one line saying why."""


def _kill(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()


def _error(tmp: Path, spec_path: Path, rank: int) -> tuple[float, str]:
    """When rank ``rank`` failed (epoch seconds; infinity if unknown) and its error line."""
    try:
        data = json.loads(result_path(spec_path, rank).read_text(encoding="utf-8"))
        if "error" in data:
            return float(data.get("at", math.inf)), str(data["error"])
    except (OSError, ValueError):
        pass
    log = tmp / f"rank{rank}.log"
    lines = (
        log.read_text(encoding="utf-8", errors="replace").strip().splitlines()
        if log.exists()
        else []
    )
    return math.inf, lines[-1] if lines else "no output"


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`HarnessError` while the ranks run (main thread only),
    so the caller's ``finally`` stops them; the previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        raise HarnessError(f"stopped by {signal.Signals(signum).name}; the ranks were stopped")

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _result(spec_path: Path, rank: int) -> dict[str, Any]:
    path = result_path(spec_path, rank)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise HarnessError(
            f"rank {rank} exited 0 without a readable result file {path.name} ({exc})"
        ) from None
    if not isinstance(data, dict):
        raise HarnessError(f"rank {rank}'s result file {path.name} is not a JSON object")
    if "error" in data:
        raise HarnessError(f"rank {rank} failed: {data['error']}")
    return data


def run_ranks(spec: dict[str, Any], timeout_s: float) -> list[dict[str, Any]]:
    """Every rank's result (``canary.worker``), in rank order; HarnessError (module doc)."""
    world = spec["world_size"]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(SRC_DIR), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    with tempfile.TemporaryDirectory(prefix="miles-amd-canary-") as name:
        tmp = Path(name)
        spec_path = tmp / "spec.json"
        spec_path.write_text(json.dumps({**spec, "timeout_s": timeout_s}), encoding="utf-8")
        procs: list[subprocess.Popen[bytes]] = []
        with _signals_raise():
            _start_and_wait(procs, tmp, spec_path, world, env, timeout_s)
        return [_result(spec_path, rank) for rank in range(world)]


def _start_and_wait(
    procs: list[subprocess.Popen[bytes]],
    tmp: Path,
    spec_path: Path,
    world: int,
    env: dict[str, str],
    timeout_s: float,
) -> None:
    try:
        for rank in range(world):
            with open(tmp / f"rank{rank}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "miles_amd.canary.worker",
                            str(spec_path),
                            str(rank),
                        ],
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                    )
                )
        _wait(procs, tmp, spec_path, timeout_s)
    finally:
        _kill(procs)


def _wait(
    procs: list[subprocess.Popen[bytes]], tmp: Path, spec_path: Path, timeout_s: float
) -> None:
    started = time.monotonic()
    failed_at: float | None = None
    while True:
        codes = [proc.poll() for proc in procs]
        now = time.monotonic()
        failed = [rank for rank, code in enumerate(codes) if code not in (None, 0)]
        if all(code is not None for code in codes) and not failed:
            return
        if failed:
            failed_at = failed_at if failed_at is not None else now
            if all(code is not None for code in codes) or now - failed_at > GRACE_S:
                errors = {rank: _error(tmp, spec_path, rank) for rank in failed}
                rank = min(failed, key=lambda r: (errors[r][0], r))
                raise HarnessError(f"rank {rank} failed (exit {codes[rank]}): {errors[rank][1]}")
        if now - started > timeout_s:
            hung = [rank for rank, code in enumerate(codes) if code is None]
            raise HarnessError(
                f"ranks {hung} still running after {timeout_s:.0f} s: a reducer or collective "
                "hangs (or the plan needs more time: --timeout)"
            )
        time.sleep(POLL_S)
