"""Run inside miles' sources: seed miles' own store from a ``history --export`` and gate a run.

Usage (cwd = the export directory, as upstream runs from its repo root; ``PYTHONPATH`` = the
miles checkout, so ``tests.ci`` and ``miles`` are upstream's): ``python upstream_history.py
TEST_PATH CANDIDATE_JSON``, the candidate's values ``{"<step>": {"<metric>": value}}`` (in
step order). Prints one JSON object:

- ``loaded``: per ``runs.jsonl`` row (oldest first), how upstream read its record: the
  record directory merged by upstream's ``ci_utils._merge_attempt_records``, the merged record
  judged by ``gate.evaluate_gate`` (the gate specs and registration of ``TEST_PATH``) against
  an empty store, so ``errors`` are what upstream refuses in the record itself (a missing
  metric, a non-finite value). Each row is then written with ``SQLiteMetricHistoryStore
  .write_run``: the row's identity, provenance, ``created_at`` and ``trusted``, and one
  value per coordinate upstream selected, as ``ci_utils.run_gate_hook`` writes them.
- ``gate``: the candidate's values logged step by step through miles' own capture backend
  (``CiHistoryBackend``, ``MILES_CI_GATE_RECORD_DIR`` set), the record merged the same way and
  gated by
  ``evaluate_gate(TEST_PATH, merged, store)``: the identity is the one upstream parses from
  ``TEST_PATH``'s ``register_rocm_ci``, so rows that carry another identity give it no history.

Only the standard library, miles' ``tests/ci`` and its capture backend (standard library only)
are used.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from miles.utils.tracking_utils.ci_history import RECORD_DIR_ENV, CiHistoryBackend

from tests.ci.ci_register import ut_parse_one_file
from tests.ci.ci_utils import _merge_attempt_records
from tests.ci.metric_history import (
    MetricSample,
    RunIdentity,
    RunProvenance,
    SQLiteMetricHistoryStore,
)
from tests.ci.metric_history.gate import GateStatus, evaluate_gate

PROVENANCE = ("commit_sha", "pr_number", "github_run_id", "github_run_attempt", "event_name", "ref")


def merged(record_dir: str, scratch: Path) -> str:
    out = scratch / f"{len(list(scratch.iterdir()))}.merged.jsonl"
    _merge_attempt_records(record_dir, str(out))
    return str(out)


def captured(values: dict[str, dict[str, float]], record_dir: Path) -> str:
    """The candidate's record directory, written by miles' capture backend."""
    os.environ[RECORD_DIR_ENV] = str(record_dir)
    backend = CiHistoryBackend()
    backend.init(None)
    for step, metrics in values.items():
        backend.log(metrics, step=int(step))
    backend.finish()
    return str(record_dir)


def main(test_path: str, candidate_json: str) -> dict[str, object]:
    registry = ut_parse_one_file(test_path)[0]
    store = SQLiteMetricHistoryStore(":memory:")
    scratch = Path(tempfile.mkdtemp())
    loaded = []
    for line in Path("runs.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        record = merged(row["record_dir"], scratch)
        reading = evaluate_gate(test_path, record, SQLiteMetricHistoryStore(), registry=registry)
        values, seen = [], set()
        for m in reading.metrics:
            coordinate = (m.metric_key, m.steps_key, m.constraint_key, m.step)
            if m.current is None or coordinate in seen:
                continue
            seen.add(coordinate)
            values.append(MetricSample(*coordinate, m.current))
        store.write_run(
            RunIdentity(row["test_path"], row["backend"], row["suite"]),
            RunProvenance(**{name: row[name] for name in PROVENANCE}),
            row["created_at"],
            trusted=row["trusted"],
            values=values,
        )
        errors = [m.reason for m in reading.metrics if m.historical_status is GateStatus.ERROR]
        loaded.append({"run_id": row["miles_amd"]["run_id"], "errors": errors})
    values = json.loads(Path(candidate_json).read_text(encoding="utf-8"))
    candidate_dir = captured(values, Path(tempfile.mkdtemp()) / "attempt-1")
    result = evaluate_gate(test_path, merged(candidate_dir, scratch), store)
    return {
        "loaded": loaded,
        "gate": {
            "identity": [result.test_path, result.backend, result.suite],
            "trusted": result.trusted,
            "metrics": [
                {
                    "metric": m.metric_key,
                    "step": m.step,
                    "status": m.historical_status.value,
                    "baseline_n": m.baseline_n,
                    "reason": m.reason,
                }
                for m in result.metrics
            ],
        },
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
