"""The run history: the SQLite store, the drift check, the upstream export, and the CLI
(`miles-amd gate` appending, `miles-amd history` listing) on real run dirs."""

from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from miles_amd.history import export
from miles_amd.history.drift import LIFE_RATE, WINDOW, drifts, mann_kendall, threshold
from miles_amd.history.export import SUITE, export_upstream
from miles_amd.history.store import (
    SCHEMA_VERSION,
    HistoryError,
    HistoryRecord,
    HistoryStore,
    RunRow,
    Summary,
)
from tests.cli_runs import run_cli
from tests.constants import CLIPFRAC, EXAMPLE, KL, LOGPROB, REWARD
from tests.run_dirs import published_values, write_run


def record(
    mean: float, *, verdict: str = "pass", variant: str | None = "patched", aiter: str = "0a1b"
) -> HistoryRecord:
    values = [(i, mean + (0.001 if i % 2 else -0.001)) for i in range(20)]
    failed = () if verdict == "pass" else ("logprob_abs_diff.mean",)
    return HistoryRecord(
        "2026-11-30T12:00:00+00:00", "gpt_oss_20b_lora", "d1g3st", variant, aiter, "patched",
        "img", "c0ffee", "/runs/x", verdict, "r", 20, failed,
        series={LOGPROB: values, REWARD: [(0, 0.5), (1, math.nan)]},
    )  # fmt: skip


def test_the_store_keeps_rows_summaries_and_every_point_under_its_schema_version(
    tmp_path: Path,
) -> None:
    path = tmp_path / "deep" / "history.sqlite"
    written = record(0.018, verdict="fail")
    with HistoryStore(path) as store:
        first = store.append(record(0.017))
        store.append(written)
        runs = store.runs()
        assert [r.run_id for r in runs] == [first, first + 1]
        for f in fields(RunRow):  # a row reads back whole
            assert getattr(runs[1], f.name) == getattr(written, f.name), f.name
        assert runs[0].summaries[LOGPROB].mean == pytest.approx(0.017)
        assert runs[0].summaries[LOGPROB].n == 20
        assert runs[0].summaries[REWARD].n == 1  # the NaN is not summarised
        (kept, nan) = store.series(first)[REWARD]  # but kept as a point
        assert kept == (0, 0.5) and nan[0] == 1 and math.isnan(nan[1])
        assert [r.run_id for r in store.runs(limit=1)] == [first + 1]
        assert store.runs(variant="stock") == []
    db = sqlite3.connect(path)
    assert db.execute("SELECT value FROM meta").fetchone() == (str(SCHEMA_VERSION),)
    columns = [row[1] for row in db.execute("PRAGMA table_info(runs)")]
    assert columns == ["run_id", *(f.name for f in fields(RunRow))]
    summary_columns = [row[1] for row in db.execute("PRAGMA table_info(summaries)")]
    assert summary_columns == ["run_id", "metric", *(f.name for f in fields(Summary))]
    db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.commit()
    with pytest.raises(
        HistoryError, match=f"history schema version 99, this miles-amd writes {SCHEMA_VERSION}"
    ):
        HistoryStore(path)


def test_threshold_keeps_the_false_flags_over_a_100_run_history_at_5_percent() -> None:
    assert threshold(7) == 54 and threshold(4) == 52  # the patched / stock gated metrics
    for metrics in (1, 3, 7, 20):
        cutoff = threshold(metrics)
        assert metrics * LIFE_RATE[cutoff] <= 0.05
        assert cutoff == min(LIFE_RATE) or metrics * LIFE_RATE[cutoff - 2] > 0.05


def test_life_rate_table_agrees_with_a_fresh_simulation() -> None:
    """4,000 healthy 100-run histories, every window of 12 (another seed than the table's)."""
    rng = np.random.default_rng(7)
    pairs = np.triu_indices(WINDOW, 1)
    x = rng.random((4000, 100))
    windows = np.lib.stride_tricks.sliding_window_view(x, WINDOW, axis=1)
    maxima = np.abs(np.sign(windows[..., pairs[1]] - windows[..., pairs[0]]).sum(-1)).max(1)
    for cutoff in (48, 50, 52):
        rate, tabled = float((maxima >= cutoff).mean()), LIFE_RATE[cutoff]
        assert abs(rate - tabled) < 4 * math.sqrt(tabled * (1 - tabled) / 4000) + 1e-9, cutoff
    assert mann_kendall([1, 2, 3, 4]) == 6 and mann_kendall([1, 3, 2]) == 1
    assert mann_kendall(list(x[0, :WINDOW])) == int(
        np.sign(windows[0, 0][pairs[1]] - windows[0, 0][pairs[0]]).sum()
    )


def rising(tmp_path: Path, verdicts: dict[int, str]) -> list:
    """13 runs whose logprob mean rises every run (``verdicts``: index -> a failed gate)."""
    with HistoryStore(tmp_path / "h.sqlite") as store:
        for index in range(13):
            store.append(record(0.0170 + 0.0002 * index, verdict=verdicts.get(index, "pass")))
        return store.runs()


def test_drift_is_a_trend_over_the_last_12_trusted_runs(tmp_path: Path) -> None:
    runs = rising(tmp_path, {3: "fail"})  # a failed run does not feed it: 12 trusted runs
    (found,) = [d for d in drifts(runs, threshold(2)) if d.metric == LOGPROB]
    assert (found.direction, found.s, len(found.means)) == ("up", 66, WINDOW)
    assert found.run_ids == tuple(r.run_id for r in runs if r.trusted)
    assert runs[3].run_id not in found.run_ids
    assert f"{LOGPROB} trends up over the last 12 trusted runs (Mann-Kendall S = +66" in (
        found.sentence()
    )
    with HistoryStore(tmp_path / "h.sqlite") as store:
        assert store.mark(runs[5].run_id, untrusted=True, now="t") is True
        assert store.mark(runs[5].run_id, untrusted=True, now="t") is False  # already
        assert drifts(store.runs(), threshold(2)) == []  # 11 trusted runs: not checked
        assert store.mark(runs[5].run_id, untrusted=False, now="t") is True
        assert drifts(store.runs(), threshold(2)) != []
        with pytest.raises(HistoryError, match="no run 99"):
            store.mark(99, untrusted=True, now="t")


def test_identity_comes_from_the_run_not_the_baseline(tmp_path: Path) -> None:
    from miles_amd.baseline.model import load_baseline
    from miles_amd.evidence.load import load_run
    from miles_amd.history.entry import history_record
    from miles_amd.judge.gate import judge
    from miles_amd.records.plan import PlanRecord

    run_dir = write_run(tmp_path / "run", {LOGPROB: [0.017] * 20, REWARD: [0.5] * 20})
    env = {
        "facts": [
            {"name": "aiter", "status": "ok", "value": "amd-aiter 0.1.5"},
            {"name": "aiter_commit", "status": "ok", "value": "0123456789ab (aiter/_version.py)"},
        ],
        "aiter_variant": "stock",
    }
    (run_dir / "env.json").write_text(json.dumps(env))
    plan = {"recipe": {"lr": 1e-5, "model_dir": "/a", "num_rollout": 20}}
    (run_dir / "plan.json").write_text(json.dumps(plan))
    moved = PlanRecord({"lr": 1e-5, "model_dir": "/elsewhere", "num_rollout": 20})
    patched = load_baseline("patched")
    evidence = load_run(run_dir)
    verdict = judge(evidence, patched, expected_rollouts=20)
    made = history_record(verdict, evidence, patched, environ={})
    assert (made.variant, made.aiter_commit, made.baseline) == ("stock", "0123456789ab", "patched")
    other = PlanRecord({"lr": 2e-5}).identity_digest
    assert made.recipe_digest == moved.identity_digest != other
    (run_dir / "env.json").unlink()
    (run_dir / "plan.json").unlink()
    bare = load_run(run_dir)
    unrecorded = history_record(verdict, bare, patched, environ={})
    assert (unrecorded.variant, unrecorded.aiter_commit, unrecorded.recipe_digest) == (None,) * 3


def test_export_is_what_upstream_capture_would_have_written(tmp_path: Path) -> None:
    with HistoryStore(tmp_path / "h.sqlite") as store:
        store.append(record(0.017))
        store.append(record(0.02, verdict="fail", variant="stock"))
        store.append(record(0.02, variant=None))
        done = export_upstream(store, tmp_path / "out")
    out = tmp_path / "out"
    assert (done.runs, done.without_variant) == (2, 1)
    rows = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert [(r["test_path"], r["backend"], r["suite"], r["trusted"]) for r in rows] == [
        ("tests/e2e/amd/test_gpt_oss_20b_lora_patched.py", "rocm", SUITE, True),
        ("tests/e2e/amd/test_gpt_oss_20b_lora_stock.py", "rocm", SUITE, False),
    ]
    for row in rows:  # the index is outside every record directory, which holds records only
        files = list((out / row["record_dir"]).iterdir())
        assert [f.suffix for f in files] == [".jsonl"]
        lines = [json.loads(line) for line in files[0].read_text().splitlines()]
        assert [line["metric"] for line in lines] == [LOGPROB, REWARD]  # upstream's key order
        assert lines[1]["series"] == [[0, 0.5], [1, "NaN"]]  # capture's marker, not dropped
        assert (out / row["test_path"]).is_file()
    test_file = (out / rows[0]["test_path"]).read_text()
    assert f'register_rocm_ci(est_time=4000, suite="{SUITE}", labels=["amd", "lora"])' in (
        test_file
    )
    assert f'register_ci_gate(metric_key="{LOGPROB}")' in test_file


def test_an_export_replaces_only_an_earlier_export_and_what_a_killed_one_left(
    tmp_path: Path,
) -> None:
    """A runs.jsonl beside other files is not an earlier export: exit 2 naming the file in the
    way, every file kept. A killed export's staging dir (``.out.<pid>-<random>.staging``) is
    removed when its pid has ended, and nothing else. ``--export .`` is made absolute first
    (its parent is not ".")."""
    history = tmp_path / "h.sqlite"
    with HistoryStore(history) as store:
        store.append(record(0.017))
    mine = tmp_path / "mine"
    (mine / "notes").mkdir(parents=True)
    (mine / "runs.jsonl").write_text("{}\n")
    (mine / "notes" / "thesis.tex").write_text("keep")
    done = run_cli("history", "--history", str(history), "--export", str(mine))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("miles-amd: error: --export") and "notes/thesis.tex" in line, line
    assert (mine / "notes" / "thesis.tex").read_text() == "keep"
    assert (mine / "runs.jsonl").read_text() == "{}\n"

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           check=True, capture_output=True, text=True)  # fmt: skip
    leftover = tmp_path / f".out.{int(ended.stdout)}-0a1b2c.staging"
    (leftover / "half").mkdir(parents=True)
    live = tmp_path / f".out.{os.getpid()}-0a1b2c.staging"  # a concurrent export's, in flight
    live.mkdir()
    (tmp_path / ".out.notes").write_text("mine")  # not a staging dir's name: kept
    out = tmp_path / "out"
    for _ in range(2):  # the second replaces the first
        done = run_cli("history", "--history", str(history), "--export", str(out))
        assert done.returncode == 0, done.stderr
    assert (out / "records/run-1/history-1.jsonl").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".out.notes", live.name, "h.sqlite", "mine", "out"]
    )
    here = tmp_path / "here"
    here.mkdir()
    done = run_cli("history", "--history", str(history), "--export", ".", cwd=here)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in here.iterdir()) == ["records", "runs.jsonl", "tests"]


def crafted(history: Path, variant: str) -> None:
    """A stored row's variant replaced with foreign text (written by another tool)."""
    with sqlite3.connect(history) as db:
        db.execute("UPDATE runs SET variant = ? WHERE run_id = 1", (variant,))


@pytest.mark.parametrize(
    "variant",
    [
        "stock/../../../../outside",  # other escapes: the one guard's own test
        'x"""\nimport os; os.system("touch pwned")\n"""',
    ],
)
def test_a_crafted_row_writes_no_code_and_nothing_outside(tmp_path: Path, variant: str) -> None:
    """The row is named and skipped; the export holds only the other runs' files, its test
    file is the registration calls alone, and nothing is written beside or above it."""
    history = tmp_path / "a" / "b" / "h.sqlite"
    history.parent.mkdir(parents=True)
    with HistoryStore(history) as store:
        store.append(record(0.017))
        store.append(record(0.018))
    crafted(history, variant)
    before = {p for p in tmp_path.rglob("*")}
    out = tmp_path / "a" / "b" / "out"
    done = run_cli("history", "--history", str(history), "--export", str(out))
    assert done.returncode == 0, done.stderr
    assert "run 1 of" in done.stderr and "skipped" in done.stderr
    written = {p for p in tmp_path.rglob("*")} - before
    assert all(p == out or out in p.parents for p in written), written
    test_file = out / "tests/e2e/amd/test_gpt_oss_20b_lora_patched.py"
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "records/run-2/history-2.jsonl",
        "runs.jsonl",
        test_file.relative_to(out).as_posix(),
    ]
    import ast

    body = ast.parse(test_file.read_text()).body
    calls = [s.value.func.id for s in body if isinstance(s, ast.Expr)
             and isinstance(s.value, ast.Call) and isinstance(s.value.func, ast.Name)]  # fmt: skip
    assert calls == ["register_rocm_ci", "register_ci_gate", "register_ci_gate"]
    assert len(body) == 1 + 2 + len(calls)  # the docstring, two imports, the calls


def test_an_export_writes_only_through_its_one_guard() -> None:
    from miles_amd.records.plan import PlanRecord

    with pytest.raises(ValueError, match="not one of"):
        export.upstream_test_path("../../x")
    for bad in ("../x", "/etc/x", "records/../../x", ""):
        with pytest.raises(ValueError):
            export.inside(Path("/tmp/export"), bad)
    kept = export.inside(Path("/tmp/export"), "records/run-1/history-1.jsonl")
    assert kept == Path("/tmp/export/records/run-1/history-1.jsonl")
    # plan.json's variant reaches the history (and the export's paths) when env.json has none
    with pytest.raises(ValueError, match="aiter_variant"):
        PlanRecord.from_dict({"recipe": {}, "aiter_variant": "../../../outside"})
    assert PlanRecord.from_dict({"recipe": {}, "aiter_variant": "rccl"}).aiter_variant == "rccl"


def gate(run_dir: Path, history: Path, *extra: str, env=None):
    report = run_dir.parent / f"{run_dir.name}-report"
    return run_cli("gate", "--run-dir", str(run_dir), "--baseline", "patched", "--report-dir",
                   str(report), "--history", str(history), *extra, env=env)  # fmt: skip


def append(history: Path, run_dir: Path, environ: dict[str, str] | None = None):
    """Judge ``run_dir`` against patched and append the verdict as the gate does."""
    from miles_amd.baseline.model import load_baseline
    from miles_amd.evidence.load import load_run
    from miles_amd.history.entry import history_record
    from miles_amd.judge.gate import judge

    patched, evidence = load_baseline("patched"), load_run(run_dir)
    verdict = judge(evidence, patched, expected_rollouts=20)
    with HistoryStore(history) as store:
        store.append(history_record(verdict, evidence, patched, environ=environ or {}))
    return verdict


def test_a_run_appended_again_is_listed_once_with_the_runs_identity(tmp_path: Path) -> None:
    history = tmp_path / "history.sqlite"
    env = {"GITHUB_SHA": "0123456789abcdef", "MILES_AMD_IMAGE": "rocm/img:tag"}
    assert append(history, EXAMPLE, env).verdict == "pass"
    listed = run_cli("history", "--history", str(history), "--format", "json")
    assert listed.returncode == 0, listed.stderr
    (run,) = json.loads(listed.stdout)["runs"]
    # the example has no env.json: its variant is not recorded, not the baseline's
    assert (run["verdict"], run["variant"], run["commit_sha"], run["image"]) == (
        "pass", None, "0123456789abcdef", "rocm/img:tag"
    )  # fmt: skip
    assert run["summaries"][LOGPROB]["mean"] == pytest.approx(0.016975, rel=1e-6)
    # the same run gated twice more counts once; another run (other values) is another key
    for _ in range(2):
        append(history, EXAMPLE)
    again = run_cli("history", "--history", str(history))
    assert again.stdout.startswith("3 run(s), oldest first")
    assert "drift: not checked yet (1 trusted run(s)" in again.stdout, again.stdout
    with HistoryStore(history) as store:
        (key,) = {r.run_key for r in store.runs()}
    assert key is not None and key.startswith("jvvnhop9:")
    append(history, write_run(tmp_path / "other", {LOGPROB: [0.017] * 20, REWARD: [0.5] * 20}))
    with HistoryStore(history) as store:
        assert len({r.run_key for r in store.runs()}) == 2


def test_the_history_keeps_the_rollout_a_red_run_was_decided_at(tmp_path: Path) -> None:
    """A KL doubled from the start is decided at a look (issue 27): the row says which
    rollout and which check, as the verdict does; a pass keeps nulls."""
    from miles_amd.testing.faults import healthy_kl

    history, verdicts = tmp_path / "history.sqlite", []
    for name, factor in (("red", 2.0), ("ok", 1.0)):
        values = published_values()
        kl = healthy_kl(tuple(enumerate(values[LOGPROB])))
        values[KL] = [factor * v for _, v in kl]
        verdicts.append(append(history, write_run(tmp_path / name, values, job_id=name)))
    decision = verdicts[0].decision
    assert decision is not None and decision.check == "train_rollout_kl.mean"
    assert decision.rollout < 20
    with HistoryStore(history, read_only=True) as store:
        red, ok = store.runs()
    assert (red.decided_at_rollout, red.decided_by) == (decision.rollout, decision.check)
    assert (ok.verdict, ok.decided_at_rollout, ok.decided_by) == ("pass", None, None)


def test_a_slow_drift_inside_the_bands_is_flagged_across_runs(tmp_path: Path) -> None:
    """Twelve runs, each in band, the logprob gap a little higher each time: a drift; marking
    one untrusted leaves 11 trusted runs, not enough for the trend test."""
    history = tmp_path / "history.sqlite"
    base = [0.0165, 0.0175] * 10
    for index in range(12):
        values = {
            LOGPROB: [v + 0.0001 * index for v in base],
            REWARD: [0.5, 0.5625, 0.625, 0.4375] * 5,
            CLIPFRAC: [0.0] * 20,
        }
        verdict = append(history, write_run(tmp_path / f"run{index}", values))
        assert verdict.verdict == "pass", verdict.reason
    listed = run_cli("history", "--history", str(history))
    assert f"DRIFT: {LOGPROB} trends up over the last 12 trusted runs" in listed.stdout
    marked = run_cli("history", "mark-untrusted", "3", "--history", str(history))
    assert marked.returncode == 0 and "run 3 marked untrusted" in marked.stdout, marked.stderr
    listed = run_cli("history", "--history", str(history), "--export", str(tmp_path / "export"))
    assert listed.returncode == 0, listed.stderr
    assert "PASS UNTRUSTED" in listed.stdout
    assert "drift: not checked yet (11 trusted run(s)" in listed.stdout
    assert "exported 0 run(s)" in listed.stdout and "12 run(s) without a recorded aiter" in (
        listed.stdout
    )
    back = run_cli("history", "mark-trusted", "3", "--history", str(history))
    assert back.returncode == 0 and "run 3 marked trusted again" in back.stdout
    assert "DRIFT" in run_cli("history", "--history", str(history)).stdout
    missing = run_cli("history", "mark-untrusted", "99", "--history", str(history))
    assert missing.returncode == 2 and "no run 99" in missing.stderr


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (("history",), "--history {h}: "),
        (("history", "mark-untrusted", str(2**64)), str(2**63 - 1)),
        (("history", "mark-trusted", str(2**64)), "'ID'"),
        (("gate",), "--no-history"),
    ],
)
def test_an_unusable_history_or_id_is_one_line_exit_2(tmp_path: Path, args, phrase: str) -> None:
    history = tmp_path / "h.sqlite"
    if args == ("history",):
        assert run_cli(*args, "--history", str(history)).returncode == 2  # missing
    if len(args) > 1:
        with HistoryStore(history) as store:
            store.append(record(0.017))
    else:
        history.write_text("junk " * 100)
    if args == ("gate",):
        example = tmp_path / "example"
        example.symlink_to(EXAMPLE)
        result = gate(example, history)
        assert not (tmp_path / "example-report").exists()
    else:
        result = run_cli(*args, "--history", str(history))
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("miles-amd: error: ") and phrase.format(h=history) in line, line


def test_the_append_records_the_verdict_judged_with_the_flags_given(tmp_path: Path) -> None:
    """`train --gate X --require-env` appends the gate's judgment itself: a run without
    env.json fails with --require-env, and the history says fail, not a re-judged pass."""
    from miles_amd.app.gate import gate_run_dir
    from miles_amd.baseline.model import load_baseline
    from miles_amd.evidence.load import load_run
    from miles_amd.judge.gate import judge

    values = {
        LOGPROB: [0.0165, 0.0175] * 10,
        REWARD: [0.5, 0.5625, 0.625, 0.4375] * 5,
        CLIPFRAC: [0.0] * 20,
    }
    run_dir = write_run(tmp_path / "run", values)
    stock = load_baseline("stock")
    assert judge(load_run(run_dir), stock).verdict == "pass"
    history = tmp_path / "h.sqlite"
    judgment = gate_run_dir(run_dir, stock, require_env=True, history=history)
    assert judgment.verdict.exit_code == 1
    lines = judgment.history_lines
    assert lines[0] == f"history: appended as run 1 to {history}"
    with HistoryStore(history) as store:
        (run,) = store.runs()
    assert (run.verdict, run.baseline, run.variant) == ("fail", "stock", None)  # no env.json
    # no env.json, no SGLang [AR] line, no aiter fingerprint, no deep probe: all unproven on the
    # hardware path
    assert run.failed_checks == (
        *("environment.identity", "allreduce.path", "allreduce.canary", "allreduce.fix"),
        "model.lora_experts",
    )
    assert "### Drift across runs" in (run_dir / "report" / "report.md").read_text()


def test_the_listing_has_aligned_columns_and_each_identitys_drift_lines(tmp_path: Path) -> None:
    history = tmp_path / "history.sqlite"
    with HistoryStore(history) as store:
        store.append(record(0.017))
        store.append(record(0.018))
        untrusted = store.append(record(0.0175))
        store.mark(untrusted, untrusted=True, now="t")
        store.append(record(0.019, verdict="fail"))
    listed = run_cli("history", "--history", str(history))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    header = lines[1]
    for column in ("id", "gated at", "verdict", "baseline", "identity", "run (job:evidence)"):
        assert column in header, header
    rows = lines[2:6]
    assert "PASS UNTRUSTED" in rows[2] and "FAIL" in rows[3]
    for column in ("baseline", "identity", "commit"):
        at = header.index(column)
        assert all(row[at - 1] == " " and row[at] != " " for row in rows), (column, rows)
    assert all(row[header.index("baseline") :].startswith("patched") for row in rows)
    assert all("patched@0a1b d1g3st" in row for row in rows)
    assert "?" not in "".join(rows)
    # each identity gets its own threshold and trusted count
    with HistoryStore(history) as store:
        store.append(record(0.017, variant="stock", aiter="9f8e"))
        store.append(record(0.018, variant="stock", aiter="9f8e"))
    listed = run_cli("history", "--history", str(history), "--format", "json")
    groups = json.loads(listed.stdout)["drift"]["identities"]
    assert [(g["identity"], g["trusted_runs"]) for g in groups] == [
        ("patched@0a1b d1g3st", 2), ("stock@9f8e d1g3st", 2)
    ]  # fmt: skip
    assert all(g["threshold"] == threshold(2) for g in groups)
    text = run_cli("history", "--history", str(history)).stdout
    assert "[patched@0a1b d1g3st] drift: not checked yet (2 trusted run(s)" in text
    assert "[stock@9f8e d1g3st] drift: not checked yet (2 trusted run(s)" in text


def test_a_stored_negative_sd_is_a_row_named_and_skipped(tmp_path: Path) -> None:
    """Another tool's sd < 0 (once a ValueError out of the error bars) is named where read."""
    history = tmp_path / "h.sqlite"
    with HistoryStore(history) as store:
        for mean in (0.017, 0.018):
            store.append(record(mean))
    with sqlite3.connect(history) as db:
        db.execute("UPDATE summaries SET sd = -1 WHERE run_id = 1")
    with HistoryStore(history) as store:
        read = store.read_runs()
    assert [r.run_id for r in read.runs] == [2]
    (line,) = read.skipped
    assert line.startswith(f"history: run 1 of {history} skipped") and "sd >= 0" in line


@pytest.mark.parametrize("step", [1e30, "abc", None])
def test_a_stored_point_that_is_no_integer_step_is_not_exported(tmp_path: Path, step) -> None:
    """A step stored as a float or text was written verbatim into the upstream record."""
    history = tmp_path / "h.sqlite"
    with HistoryStore(history) as store:
        store.append(record(0.017))
    with sqlite3.connect(history) as db:
        if step is None:
            db.execute("UPDATE metric_values SET value = 'x' WHERE rowid = 1")
        else:
            db.execute("UPDATE metric_values SET step = ? WHERE rowid = 1", (step,))
    out = tmp_path / "out"
    done = run_cli("history", "--history", str(history), "--export", str(out))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"miles-amd: error: --history {history}: --export cannot use"), line
    assert not out.exists()


def test_a_run_dir_whose_name_is_not_utf8_enters_the_history(tmp_path: Path) -> None:
    """SQLite cannot store the name's surrogate escapes: the append failed ("NOT appended");
    the name is stored with its undecodable bytes as \\xNN."""
    odd = Path(os.fsdecode(bytes(tmp_path) + b"/run-\xff"))
    shutil.copytree(EXAMPLE, odd, ignore=shutil.ignore_patterns("report"))
    append(tmp_path / "h.sqlite", odd)
    with HistoryStore(tmp_path / "h.sqlite") as store:
        (run,) = store.runs()
    assert run.run_dir.endswith("/run-\\xff")
