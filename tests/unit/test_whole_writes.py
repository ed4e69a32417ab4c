"""Issue 26 item 3 through the real CLI: a report set is written whole or not at all, and a
path longer than the OS allows is one line and exit 2.

A full file system is simulated with ``RLIMIT_FSIZE`` (``EFBIG``, as a full disk is
``ENOSPC``) in the ``miles-amd gate`` process; ``SIGXFSZ`` is ignored there, so the write
fails instead of killing the process. The property: whatever the limit, the gate either exits
0/1 with the new set complete, or exits 2 with one line and the previous set byte for byte
(never a FAIL report.json beside an older PASS metrics.png), and no temp file stays.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.cli_runs import one_error_line, run_cli
from tests.constants import EXAMPLE

pytestmark = pytest.mark.unit

REPORT = ("metrics.png", "report.json", "report.md")
LONG_NAME = "n" * 300  # one name past NAME_MAX (255)


def failing_example(root: Path) -> Path:
    """The embedded example with its job FAILED: the gate's verdict is FAIL (exit 1)."""
    run_dir = root / "run"
    shutil.copytree(EXAMPLE, run_dir, ignore=shutil.ignore_patterns("report", "README.md"))
    job = json.loads((run_dir / "job.json").read_text())
    (run_dir / "job.json").write_text(json.dumps({**job, "status": "FAILED"}))
    return run_dir


def gate_process(run_dir: Path, limit: int | None = None) -> subprocess.CompletedProcess:
    def limited() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    argv = [sys.executable, "-m", "miles_amd.cli", "gate", "--run-dir", str(run_dir)]
    argv += ["--baseline", "patched", "--no-history"]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("MILES_AMD_HISTORY", None)
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=120, preexec_fn=limited, env=env
    )


def report_set(run_dir: Path) -> dict[str, bytes]:
    out = run_dir / "report"
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())} if out.is_dir() else {}


@pytest.fixture(scope="module")
def passed_then_failing(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A run dir holding a PASS report set, its job then turned FAILED (the next gate FAILs)."""
    root = tmp_path_factory.mktemp("whole")
    run_dir = failing_example(root)
    job = json.loads((run_dir / "job.json").read_text())
    (run_dir / "job.json").write_text(json.dumps({**job, "status": "SUCCEEDED"}))
    assert gate_process(run_dir).returncode == 0
    (run_dir / "job.json").write_text(json.dumps({**job, "status": "FAILED"}))
    return run_dir, report_set(run_dir)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limit=st.sampled_from([0, 3000, 30_000, 60_000, 10_000_000]) | st.integers(0, 200_000))
@example(limit=60_000)  # report.json and report.md fit, metrics.png does not
def test_a_report_set_is_all_new_or_all_old(passed_then_failing: tuple, limit: int) -> None:
    run_dir, before = passed_then_failing
    done = gate_process(run_dir, limit)
    after = report_set(run_dir)
    assert "Traceback" not in done.stderr
    assert sorted(after) == list(REPORT), sorted(after)  # no temp file left either
    if done.returncode == 2:
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "cannot write the report" in lines[0], done.stderr
        assert after == before  # the previous PASS set, whole
    else:
        assert done.returncode == 1, done.stderr
        assert json.loads(after["report.json"])["verdict"] == "fail"
        assert after["metrics.png"] != before["metrics.png"]
        # put the PASS set back for the next example
        for name, data in before.items():
            (run_dir / "report" / name).write_bytes(data)


@pytest.mark.parametrize(
    "args",
    [
        ["gate", "--run-dir", f"/tmp/{LONG_NAME}", "--baseline", "patched", "--no-history"],
        ["gate", "--run-dir", str(EXAMPLE), "--baseline", "patched", "--no-history",
         "--report-dir", f"/tmp/{LONG_NAME}"],
        ["gate", "--run-dir", str(EXAMPLE), "--baseline", f"/tmp/{LONG_NAME}.json", "--no-history"],
        ["baseline", "record", "--run-dir", str(EXAMPLE), "--variant", "patched",
         "--out", f"/tmp/{LONG_NAME}/patched.json"],
        ["baseline", "record", "--run-dir", f"/tmp/{LONG_NAME}", "--variant", "patched",
         "--out", "/tmp/x/patched.json"],
        ["train", "--dry-run", "--run-dir", f"/tmp/{LONG_NAME}"],
        ["train", "--dry-run", "--run-dir", "/tmp/" + "/".join(["d" * 250] * 20)],
    ],
    ids=["gate run-dir", "gate report-dir", "gate baseline", "record out", "record run-dir",
         "train run-dir", "train path max"],
)  # fmt: skip
def test_an_over_long_path_is_one_line_and_exit_2(args: list[str]) -> None:
    line = one_error_line(run_cli(*args))
    assert "too long" in line or "longer than" in line, line


@pytest.mark.parametrize("blocked", ["a-file/report", "report.json-a-dir"])
def test_a_report_that_cannot_be_put_in_place_appends_nothing_to_the_history(
    tmp_path: Path, blocked: str
) -> None:
    """The set is written, then put in place, before the history append: a report dir under a
    file, or a directory named report.json (the rename fails), is exit 2 with one line, no
    history run and no temp file."""
    (tmp_path / "a-file").write_text("")
    report_dir = tmp_path / "a-file" / "report"
    if blocked != "a-file/report":
        report_dir = tmp_path / "report"
        (report_dir / "report.json").mkdir(parents=True)
    history = tmp_path / "h.sqlite"
    args = ["gate", "--run-dir", str(EXAMPLE), "--baseline", "patched", "--history", str(history)]
    done = run_cli(*args, "--report-dir", str(report_dir))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    listed = run_cli("history", "--history", str(history), "--format", "json")
    assert listed.returncode == 0 and json.loads(listed.stdout)["runs"] == []
    if report_dir.is_dir():
        assert [p.name for p in report_dir.iterdir()] == ["report.json"]
