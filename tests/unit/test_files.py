"""miles_amd.files on a real file system: link-safe set writes, whole or nothing, and
cleanup of a killed writer's temp files; the two bugs of the second writer it replaced
(``compare`` followed a ``report`` link out of the run dir; a FIFO plan.json hung
``gate --history``) through the CLI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miles_amd.cli.main import app
from miles_amd.files import UnsafeDir, atomic_write_text, staged_files, write_files
from tests.cli_runs import run_cli
from tests.constants import EXAMPLE


def example(tmp_path: Path, name: str = "run") -> Path:
    run_dir = tmp_path / name
    shutil.copytree(EXAMPLE, run_dir, ignore=shutil.ignore_patterns("report"))
    return run_dir


def test_a_set_is_written_whole_and_leaves_no_temp_file(tmp_path: Path) -> None:
    write_files(tmp_path / "out", {"a.json": b"1", "b.md": b"2"})
    write_files(tmp_path / "out", {"a.json": b"3", "b.md": b"4"})
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["a.json", "b.md"]
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


def test_a_failed_write_keeps_the_previous_set(tmp_path: Path) -> None:
    """A file-size limit (EFBIG, as a full disk is ENOSPC) hits the second file of the set:
    the first keeps its old bytes, no temp file stays."""
    out = tmp_path / "out"
    write_files(out, {"report.json": b"old", "metrics.png": b"old"})
    code = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from miles_amd.files import write_files\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "try:\n"
        "    write_files(Path(sys.argv[1]), {'report.json': b'new', 'metrics.png': b'x' * 9000})\n"
        "except OSError as exc:\n"
        "    print(exc.errno)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(out)], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "27"  # EFBIG
    assert (out / "report.json").read_bytes() == b"old"
    assert sorted(p.name for p in out.iterdir()) == ["metrics.png", "report.json"]


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
    without a pid in its name (no proof its writer is gone), one whose lock is held (a writer
    on another host sharing the file system), and other names."""
    import fcntl

    out = tmp_path / "out"
    out.mkdir()
    pid = dead_pid()
    (out / f".report.json.{pid}-0a1b2c3d4e5f.tmp").write_bytes(b"half")
    (out / f".job.json.{pid}-abcdef.tmp").write_bytes(b"half")
    (out / ".job.json.abcdef.tmp").write_bytes(b"no pid: kept")
    (out / ".unrelated.tmp").write_bytes(b"kept")
    held = out / f".report.json.{pid}-0a1b2c.tmp"
    held.write_bytes(b"in flight")
    with held.open("rb") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        write_files(out, {"report.json": b"{}"})
        atomic_write_text(out / "job.json", "{}")
    names = sorted(p.name for p in out.iterdir())
    assert names == [".job.json.abcdef.tmp", held.name, ".unrelated.tmp", "job.json", "report.json"]


def test_writers_of_one_dir_at_once_keep_each_others_temp_files(tmp_path: Path) -> None:
    """A set staged (written to temps, not yet committed) while another writer writes
    the same names: its temps are a live writer's, not a killed one's; both sets go in whole,
    the last committed wins."""
    out = tmp_path / "out"
    with staged_files(out, {"report.json": b"first", "report.md": b"first"}) as commit_first:
        write_files(out, {"report.json": b"second", "report.md": b"second"})
        commit_first()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {
        "report.json": b"first",
        "report.md": b"first",
    }


def test_compare_refuses_a_report_link_in_run_b(tmp_path: Path) -> None:
    a, b = example(tmp_path, "a"), example(tmp_path, "b")
    outside = tmp_path / "outside"
    outside.mkdir()
    (b / "report").symlink_to(outside)
    result = CliRunner().invoke(app, ["compare", "--run-dir", str(a), "--run-dir", str(b)])
    assert result.exit_code == 2, result.output
    assert "symbolic link" in result.output
    assert list(outside.iterdir()) == []


@pytest.mark.timeout(60)
def test_a_fifo_plan_json_is_refused_not_waited_on(tmp_path: Path) -> None:
    run_dir = example(tmp_path)
    os.mkfifo(run_dir / "plan.json")
    args = ["--run-dir", str(run_dir), "--baseline", "patched", "--history", str(tmp_path / "h")]
    done = run_cli("gate", *args)
    assert done.returncode == 2, done.stderr
    assert "plan.json" in done.stdout + done.stderr


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
