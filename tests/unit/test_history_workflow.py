"""The nightly lane keeps the run history between runs and shows its trend."""

from __future__ import annotations

from pathlib import Path

import yaml

from miles_amd.history.store import SCHEMA_VERSION

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "amd-nightly.yml"


def steps() -> list[dict]:
    doc = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    return doc["jobs"]["nightly"]["steps"]


def index(found: list[dict], name: str) -> int:
    return next(i for i, s in enumerate(found) if s.get("name") == name)


def test_history_is_restored_appended_shown_and_saved() -> None:
    found = steps()
    restore = found[index(found, "Restore the run history")]
    record = found[index(found, "Record the verdict in the run history")]
    save = found[index(found, "Save the run history")]
    test = index(found, "Hardware acceptance run")
    summary = found[index(found, "Append the report to the job summary")]
    assert (
        index(found, "Restore the run history")
        < test
        < index(found, "Record the verdict in the run history")
    )
    assert index(found, "Record the verdict in the run history") < index(
        found, "Append the report to the job summary"
    )
    assert restore["uses"].startswith("actions/cache/restore@")
    assert save["uses"].startswith("actions/cache/save@")
    assert save["with"]["key"] == restore["with"]["key"]
    assert save["with"]["path"] == restore["with"]["path"] == "runs/history"
    # The cache key names the history's schema: a cached file of an older schema is refused
    # by the store, so a new SCHEMA_VERSION must start a new cache line.
    prefix = f"nightly-history-v{SCHEMA_VERSION}-${{{{ matrix.aiter }}}}-"
    assert restore["with"]["restore-keys"].strip() == prefix
    assert restore["with"]["key"].startswith(prefix)
    assert record["if"] == save["if"] == "always()"
    assert "miles-amd gate" in record["run"] and "miles-amd history" in record["run"]
    assert "--baseline auto" in record["run"]  # the node's GPU and shape pick the baseline
    assert "--plot" in record["run"] and "history.md" in summary["run"]
    env = yaml.safe_load(WORKFLOW.read_text())["jobs"]["nightly"]["env"]
    assert env["MILES_AMD_HISTORY"].startswith("runs/history/")
