"""A baseline recorded from a rehearsal run round-trips, and its diff shows what moved.

Each run goes through the real driver, Ray job, replay and gate (``tests.support.rehearsal``),
then the real command line in subprocesses as CI runs it: ``baseline record
--allow-no-preflight`` (a CPU rehearsal has no GPUs to pass a preflight), ``gate`` against the
recorded file, ``baseline diff`` against the shipped patched baseline. A shifted run's changed
bands and ``--from-history`` are the unit tier's (``test_baseline_record.py``,
``test_baseline_keys.py``: the same commands on miles' three formats written directly).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from miles_amd.app.train import TrainResult
from tests.cli_runs import run_cli_process
from tests.constants import SHIPPED
from tests.support.rehearsal import expectation_problems

pytestmark = pytest.mark.rehearsal


def bands(path: Path) -> dict[str, dict]:
    return {r["id"]: r["band"] for r in json.loads(path.read_text())["rules"] if "band" in r}


def record_and_gate(run_dir: Path, out: Path) -> None:
    recorded = run_cli_process(
        "baseline", "record", "--run-dir", str(run_dir), "--variant", "patched",
        "--out", str(out), "--allow-no-preflight",
    )  # fmt: skip
    assert recorded.returncode == 0, recorded.stderr
    provenance = json.loads(out.read_text())["provenance"]
    assert provenance["run_id"].startswith("miles-amd-") and provenance["job_status"] == "SUCCEEDED"
    assert "preflight: not run" in provenance["notes"]
    gated = run_cli_process(
        "gate", "--run-dir", str(run_dir), "--baseline", str(out),
        "--report-dir", str(out.parent / "report"),
    )  # fmt: skip
    assert gated.returncode == 0, gated.stdout + gated.stderr
    assert gated.stdout.startswith("miles-amd gate: PASS")


def marked_rules(diff_text: str) -> dict[str, str]:
    """Rule id -> head line (with its wrapped tail, indented six), for the rows the text diff
    marks with '*'."""
    heads: dict[str, str] = {}
    last = None
    for line in diff_text.split("\n\nprovenance")[0].splitlines():
        if line.startswith("* "):
            last = line[2:].split(" ", 1)[0]
            heads[last] = line
        elif last is not None and line.startswith(" " * 6) and line[6] != " ":
            heads[last] += " " + line.strip()
        else:
            last = None
    return heads


def test_a_plain_rehearsal_records_the_shipped_bands(healthy_run: TrainResult, tmp_path) -> None:
    assert expectation_problems(None, healthy_run) == []  # the replay of the embedded example
    out = tmp_path / "replayed" / "patched.json"
    record_and_gate(healthy_run.outcome.run_dir, out)

    assert bands(out) == bands(SHIPPED / "patched.json")  # the replay carries the published series
    diff = run_cli_process("baseline", "diff", "patched", str(out), "--format", "text")
    assert diff.returncode == 1, diff.stderr  # the reward reference moved
    marked = marked_rules(diff.stdout)
    assert not [line for line in marked.values() if "tolerance" in line]
    # only the reward reference moved: the published 4-decimal rewards became exact k/64
    # (and the spread floor's reference, which is derived from the reward mean)
    assert set(marked) == {"raw_reward.mean", "raw_reward.paired", "raw_reward.spread"}
    assert all(line.endswith("CHANGED: reference") for line in marked.values())
