"""Run dirs are untrusted: only regular files inside them are read, each within its cap.

Every special file is real (FIFOs, sockets, device nodes made with ``mknod`` when the test
runs as root, sparse files past a cap); nothing is mocked. A FIFO must never hang a reader,
so every test here has a timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from miles_amd.evidence.load import REFUSED, load_run
from miles_amd.files import (
    ENV_JSON,
    EVENT_FILE,
    JOB_JSON,
    JOB_LOG,
    RECORD_FILE,
    RefusedFile,
    read_regular,
)
from tests.cli_runs import CliRun, run_cli
from tests.constants import EXAMPLE

pytestmark = pytest.mark.timeout(60)

SECRET = "s3cr3t-outside-the-run-dir"


def example_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(EXAMPLE, run_dir, ignore=shutil.ignore_patterns("report"))
    (run_dir / "env.json").write_text('{"gpu_arch": "gfx950"}')
    return run_dir


def event_file(run_dir: Path) -> Path:
    """The trainer's event file (the others are miles' header-only files of other processes)."""
    return max((run_dir / "tensorboard").rglob("*tfevents*"), key=lambda p: p.stat().st_size)


def record_file(run_dir: Path) -> Path:
    """The trainer's CI record (miles' driver leaves a 0-byte one beside it)."""
    return max((run_dir / "ci_history").glob("*.jsonl"), key=lambda p: p.stat().st_size)


# Each entry: where an untrusted file goes, as a function of the run dir.
PLACES: dict[str, Callable[[Path], Path]] = {
    "job.log": lambda run: run / "job.log",
    "job.json": lambda run: run / "job.json",
    "env.json": lambda run: run / "env.json",
    "event file": event_file,
    "record file": record_file,
}


def replace_with(path: Path, make: Callable[[Path], None]) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    make(path)


def cli(*args: str) -> CliRun:
    return run_cli(*args)


def assert_refused(run_dir: Path, path: Path, reason: str) -> None:
    evidence = load_run(run_dir)
    refused = [p for p in evidence.problems if p.detail.startswith(REFUSED)]
    assert [p.path for p in refused] == [str(path)], evidence.problems
    assert reason in refused[0].detail
    assert evidence.problems[0].source == "run_dir"
    summary = evidence.problems[0].detail
    assert summary.startswith(f"not read: {path.relative_to(run_dir)} refused as untrusted")
    assert evidence.series == {} and evidence.job is None and evidence.sentinels == ()


LIMITS = {"job.log": JOB_LOG, "job.json": JOB_JSON, "env.json": ENV_JSON}
LIMITS |= {"event file": EVENT_FILE, "record file": RECORD_FILE}


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("attack", ["a FIFO", "a link out", "over its cap"])
def test_an_untrusted_file_anywhere_is_refused_naming_it(
    tmp_path: Path, place: str, attack: str
) -> None:
    """Refused without blocking on a FIFO, without quoting a link's target, naming a cap."""
    run_dir = example_run(tmp_path)
    path = PLACES[place](run_dir)
    limit = LIMITS[place]
    if attack == "a FIFO":
        replace_with(path, os.mkfifo)
        reason = "is a FIFO (named pipe), not a regular file"
    elif attack == "a link out":
        outside = tmp_path / f"{SECRET}.txt"
        outside.write_bytes(path.read_bytes())  # a well-formed file: only where it is is wrong
        replace_with(path, lambda p: p.symlink_to(outside))
        reason = "symbolic link to a path outside the run directory"
    else:
        with open(path, "ab") as handle:
            handle.truncate(limit.cap + 1)  # sparse: costs no disk
        reason = f"over the {limit.kind} cap of {limit.cap:,} bytes"
    assert_refused(run_dir, path, reason)
    assert SECRET not in repr(load_run(run_dir))


def test_a_socket_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = example_run(tmp_path)
    monkeypatch.chdir(run_dir)  # a short relative name: AF_UNIX paths are limited to 107 bytes
    (run_dir / "job.log").unlink()
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("job.log")
        assert_refused(run_dir, run_dir / "job.log", "is a socket")


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device needs root")
def test_a_device_is_refused_not_read_without_end(tmp_path: Path) -> None:
    run_dir = example_run(tmp_path)
    zero = stat.S_IFCHR | 0o444
    replace_with(run_dir / "job.log", lambda p: os.mknod(p, zero, os.makedev(1, 5)))
    assert_refused(run_dir, run_dir / "job.log", "is a character device")


def test_links_inside_dangling_or_to_directories_are_refused(tmp_path: Path) -> None:
    run_dir = example_run(tmp_path)
    (run_dir / "logs").mkdir()
    (run_dir / "job.log").rename(run_dir / "logs" / "job.log")
    (run_dir / "job.log").symlink_to(Path("logs") / "job.log")
    assert_refused(run_dir, run_dir / "job.log", "symbolic link to a path inside the run")
    (run_dir / "job.log").unlink()
    replace_with(run_dir / "env.json", lambda p: p.symlink_to(tmp_path / "nowhere.json"))
    assert_refused(run_dir, run_dir / "env.json", "symbolic link")  # refused, not absent
    (run_dir / "env.json").unlink()
    moved = tmp_path / f"{SECRET}-tb"
    (run_dir / "tensorboard").rename(moved)
    (run_dir / "tensorboard").symlink_to(moved)
    assert_refused(run_dir, run_dir / "tensorboard", "outside the run directory")
    (run_dir / "tensorboard").unlink()
    (run_dir / "tensorboard").mkdir()  # a link below tensorboard/, which would be walked
    (run_dir / "tensorboard" / "trainer").symlink_to(moved)
    assert_refused(run_dir, run_dir / "tensorboard" / "trainer", "outside the run directory")


def test_a_file_at_its_cap_is_read(tmp_path: Path) -> None:
    path = tmp_path / "env.json"
    path.write_bytes(b"{}".ljust(ENV_JSON.cap))
    assert read_regular(path, ENV_JSON) == b"{}".ljust(ENV_JSON.cap)
    path.write_bytes(b"{}".ljust(ENV_JSON.cap + 1))
    with pytest.raises(RefusedFile, match=r"env\.json"):
        read_regular(path, ENV_JSON)


def test_a_run_dir_named_through_a_link_is_read(tmp_path: Path) -> None:
    run_dir = example_run(tmp_path)
    latest = tmp_path / "latest"
    latest.symlink_to(run_dir)
    evidence = load_run(latest)
    assert evidence.problems == () and evidence.series


def test_the_gate_exits_2_naming_the_refused_file_and_quotes_nothing_outside(
    tmp_path: Path,
) -> None:
    run_dir = example_run(tmp_path)
    outside = tmp_path / f"{SECRET}.log"
    outside.write_text("CI check failed: " + SECRET + "\n")  # would be quoted as a sentinel
    (run_dir / "job.log").unlink()
    (run_dir / "job.log").symlink_to(outside)
    replace_with(run_dir / "env.json", os.mkfifo)
    result = cli("gate", "--run-dir", str(run_dir), "--baseline", "patched")
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"miles-amd: error: --run-dir {run_dir}: ")
    assert "refused as untrusted input" in line
    report_dir = run_dir / "report"
    report = json.loads((report_dir / "report.json").read_text())
    assert report["verdict"] == "error" and report["exit_code"] == 2
    named = {problem["path"] for problem in report["evidence"]["problems"]}
    assert {str(run_dir / "job.log"), str(run_dir / "env.json")} <= named
    for written in [*report_dir.iterdir()]:
        if written.suffix in (".json", ".md"):
            assert SECRET not in written.read_text()
    assert SECRET not in result.stdout + result.stderr


def test_record_refuses_a_run_dir_with_a_fifo(tmp_path: Path) -> None:
    run_dir = example_run(tmp_path)
    replace_with(run_dir / "env.json", os.mkfifo)
    out = tmp_path / "b.json"
    result = cli(
        "baseline",
        "record",
        "--run-dir",
        str(run_dir),
        "--variant",
        "patched",
        "--out",
        str(out),
        "--allow-no-preflight",
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "env.json refused as untrusted input" in result.stderr
    assert not out.exists()


def test_the_watcher_reads_the_log_it_times_a_trip_from_as_untrusted_input(
    tmp_path: Path,
) -> None:
    from miles_amd.run.watcher import read_lines

    run_dir = example_run(tmp_path)
    log = run_dir / "job.log"
    assert read_lines(log) == log.read_text().split("\n")[:-1]
    replace_with(log, os.mkfifo)
    assert read_lines(log) == []  # not a hang
    outside = tmp_path / "outside.log"
    outside.write_text(SECRET + "\n")
    replace_with(log, lambda p: p.symlink_to(outside))
    assert read_lines(log) == []
