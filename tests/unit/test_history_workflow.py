"""The nightly lane keeps the run history between runs and shows its trend."""

from __future__ import annotations

from pathlib import Path

import yaml

from miles_amd.history.store import SCHEMA_VERSION

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "amd-nightly.yml"


def test_history_is_restored_appended_shown_and_saved() -> None:
    doc = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))["jobs"]["nightly"]
    steps = doc["steps"]
    at = {s.get("name"): i for i, s in enumerate(steps)}
    names = (
        "Restore the run history",
        "Hardware acceptance run",
        "Record the verdict in the run history",
        "Append the report to the job summary",
    )
    assert [at[n] for n in names] == sorted(at[n] for n in names)
    restore, _, record, summary = (steps[at[n]] for n in names)
    save = steps[at["Save the run history"]]
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
    assert doc["env"]["MILES_AMD_HISTORY"].startswith("runs/history/")
