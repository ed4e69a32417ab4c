"""A report set is written whole or not at all, and a path longer than the OS allows is one line
and exit 2, through the CLI in this process.

A full file system is ``RLIMIT_FSIZE`` (``EFBIG``, as a full disk is ``ENOSPC``) with
``SIGXFSZ`` ignored: the gate either exits 1 with the new set complete, or exits 2 with one line
and the previous set byte for byte (never a FAIL report.json beside an older PASS
metrics.png), and no temp file stays.
"""

from __future__ import annotations

import contextlib
import json
import resource
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli_runs import one_error_line, run_cli
from tests.constants import EXAMPLE

LONG_NAME = "n" * 300  # one name past NAME_MAX (255)


@contextlib.contextmanager
def file_size_limit(limit: int | None) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    if limit is not None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def set_job_status(run_dir: Path, status: str) -> None:
    job = json.loads((run_dir / "job.json").read_text())
    (run_dir / "job.json").write_text(json.dumps({**job, "status": status}))


def report_set(run_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((run_dir / "report").iterdir())}


@pytest.fixture(scope="module")
def passed_then_failing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A run dir holding a PASS report set, its job then turned FAILED (the next gate FAILs)."""
    run_dir = tmp_path_factory.mktemp("whole") / "run"
    shutil.copytree(EXAMPLE, run_dir, ignore=shutil.ignore_patterns("report", "README.md"))
    assert run_cli("gate", "--run-dir", str(run_dir), "--baseline", "patched").returncode == 0
    set_job_status(run_dir, "FAILED")
    return run_dir, report_set(run_dir)


# 60000: report.json and report.md fit, metrics.png does not; None: all fit
@pytest.mark.parametrize("limit", [60_000, None])
def test_a_report_set_is_all_new_or_all_old(
    passed_then_failing: tuple, limit: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir, before = passed_then_failing
    monkeypatch.delenv("MILES_AMD_HISTORY", raising=False)
    with file_size_limit(limit):
        done = run_cli("gate", "--run-dir", str(run_dir), "--baseline", "patched")
    after = report_set(run_dir)
    assert sorted(after) == ["metrics.png", "report.json", "report.md"]  # no temp file left
    if limit is not None:
        one_error_line(done, "cannot write the report", stdout="")
        assert after == before  # the previous PASS set, whole
    else:
        assert done.returncode == 1, done.stderr
        assert json.loads(after["report.json"])["verdict"] == "fail"
        assert after["metrics.png"] != before["metrics.png"]


@pytest.mark.parametrize(
    "args",
    [
        ["gate", "--run-dir", f"/tmp/{LONG_NAME}", "--baseline", "patched", "--no-history"],
        ["gate", "--run-dir", str(EXAMPLE), "--baseline", f"/tmp/{LONG_NAME}.json", "--no-history"],
        ["baseline", "record", "--run-dir", str(EXAMPLE), "--variant", "patched",
         "--out", f"/tmp/{LONG_NAME}/patched.json"],
        ["train", "--dry-run", "--run-dir", "/tmp/" + "/".join(["d" * 250] * 20)],
    ],
    ids=["gate run-dir", "gate baseline", "record out", "train path max"],
)  # fmt: skip
def test_an_over_long_path_is_one_line_and_exit_2(args: list[str]) -> None:
    line = one_error_line(run_cli(*args))
    assert "too long" in line or "longer than" in line, line


def test_a_report_that_cannot_be_put_in_place_appends_nothing_to_the_history(
    tmp_path: Path,
) -> None:
    """A directory named report.json: the set is written, its rename fails before the history
    append: exit 2 with one line, no history run and no temp file."""
    report_dir = tmp_path / "report"
    (report_dir / "report.json").mkdir(parents=True)
    history = tmp_path / "h.sqlite"
    args = ["gate", "--run-dir", str(EXAMPLE), "--baseline", "patched", "--history", str(history)]
    one_error_line(run_cli(*args, "--report-dir", str(report_dir)))
    listed = run_cli("history", "--history", str(history), "--format", "json")
    assert listed.returncode == 0 and json.loads(listed.stdout)["runs"] == []
    assert [p.name for p in report_dir.iterdir()] == ["report.json"]
