"""Export the history in the JSONL shape of upstream miles' metric-history store.

Upstream miles (``tests/ci/metric_history/``, pinned in ``/work/shared/upstream``) gates a
run against the history of trusted runs; its input per run is a merged JSONL record, one
line per metric ``{"metric": key, "series": [[step, value], ...]}`` (non-finite values as
the markers ``"NaN"``/``"Infinity"``/``"-Infinity"``; ``gate.parse_merged_record`` reads
it), and its ``runs`` table holds ``test_path, backend, suite, commit_sha, pr_number,
github_run_id, github_run_attempt, event_name, ref, created_at, trusted``. The export
writes, into one directory, ``<run_id>.jsonl`` per run in the record shape and
``runs.jsonl``, one ``runs`` row per line with the record's file name (``record``), so the
results can seed an upstream store. Mapping: ``test_path`` is the recipe, ``backend``
``rocm-mi355x``, ``suite`` the aiter variant (two variants never share a baseline, as two
upstream suites do not), ``trusted`` is the gate's verdict ``pass``; GitHub fields this store
does not keep are null. Stored values are finite (the store keeps no other), so no marker
is written.
"""

from __future__ import annotations

import json
from pathlib import Path

from miles_amd.files import atomic_write_text
from miles_amd.history.store import HistoryStore

BACKEND = "rocm-mi355x"


def export_jsonl(store: HistoryStore, out_dir: Path) -> list[Path]:
    """Write ``runs.jsonl`` and one ``<run_id>.jsonl`` per stored run; return the paths."""
    written, rows = [], []
    for run in store.runs():
        record = out_dir / f"{run.run_id}.jsonl"
        lines = [
            json.dumps({"metric": metric, "series": [[s, v] for s, v in points]})
            for metric, points in sorted(store.series(run.run_id).items())
        ]
        atomic_write_text(record, "".join(line + "\n" for line in lines))
        written.append(record)
        rows.append(
            {
                "test_path": run.recipe,
                "backend": BACKEND,
                "suite": run.variant or "unknown",
                "commit_sha": run.commit_sha or "",
                "pr_number": None,
                "github_run_id": None,
                "github_run_attempt": None,
                "event_name": None,
                "ref": None,
                "created_at": run.created_at,
                "trusted": run.verdict == "pass",
                "record": record.name,
            }
        )
    runs = out_dir / "runs.jsonl"
    atomic_write_text(runs, "".join(json.dumps(row) + "\n" for row in rows))
    return [runs, *written]
