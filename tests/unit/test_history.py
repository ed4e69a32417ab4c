"""The run history: the SQLite store, the drift check, the upstream export, and the CLI
(`miles-amd gate` appending, `miles-amd history` listing) on real run dirs."""

from __future__ import annotations

import json
import math
import os
import sqlite3
from dataclasses import fields
from pathlib import Path

import pytest

from miles_amd.history.drift import calibrated_k, drifts
from miles_amd.history.export import export_jsonl
from miles_amd.history.store import (
    SCHEMA_VERSION,
    HistoryError,
    HistoryRecord,
    HistoryStore,
    RunRow,
    Summary,
)
from tests.cli_runs import run_cli
from tests.run_dirs import write_run

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "runs" / "jvvnhop9"
LOGPROB = "train/train_rollout_logprob_abs_diff"
REWARD = "rollout/raw_reward"
CLIPFRAC = "train/pg_clipfrac"


def record(mean: float, *, verdict: str = "pass", variant: str = "patched") -> HistoryRecord:
    values = [(i, mean + (0.001 if i % 2 else -0.001)) for i in range(20)]
    return HistoryRecord(
        created_at="2026-11-30T12:00:00+00:00",
        recipe="gpt_oss_20b_lora",
        variant=variant,
        baseline="patched",
        image="img",
        commit_sha="c0ffee",
        run_dir="/runs/x",
        verdict=verdict,
        reason="r",
        rollouts=20,
        failed_checks=() if verdict == "pass" else ("logprob_abs_diff.mean",),
        series={LOGPROB: values, REWARD: [(0, 0.5), (1, math.nan)]},
    )


def test_store_round_trip_keeps_summaries_and_only_finite_values(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "history.sqlite"
    with HistoryStore(path) as store:
        first = store.append(record(0.017))
        store.append(record(0.018, verdict="fail"))
        runs = store.runs()
        assert [r.run_id for r in runs] == [first, first + 1]
        assert runs[1].failed_checks == ("logprob_abs_diff.mean",)
        assert runs[0].summaries[LOGPROB].mean == pytest.approx(0.017)
        assert runs[0].summaries[LOGPROB].n == 20
        assert runs[0].summaries[REWARD].n == 1  # the NaN is not kept
        assert store.series(first)[REWARD] == [(0, 0.5)]
        assert [r.run_id for r in store.runs(limit=1)] == [first + 1]
        assert store.runs(variant="stock") == []
    version = sqlite3.connect(path).execute("SELECT value FROM meta").fetchone()
    assert version == (str(SCHEMA_VERSION),)


def test_the_tables_columns_are_the_dataclass_fields_and_a_row_reads_back_whole(
    tmp_path: Path,
) -> None:
    path = tmp_path / "h.sqlite"
    written = record(0.017, verdict="fail")
    with HistoryStore(path) as store:
        run_id = store.append(written)
        (stored,) = store.runs()
    db = sqlite3.connect(path)
    columns = [row[1] for row in db.execute("PRAGMA table_info(runs)")]
    assert columns == ["run_id", *(f.name for f in fields(RunRow))]
    summary_columns = [row[1] for row in db.execute("PRAGMA table_info(summaries)")]
    assert summary_columns == ["run_id", "metric", *(f.name for f in fields(Summary))]
    for f in fields(RunRow):
        assert getattr(stored, f.name) == getattr(written, f.name), f.name
    assert stored.run_id == run_id


def test_another_schema_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    HistoryStore(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(HistoryError, match="history schema version 99, this miles-amd writes 1"):
        HistoryStore(path)
    (tmp_path / "junk.sqlite").write_text("not a database at all, just text " * 20)
    with pytest.raises(HistoryError, match="cannot open the history"):
        HistoryStore(tmp_path / "junk.sqlite")


def test_calibrated_k_bounds_the_false_flag_rate() -> None:
    assert calibrated_k(7) == 6  # 2*7/7! = 0.28%; k = 5 would give 1.9%
    assert calibrated_k(3) == 5
    for metrics in (1, 3, 7, 20):
        k = calibrated_k(metrics)
        assert 2 * metrics / math.factorial(k + 1) <= 0.01 < 2 * metrics / math.factorial(k)


def test_drift_needs_k_moves_the_same_way(tmp_path: Path) -> None:
    with HistoryStore(tmp_path / "h.sqlite") as store:
        for mean in (0.0170, 0.0169, 0.0171, 0.0172, 0.0173, 0.0174, 0.0175):
            store.append(record(mean))
        runs = store.runs()
    (found,) = drifts(runs, 5)
    assert found.metric == LOGPROB and found.direction == "up"
    assert found.sentence().startswith(f"{LOGPROB} went up in 5 consecutive runs (0.0169 -> ")
    assert drifts(runs, 6) == []  # the 0.0170 -> 0.0169 move breaks a run of 6
    assert drifts(runs[:4], 5) == []  # too few runs


def test_export_is_upstream_merged_record_shape(tmp_path: Path) -> None:
    with HistoryStore(tmp_path / "h.sqlite") as store:
        store.append(record(0.017))
        store.append(record(0.02, verdict="fail", variant="stock"))
        paths = export_jsonl(store, tmp_path / "out")
    rows = [json.loads(line) for line in (tmp_path / "out" / "runs.jsonl").read_text().splitlines()]
    assert [r["trusted"] for r in rows] == [True, False]
    assert [r["suite"] for r in rows] == ["patched", "stock"]
    assert set(rows[0]) >= {"test_path", "backend", "suite", "commit_sha", "created_at", "trusted"}
    lines = [json.loads(line) for line in paths[1].read_text().splitlines()]
    assert {line["metric"] for line in lines} == {LOGPROB, REWARD}
    for line in lines:  # what upstream's gate.parse_merged_record reads
        assert set(line) == {"metric", "series"}
        assert all(isinstance(s, int) and isinstance(v, float) for s, v in line["series"])


# ---------------------------------------------------------------------------- CLI


def gate(run_dir: Path, history: Path, *extra: str, baseline: str = "patched", env=None):
    return run_cli(
        "gate",
        "--run-dir",
        str(run_dir),
        "--baseline",
        baseline,
        "--report-dir",
        str(run_dir.parent / f"{run_dir.name}-report"),
        "--history",
        str(history),
        *extra,
        env=env,
    )


def test_gate_appends_and_history_lists(tmp_path: Path) -> None:
    history = tmp_path / "history.sqlite"
    example = tmp_path / "example"
    example.symlink_to(EXAMPLE)
    env = {**os.environ, "GITHUB_SHA": "0123456789abcdef", "MILES_AMD_IMAGE": "rocm/img:tag"}
    result = gate(example, history, env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[-3] == f"history: appended as run 1 to {history}"
    assert lines[-2].startswith("drift: not checked yet (1 run(s); k = 5 moves need 6)")
    assert lines[-1].startswith("report written to ")
    report_md = (tmp_path / "example-report" / "report.md").read_text()
    assert "### Drift across runs" in report_md and f"run 1 to the history `{history}`" in report_md
    listed = run_cli("history", "--history", str(history), "--format", "json")
    assert listed.returncode == 0, listed.stderr
    (run,) = json.loads(listed.stdout)["runs"]
    assert (run["verdict"], run["variant"], run["commit_sha"], run["image"]) == (
        "pass",
        "patched",
        "0123456789abcdef",
        "rocm/img:tag",
    )
    assert run["summaries"][LOGPROB]["mean"] == pytest.approx(0.016975, rel=1e-6)
    off = gate(example, history, "--no-history")
    assert off.returncode == 0 and "history:" not in off.stdout
    again = run_cli("history", "--history", str(history))
    assert again.stdout.startswith("1 run(s), oldest first")


def test_a_slow_drift_inside_the_bands_is_flagged_across_runs(tmp_path: Path) -> None:
    """Six runs, each in band, the logprob gap a little higher each time: a drift."""
    history = tmp_path / "history.sqlite"
    base = [0.0165, 0.0175] * 10
    for index in range(6):
        values = {
            LOGPROB: [v + 0.0002 * index for v in base],
            REWARD: [0.5, 0.5625, 0.625, 0.4375] * 5,
            CLIPFRAC: [0.0] * 20,
        }
        run_dir = write_run(tmp_path / f"run{index}", values)
        result = gate(run_dir, history)
        assert result.returncode == 0, result.stdout + result.stderr
    assert f"DRIFT: {LOGPROB} went up in 5 consecutive runs (0.017 -> 0.0172 -> " in result.stdout
    report_md = (tmp_path / "run5-report" / "report.md").read_text()
    assert f"- DRIFT: {LOGPROB} went up in 5 consecutive runs" in report_md
    plot = tmp_path / "trend.png"
    listed = run_cli(
        "history",
        "--history",
        str(history),
        "--plot",
        str(plot),
        "--export",
        str(tmp_path / "export"),
    )
    assert listed.returncode == 0, listed.stderr
    assert f"DRIFT: {LOGPROB} went up" in listed.stdout
    assert plot.read_bytes().startswith(b"\x89PNG")
    assert len(list((tmp_path / "export").glob("*.jsonl"))) == 7  # 6 records + runs.jsonl


@pytest.mark.parametrize("kind", ["missing", "junk"])
def test_history_bad_store_is_one_line_exit_2(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "h.sqlite"
    if kind == "junk":
        path.write_text("junk " * 100)
    result = run_cli("history", "--history", str(path))
    assert result.returncode == 2
    assert result.stderr.startswith(f"miles-amd: error: --history {path}: ")
    assert len(result.stderr.splitlines()) == 1


def test_gate_with_an_unusable_history_writes_nothing(tmp_path: Path) -> None:
    junk = tmp_path / "h.sqlite"
    junk.write_text("junk " * 100)
    example = tmp_path / "example"
    example.symlink_to(EXAMPLE)
    result = gate(example, junk)
    assert result.returncode == 2
    assert "--no-history" in result.stderr
    assert not (tmp_path / "example-report").exists()


def test_the_append_records_the_verdict_judged_with_the_flags_given(tmp_path: Path) -> None:
    """`train --gate X --require-env` appends the driver's judgment itself: a run without
    env.json fails with --require-env, and the history says fail, not a re-judged pass."""
    from miles_amd.baseline.model import load_baseline
    from miles_amd.cli.history import append_judgment
    from miles_amd.report.gate_run import judge_run_dir

    values = {
        LOGPROB: [0.0165, 0.0175] * 10,
        REWARD: [0.5, 0.5625, 0.625, 0.4375] * 5,
        CLIPFRAC: [0.0] * 20,
    }
    run_dir = write_run(tmp_path / "run", values)
    stock = load_baseline("stock")
    assert judge_run_dir(run_dir, stock, report_dir=tmp_path / "r").verdict.verdict == "pass"
    judgment = judge_run_dir(run_dir, stock, require_env=True)
    assert judgment.exit_code == 1
    history = tmp_path / "h.sqlite"
    lines = append_judgment(history, judgment)
    assert lines[0] == f"history: appended as run 1 to {history}"
    with HistoryStore(history) as store:
        (run,) = store.runs()
    assert (run.verdict, run.baseline, run.variant) == ("fail", "stock", "stock")
    assert run.failed_checks == ("environment.identity",)
    assert "### Drift across runs" in (run_dir / "report" / "report.md").read_text()
