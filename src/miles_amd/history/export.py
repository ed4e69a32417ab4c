"""Export the history as upstream miles' CI capture would have written it.

- The files of :func:`export_upstream`, in one directory: per run
  ``records/run-<id>/history-<id>.jsonl`` (capture's ``{"metric", "series"}`` lines, non-finite
  values as markers), ``runs.jsonl`` (upstream's ``runs`` columns per run, plus ours), and the
  upstream test file the identity names
  (``tests/e2e/amd/test_gpt_oss_20b_lora_<variant>.py``, with its ``register_rocm_ci`` and one
  ``register_ci_gate`` per metric), so upstream's own parser, store and gate consume it.
- Identity mapping: one ``test_path`` per aiter variant (upstream's identity has no aiter
  field), ``backend`` ``rocm``, ``suite`` upstream's 8-GPU ROCm suite, ``trusted`` a gate pass
  not marked untrusted, ``commit_sha`` the recorded commit or ``""``.

Caveats:

- A run without a recorded aiter variant has no upstream identity and is not exported
  (:class:`Export` counts it); upstream's GitHub fields this store does not keep are null.
- Decides the files only; the CLI (``miles-amd history --export``) decides when.
- Upstream's names (``ci_utils``, ``gate``, ``run_suite``) are of the miles pinned in
  ``/work/shared/upstream``; ``tests/conformance/test_upstream_history.py`` runs its gate.

Explained in ``docs/cli.md`` ("The export", with upstream's sources and the mapping).
"""

from __future__ import annotations

import glob
import json
import math
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from miles_amd.history.store import HistoryStore, StoredRun

# miles/utils/tracking_utils/ci_history.py TARGET_METRIC_KEYS (a conformance test keeps them equal)
TARGET_METRIC_KEYS: tuple[str, ...] = (
    "train/grad_norm",
    "train/ppo_kl",
    "train/train_rollout_logprob_abs_diff",
    "train/train_rollout_kl",
    "rollout/raw_reward",
    "rollout/tito_session_mismatch_rate/v1/assistant_text",
    "rollout/tito_session_mismatch_rate/v2/assistant_text",
)
BACKEND = "rocm"
SUITE = "nightly-stage-c-8-gpu-mi350"
TEST_DIR = "tests/e2e/amd"
LABELS = ("amd", "lora")
EST_TIME_S = 4000  # the published run took 66 min (examples/runs/jvvnhop9/job.json)
INDEX = "runs.jsonl"
STAGING_SUFFIX = ".staging"  # the dir an export is built in, beside its destination


def upstream_test_path(variant: str) -> str:
    """The upstream test file (repo-relative) whose identity the runs of ``variant`` carry."""
    return f"{TEST_DIR}/test_gpt_oss_20b_lora_{variant}.py"


def encode_value(value: float) -> float | str:
    """A value as upstream's capture writes it (``ci_history._encode_value``)."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def record_text(series: dict[str, list[tuple[int, float]]]) -> str:
    """One run's capture record: a line per captured key, in upstream's key order."""
    lines = [
        json.dumps(
            {"metric": key, "series": [[step, encode_value(v)] for step, v in series[key]]},
            allow_nan=False,
        )
        for key in TARGET_METRIC_KEYS
        if series.get(key)
    ]
    return "".join(line + "\n" for line in lines)


def upstream_test_file(variant: str, metrics: Sequence[str]) -> str:
    """The upstream test file that registers the identity and gates ``metrics``."""
    gates = "".join(f'register_ci_gate(metric_key="{m}")\n' for m in metrics)
    labels = ", ".join(f'"{label}"' for label in LABELS)
    return (
        f'"""gpt-oss-20b MoE LoRA GRPO on 8x MI355X, aiter {variant} (miles-amd recipe).\n\n'
        "Written by `miles-amd history --export`: the registration and gates whose identity\n"
        'the exported runs carry (runs.jsonl beside tests/)."""\n\n'
        "from tests.ci.ci_register import register_rocm_ci\n"
        "from tests.ci.metric_history import register_ci_gate\n\n"
        f'register_rocm_ci(est_time={EST_TIME_S}, suite="{SUITE}", labels=[{labels}])\n'
        f"{gates}"
    )


def index_row(run: StoredRun, record_dir: str) -> dict[str, object]:
    """Upstream's ``runs`` columns for ``run`` (variant recorded), then where its record is."""
    assert run.variant is not None
    return {
        "test_path": upstream_test_path(run.variant),
        "backend": BACKEND,
        "suite": SUITE,
        "commit_sha": run.commit_sha or "",
        "pr_number": None,
        "github_run_id": None,
        "github_run_attempt": None,
        "event_name": None,
        "ref": None,
        "created_at": run.created_at,
        "trusted": run.trusted,
        "record_dir": record_dir,
        "miles_amd": {
            "run_id": run.run_id,
            "variant": run.variant,
            "aiter_commit": run.aiter_commit,
            "verdict": run.verdict,
        },
    }


@dataclass(frozen=True)
class Export:
    """What an export wrote: runs exported, runs left out (no recorded variant), test files."""

    runs: int
    without_variant: int
    test_files: tuple[str, ...]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _build(store: HistoryStore, root: Path) -> Export:
    rows: list[dict[str, object]] = []
    metrics_by_variant: dict[str, set[str]] = {}
    skipped = 0
    for run in store.runs():
        if run.variant is None:
            skipped += 1
            continue
        series = store.series(run.run_id)
        record_dir = f"records/run-{run.run_id}"
        _write(root / record_dir / f"history-{run.run_id}.jsonl", record_text(series))
        seen = metrics_by_variant.setdefault(run.variant, set())
        seen.update(k for k in TARGET_METRIC_KEYS if series.get(k))
        rows.append(index_row(run, record_dir))
    for variant, seen in sorted(metrics_by_variant.items()):
        metrics = [k for k in TARGET_METRIC_KEYS if k in seen]
        _write(root / upstream_test_path(variant), upstream_test_file(variant, metrics))
    _write(root / INDEX, "".join(json.dumps(row, allow_nan=False) + "\n" for row in rows))
    return Export(
        len(rows), skipped, tuple(upstream_test_path(v) for v in sorted(metrics_by_variant))
    )


def export_upstream(store: HistoryStore, out_dir: Path) -> Export:
    """Write the export into ``out_dir`` whole or not at all (built beside it, then renamed).

    ``out_dir`` must be absent, empty, or an earlier export (it holds ``runs.jsonl``), which
    is replaced; anything else raises ``FileExistsError`` and is left as it was.
    """
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / INDEX).is_file():
        raise FileExistsError(f"{out_dir} is neither empty nor an earlier export")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{out_dir.name}."
    for stale in out_dir.parent.glob(f"{glob.escape(prefix)}*{STAGING_SUFFIX}"):
        if stale.is_dir() and not stale.is_symlink():  # a killed export's: never completed
            shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=prefix, suffix=STAGING_SUFFIX))
    try:
        written = _build(store, staging)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written
