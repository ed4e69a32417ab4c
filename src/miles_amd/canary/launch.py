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

Only the process groups of the ranks it started are signalled (``os.killpg`` of each
child's own group, SIGKILL).
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
import time
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


def run_ranks(
    spec: dict[str, Any], timeout_s: float, pythonpath: str | None = None
) -> list[dict[str, Any]]:
    """Every rank's result (``canary.worker``), in rank order; HarnessError (module doc).
    ``pythonpath`` (``variants.aiter_pythonpath``; default this process's) follows the source."""
    world = spec["world_size"]
    after = os.environ.get("PYTHONPATH", "") if pythonpath is None else pythonpath
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(SRC_DIR), after) if p),
    }
    with tempfile.TemporaryDirectory(prefix="miles-amd-canary-") as name:
        tmp = Path(name)
        spec_path = tmp / "spec.json"
        spec_path.write_text(json.dumps({**spec, "timeout_s": timeout_s}), encoding="utf-8")
        procs: list[subprocess.Popen[bytes]] = []
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
        results = []
        for rank in range(world):
            data = json.loads(result_path(spec_path, rank).read_text(encoding="utf-8"))
            if "error" in data:
                raise HarnessError(f"rank {rank} failed: {data['error']}")
            results.append(data)
        return results


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
