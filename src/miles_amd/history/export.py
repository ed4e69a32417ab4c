"""Export the history as upstream miles' CI capture would have written it: per run a capture
record, ``runs.jsonl`` (upstream's ``runs`` columns plus ours) and each variant's upstream test
file. A run without a recorded variant is not exported; a row is foreign input, so every write
passes one guard (:func:`inside`); ``out_dir`` is replaced only when it is an earlier export,
built beside it and renamed. Explained in ``docs/cli.md`` ("The export").
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from miles_amd.files import abandoned, hold, owned_name
from miles_amd.history.store import HistoryStore, StoredRun
from miles_amd.variants import AITER_VARIANTS

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
    if variant not in AITER_VARIANTS:
        raise ValueError(f"aiter variant {variant!r:.40} is not one of {', '.join(AITER_VARIANTS)}")
    return f"{TEST_DIR}/test_gpt_oss_20b_lora_{variant}.py"


def _record_text(series: dict[str, list[tuple[int, float]]]) -> str:
    """One run's capture record: a line per captured key, in upstream's key order, a
    non-finite value as capture's marker (``ci_history._encode_value``)."""
    markers = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
    return "".join(
        json.dumps(
            {"metric": key, "series": [[s, v if math.isfinite(v) else markers[str(v)]]
                                       for s, v in series[key]]},
            allow_nan=False,
        ) + "\n"
        for key in TARGET_METRIC_KEYS
        if series.get(key)
    )  # fmt: skip


def upstream_test_file(variant: str, metrics: Sequence[str]) -> str:
    upstream_test_path(variant)  # a known variant, or ValueError
    unknown = [m for m in metrics if m not in TARGET_METRIC_KEYS]
    if unknown:
        raise ValueError(f"metric {unknown[0]!r:.60} is not one of upstream's captured keys")
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


def _index_row(run: StoredRun, record_dir: str) -> dict[str, object]:
    """Upstream's ``runs`` columns, then where the record is and our own fields."""
    assert run.variant is not None
    return {
        "test_path": upstream_test_path(run.variant),
        "backend": BACKEND,
        "suite": SUITE,
        "commit_sha": run.commit_sha or "",
        **dict.fromkeys(("pr_number", "github_run_id", "github_run_attempt", "event_name", "ref")),
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
    runs: int
    without_variant: int
    test_files: tuple[str, ...]


def inside(root: Path, relative: str) -> Path:
    """``root / relative`` when made of plain names (no ``..``, absolute part or link)."""
    parts = PurePosixPath(relative).parts
    if (
        not parts
        or any(p in ("", ".", "..") or "/" in p or "\\" in p for p in parts)
        or (PurePosixPath(relative).is_absolute())
    ):
        raise ValueError(f"{relative!r:.80} is not a path inside the export")
    path = root.joinpath(*parts)
    if not path.resolve().is_relative_to(root.resolve()):
        raise ValueError(f"{relative!r:.80} leads outside the export")
    return path


def _write(root: Path, relative: str, text: str) -> None:
    path = inside(root, relative)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("x", encoding="utf-8") as handle:  # never over a file, never through a link
        handle.write(text)


def _build(store: HistoryStore, root: Path) -> Export:
    rows: list[dict[str, object]] = []
    metrics_by_variant: dict[str, set[str]] = {}
    skipped = 0
    for run in store.runs():
        if run.variant is None:
            skipped += 1
            continue
        series = store.series(run.run_id)
        if not isinstance(run.run_id, int) or isinstance(run.run_id, bool) or run.run_id < 1:
            raise ValueError(f"run id {run.run_id!r:.40} is not a positive integer")
        record = f"records/run-{run.run_id}/history-{run.run_id}.jsonl"
        _write(root, record, _record_text(series))
        seen = metrics_by_variant.setdefault(run.variant, set())
        seen.update(k for k in TARGET_METRIC_KEYS if series.get(k))
        rows.append(_index_row(run, str(PurePosixPath(record).parent)))
    for variant, seen in sorted(metrics_by_variant.items()):
        metrics = [k for k in TARGET_METRIC_KEYS if k in seen]
        _write(root, upstream_test_path(variant), upstream_test_file(variant, metrics))
    _write(root, INDEX, "".join(json.dumps(row, allow_nan=False) + "\n" for row in rows))
    tests = tuple(upstream_test_path(v) for v in sorted(metrics_by_variant))
    return Export(len(rows), skipped, tests)


def earlier_export(out_dir: Path) -> str | None:
    """Why ``out_dir`` is not an earlier export (only files an export writes, no link)."""
    tests = "|".join(re.escape(upstream_test_path(v)) for v in AITER_VARIANTS)
    files = re.compile(rf"{re.escape(INDEX)}|records/run-([1-9][0-9]*)/history-\1\.jsonl|{tests}")
    for top, dirs, names in os.walk(out_dir, onerror=_raise):
        for name in (*dirs, *names):
            path = Path(top, name)
            relative = path.relative_to(out_dir).as_posix()
            if path.is_symlink():
                return f"{relative} is a symbolic link"
            if name in names and not (path.is_file() and files.fullmatch(relative)):
                return f"{relative} is not a file an export writes"
    if not (out_dir / INDEX).is_file():
        return f"it holds no {INDEX}"
    return None


def _raise(error: OSError) -> None:
    raise error


def export_upstream(store: HistoryStore, out_dir: Path) -> Export:
    """Write the export whole into ``out_dir`` (absent, empty or an earlier export), else
    ``FileExistsError`` naming what is in the way."""
    out_dir = Path(os.path.abspath(out_dir))  # "." names its parent's entry, not itself
    if out_dir.is_symlink():
        raise FileExistsError(
            f"{out_dir} is a symbolic link; the export does not write through one"
        )
    if out_dir.exists() and any(out_dir.iterdir()):
        why = earlier_export(out_dir)
        if why is not None:
            raise FileExistsError(f"{out_dir} is neither empty nor an earlier export ({why})")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    stem = f".{out_dir.name}"
    parent = os.open(out_dir.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for entry in os.listdir(parent):
            if abandoned(parent, entry, stem, STAGING_SUFFIX):  # a killed export's
                shutil.rmtree(out_dir.parent / entry, ignore_errors=True)
        staging = out_dir.parent / owned_name(stem, STAGING_SUFFIX)
        os.mkdir(staging.name, 0o755, dir_fd=parent)
    finally:
        os.close(parent)
    held = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        hold(held)
        written = _build(store, staging)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        os.close(held)
        shutil.rmtree(staging, ignore_errors=True)
    return written
