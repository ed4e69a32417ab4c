"""miles_amd.files on a real file system: link-safe whole writes, a killed writer's temp files
cleaned, and a run dir's files read as untrusted input (only regular files inside it, each within
its cap). Every special file is real (FIFOs, sockets, devices when root); a FIFO must never hang
a reader, so every test has a timeout. A write cut by a full disk: test_whole_writes.py.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miles_amd.cli.main import app
from miles_amd.evidence.load import REFUSED, load_run
from miles_amd.evidence.types import RunEvidence
from miles_amd.files import (
    ENV_JSON,
    EVENT_FILE,
    JOB_JSON,
    JOB_LOG,
    RECORD_FILE,
    RefusedFile,
    UnsafeDir,
    atomic_write_text,
    read_regular,
    write_files,
)
from tests.cli_runs import run_cli
from tests.constants import EXAMPLE

pytestmark = pytest.mark.timeout(60)

SECRET = "s3cr3t-outside-the-run-dir"


def example(tmp_path: Path, name: str = "run") -> Path:
    run_dir = tmp_path / name
    shutil.copytree(EXAMPLE, run_dir, ignore=shutil.ignore_patterns("report"))
    return run_dir


def example_run(tmp_path: Path) -> Path:
    run_dir = example(tmp_path)
    (run_dir / "env.json").write_text('{"gpu_arch": "gfx950"}')
    return run_dir


def test_a_set_is_written_whole_and_leaves_no_temp_file(tmp_path: Path) -> None:
    write_files(tmp_path / "out", {"a.json": b"1", "b.md": b"2"})
    write_files(tmp_path / "out", {"a.json": b"3", "b.md": b"4"})
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["a.json", "b.md"]
    assert (tmp_path / "out" / "a.json").read_bytes() == b"3"
    with pytest.raises(FileExistsError):
        atomic_write_text(tmp_path / "out" / "a.json", "4", replace=False)
    atomic_write_text(tmp_path / "out" / "c.json", "5", replace=False)
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["a.json", "b.md", "c.json"]
    assert (tmp_path / "out" / "a.json").read_bytes() == b"3"


def test_a_link_anywhere_below_the_root_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "run"
    root.mkdir()
    (root / "report").symlink_to(outside)
    with pytest.raises(UnsafeDir, match="symbolic link"):
        write_files(root / "report" / "compare", {"x.md": b"x"}, root=root)
    assert list(outside.iterdir()) == []


def dead_pid() -> int:
    """The pid of a process that has ended (and been waited for)."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(done.stdout)


def test_only_a_dead_writers_temp_files_are_removed_by_the_next_write(tmp_path: Path) -> None:
    """Removed: a temp whose writer's pid has ended and whose lock no one holds. Kept: one
    without a pid in its name, one of a running pid, one whose lock is held (a writer on another
    host sharing the file system), and other names."""
    import fcntl

    out = tmp_path / "out"
    out.mkdir()
    pid = dead_pid()
    (out / f".report.json.{pid}-0a1b2c3d4e5f.tmp").write_bytes(b"half")
    (out / f".job.json.{pid}-abcdef.tmp").write_bytes(b"half")
    (out / ".job.json.abcdef.tmp").write_bytes(b"no pid: kept")
    (out / ".unrelated.tmp").write_bytes(b"kept")
    live = out / f".report.json.{os.getpid()}-abc.tmp"  # a running writer's
    live.write_bytes(b"staged")
    held = out / f".report.json.{pid}-0a1b2c.tmp"
    held.write_bytes(b"in flight")
    with held.open("rb") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        write_files(out, {"report.json": b"{}"})
        atomic_write_text(out / "job.json", "{}")
    names = sorted(p.name for p in out.iterdir())
    kept = [".job.json.abcdef.tmp", held.name, live.name, ".unrelated.tmp"]
    assert names == sorted([*kept, "job.json", "report.json"])


def test_a_report_link_in_the_run_dir_is_refused_and_nothing_written_outside(
    tmp_path: Path,
) -> None:
    run_dir = example(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (run_dir / "report").symlink_to(outside)
    args = ["gate", "--no-history", "--baseline", "patched", "--run-dir", str(run_dir)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert "symbolic link" in line and "Traceback" not in result.output
    assert list(outside.iterdir()) == []


def test_a_file_system_without_flock_still_takes_the_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No such file system here (tmpfs and ext4 have flock), so flock is made to answer as an
    NFS mount without a lock manager does (ENOLCK): the set is still written whole."""
    import errno
    import fcntl

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    write_files(tmp_path / "out", {"report.json": b"{}", "report.md": b"#"})
    atomic_write_text(tmp_path / "out" / "job.json", "{}")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "job.json",
        "report.json",
        "report.md",
    ]


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
    "plan.json": lambda run: run / "plan.json",
    "event file": event_file,
    "record file": record_file,
}


def replace_with(path: Path, make: Callable[[Path], None]) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    make(path)


def assert_refused(run_dir: Path, path: Path, reason: str) -> RunEvidence:
    evidence = load_run(run_dir)
    refused = [p for p in evidence.problems if p.detail.startswith(REFUSED)]
    assert [p.path for p in refused] == [str(path)], evidence.problems
    assert reason in refused[0].detail
    assert evidence.problems[0].source == "run_dir"
    summary = evidence.problems[0].detail
    assert summary.startswith(f"not read: {path.relative_to(run_dir)} refused as untrusted")
    assert evidence.series == {} and evidence.job is None and evidence.sentinels == ()
    return evidence


LIMITS = {"job.log": JOB_LOG, "job.json": JOB_JSON, "env.json": ENV_JSON}
LIMITS |= {"event file": EVENT_FILE, "record file": RECORD_FILE}


@pytest.mark.parametrize(
    ("place", "attack"),
    [
        ("job.log", "a FIFO"),
        ("record file", "a FIFO"),
        ("plan.json", "a FIFO"),  # once hung gate --history
        ("event file", "a link out"),
        ("env.json", "a link out"),
        ("job.json", "over its cap"),
        ("event file", "over its cap"),
        ("record file", "over its cap"),
        ("job.log", "over its cap"),
    ],
)
def test_an_untrusted_file_anywhere_is_refused_naming_it(
    tmp_path: Path, place: str, attack: str
) -> None:
    """Refused without blocking on a FIFO, without quoting a link's target, naming a cap."""
    run_dir = example_run(tmp_path)
    path = PLACES[place](run_dir)
    if attack == "a FIFO":
        replace_with(path, os.mkfifo)
        reason = "is a FIFO (named pipe), not a regular file"
    elif attack == "a link out":
        outside = tmp_path / f"{SECRET}.txt"
        outside.write_bytes(path.read_bytes())  # a well-formed file: only where it is is wrong
        replace_with(path, lambda p: p.symlink_to(outside))
        reason = "symbolic link to a path outside the run directory"
    else:
        limit = LIMITS[place]
        with open(path, "ab") as handle:
            handle.truncate(limit.cap + 1)  # sparse: costs no disk
        reason = f"over the {limit.kind} cap of {limit.cap:,} bytes"
    assert SECRET not in repr(assert_refused(run_dir, path, reason))


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
    result = run_cli("gate", "--run-dir", str(run_dir), "--baseline", "patched")
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
    args = ["--run-dir", str(run_dir), "--variant", "patched", "--out", str(out)]
    result = CliRunner().invoke(app, ["baseline", "record", *args, "--allow-no-preflight"])
    assert result.exit_code == 2, result.output
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
