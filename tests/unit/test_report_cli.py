"""What `miles-amd gate` prints last: where the report was written (in-process, its own entry)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli_runs import run_cli
from tests.constants import EXAMPLE


def test_the_report_path_is_the_last_line(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = run_cli(
        "gate", "--run-dir", str(EXAMPLE), "--baseline", "patched", "--report-dir", str(out)
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert next(line for line in lines if line.startswith("PASS: ")).startswith(
        "PASS: this run is accepted: all 19 measured checks"
    )
    assert lines[-1] == f"report written to {out / 'report.md'} (also report.json, metrics.png)"
    assert lines[-3].startswith("history: appended as run ")  # the history's lines before it
    as_json = run_cli(
        "gate",
        "--run-dir",
        str(EXAMPLE),
        "--baseline",
        "patched",
        "--report-dir",
        str(out),
        "--format",
        "json",
    )
    assert json.loads(as_json.stdout)["summary"].startswith("this run is accepted")
    assert as_json.stderr.splitlines()[-1] == lines[-1]  # stdout stays the JSON document
