"""Issue 17's attack classes on untrusted input, one case each, asserting the named outcome.

Every case goes through the real reader: the gate in-process (typer's CliRunner on
``miles-amd gate``, the embedded example copied and then altered), the history store on a
real SQLite file, the recipe's extra-args check, the pull-back's frame parser and node reader
on real files. Outcomes are the exit code (0 pass, 1 fail, 2 unusable input), the one error
line, the problem or check the report names, and what was (not) written.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miles_amd.cli.main import app
from miles_amd.evidence.load import load_run
from miles_amd.history.store import HistoryRecord, HistoryStore
from miles_amd.judge.gate import judge
from miles_amd.node import pullback_node
from miles_amd.recipe.settings import Recipe, RecipeError
from miles_amd.rules.model import Baseline
from miles_amd.run.pullback import END, FRAME, PullError, apply_frame, parse_frames
from tests.constants import EXAMPLE, REPO

pytestmark = pytest.mark.unit

PATCHED = REPO / "baselines" / "gpt_oss_20b_lora" / "8gpu" / "mi355x" / "patched.json"
SECRET = "s3cr3t-value"


def gate(run_dir: Path, baseline: Path | str = "patched"):
    args = ["gate", "--run-dir", str(run_dir), "--baseline", str(baseline), "--no-history"]
    return CliRunner().invoke(app, args)


def example(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(EXAMPLE, run_dir, ignore=shutil.ignore_patterns("report", "README.md"))
    return run_dir


def report(run_dir: Path) -> dict:
    return json.loads((run_dir / "report" / "report.json").read_text())


def problems(run_dir: Path) -> str:
    return json.dumps(report(run_dir)["evidence"]["problems"])


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.output
    return lines[0]


# ---------------------------------------------------------------------------- baselines


def baseline_with(tmp_path: Path, old: str, new: str) -> Path:
    text = PATCHED.read_text()
    assert old in text
    path = tmp_path / "edited.json"
    path.write_text(text.replace(old, new, 1))
    return path


BASELINE_CASES = {
    "duplicate key replacing a reviewed threshold": (
        '"threshold": ',
        '"threshold": 99, "threshold": ',
        "duplicate key 'threshold'",
    ),
    "nesting beyond the bound": (
        '"rules": [',
        '"deep": ' + "[" * 40 + "]" * 40 + ', "rules": [',
        "nested deeper",
    ),
    "integer literal beyond 64 bits": (
        '"rules": [',
        '"big": ' + "9" * 5000 + ', "rules": [',
        "does not fit 64 bits",
    ),
    "non-finite threshold": ('"threshold": ', '"threshold": NaN, "x": ', "non-finite number NaN"),
    "float literal beyond the float range": (
        '"threshold": ',
        '"threshold": 1e999, "x": ',
        "non-finite number 1e999",
    ),
}


@pytest.mark.parametrize("case", BASELINE_CASES)
def test_a_hostile_baseline_is_one_line_exit_2_naming_file_and_path(
    tmp_path: Path, case: str
) -> None:
    old, new, named = BASELINE_CASES[case]
    bad = baseline_with(tmp_path, old, new)
    run_dir = example(tmp_path)
    result = gate(run_dir, bad)
    assert result.exit_code == 2
    line = one_error_line(result)
    assert str(bad) in line and named in line and "$" in line
    assert not (run_dir / "report").exists()


# ---------------------------------------------------------------------------- run dir JSON


def write_record(run_dir: Path, line: str) -> None:
    (run_dir / "ci_history" / "9-x.jsonl").write_text(line + "\n")


RUN_DIR_CASES: dict[str, tuple[Callable[[Path], object], str]] = {
    "duplicate key hiding a NaN in a CI-history record": (
        lambda d: write_record(
            d, '{"metric": "rollout/raw_reward", "series": [[0, NaN]], "series": [[0, 0.5]]}'
        ),
        "duplicate key 'series'",
    ),
    "CI-history step beyond 64 bits": (
        lambda d: write_record(d, '{"metric": "m", "series": [[' + "9" * 400 + ", 1.0]]}"),
        "does not fit 64 bits",
    ),
    "deeply nested CI-history record": (
        lambda d: write_record(d, "[" * 100_000 + "]" * 100_000),
        "nested deeper",
    ),
    "duplicate key in job.json": (
        lambda d: (d / "job.json").write_text(
            '{"job_id": "j", "status": "FAILED", "status": "SUCCEEDED"}'
        ),
        "duplicate key 'status'",
    ),
    "huge integer in job.json": (
        lambda d: (d / "job.json").write_text(
            '{"job_id": "j", "status": "SUCCEEDED", "driver_exit_code": ' + "1" * 30 + "}"
        ),
        "$.driver_exit_code: integer",
    ),
}


@pytest.mark.parametrize("case", RUN_DIR_CASES)
def test_hostile_run_dir_json_fails_the_gate_naming_the_path(tmp_path: Path, case: str) -> None:
    alter, named = RUN_DIR_CASES[case]
    run_dir = example(tmp_path)
    alter(run_dir)
    result = gate(run_dir)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert named in problems(run_dir)


def test_finite_values_near_the_float_limit_are_judged_not_crashed(tmp_path: Path) -> None:
    run_dir = example(tmp_path)
    series = [[step, 1.7e308 if step % 2 else -1.7e308] for step in range(20)]
    write_record(run_dir, json.dumps({"metric": "rollout/raw_reward", "series": series}))
    result = gate(run_dir)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert report(run_dir)["verdict"] == "fail"
    assert (run_dir / "report" / "metrics.png").stat().st_size > 0


# ---------------------------------------------------------------------------- job.log


def test_a_fatal_line_after_megabytes_of_carriage_returns_is_seen(tmp_path: Path) -> None:
    run_dir = example(tmp_path)
    progress = "Loading safetensors: 10%|#    |\r" * 60_000  # ~2 MiB on one line
    with (run_dir / "job.log").open("a") as log:
        log.write(progress + "Fatal Python error: Segmentation fault\r more progress\n")
    result = gate(run_dir)
    assert result.exit_code == 1
    hits = {hit["name"]: hit for hit in report(run_dir)["sentinels"]}
    assert hits["python_fatal_error"]["first_text"].startswith("Fatal Python error")


# ---------------------------------------------------------------------------- env.json


def env_json(run_dir: Path, facts: list[dict], **top: object) -> None:
    doc: dict[str, object] = {"facts": facts, "ok": all(f["status"] == "ok" for f in facts)}
    doc.update(top)
    (run_dir / "env.json").write_text(json.dumps(doc))


def fact(name: str, value: str, status: str = "ok") -> dict:
    return {"name": name, "status": status, "value": value, "message": ""}


GOOD_FACTS = [fact("gpus", "8x gfx950 (torch)"), fact("rocm", "7.2.0 (x)")]
ENV_CASES: dict[str, tuple[list[dict], dict[str, object], str]] = {
    "a fact recorded twice": (
        [*GOOD_FACTS, fact("gpus", "4x gfx942 (torch)")],
        {},
        "recorded twice",
    ),
    "a failed fact": ([*GOOD_FACTS, fact("disk", "1 GiB", "wrong")], {}, "'disk' is wrong"),
    "ok contradicting the facts": (GOOD_FACTS, {"ok": False}, '"ok" is False'),
    "variant contradicting its fact": (
        [*GOOD_FACTS, fact("aiter_variant", "stock")],
        {"aiter_variant": "patched"},
        "aiter_variant fact says",
    ),
}


@pytest.mark.parametrize("case", ENV_CASES)
def test_contradictory_or_failed_env_facts_fail_the_environment_check(
    tmp_path: Path, case: str, patched: Baseline
) -> None:
    """Judged as the gate judges (the CLI's exit code for a failing identity is
    ``test_gate_environment``'s)."""
    facts, top, named = ENV_CASES[case]
    run_dir = example(tmp_path)
    env_json(run_dir, facts, **top)
    verdict = judge(load_run(run_dir), patched)
    (identity,) = [c for c in verdict.checks if c.name == "environment.identity"]
    assert verdict.verdict == "fail"
    assert identity.status == "fail" and named in identity.detail


# ---------------------------------------------------------------------------- sinks


def test_markup_and_escape_sequences_from_the_run_dir_are_inert(tmp_path: Path) -> None:
    run_dir = example(tmp_path)
    payload = "<img src=x onerror=alert(1)> [x](http://evil) `code` | \x1b]0;owned\x07\x1b[2J"
    job = {"job_id": "j", "status": "FAILED", "message": payload}
    (run_dir / "job.json").write_text(json.dumps(job))
    result = gate(run_dir)
    assert result.exit_code == 1
    assert "\x1b" not in result.output and "\x07" not in result.output
    markdown = (run_dir / "report" / "report.md").read_text()
    assert "<img" not in markdown and "&lt;img" in markdown
    assert "](http://evil)" not in markdown.replace("\\]", "")  # no link: brackets escaped
    assert "\x1b" not in markdown


def test_a_report_link_in_the_run_dir_is_refused_and_nothing_is_written_outside(
    tmp_path: Path,
) -> None:
    run_dir = example(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (run_dir / "report").symlink_to(outside)
    result = gate(run_dir)
    assert result.exit_code == 2
    assert "symbolic link" in one_error_line(result)
    assert list(outside.iterdir()) == []


# ---------------------------------------------------------------------------- extra args


@pytest.mark.parametrize(
    "extra",
    [
        f"--wandb-key {SECRET}",
        f"--wandb-key={SECRET}",
        f"--wandb_key {SECRET}",
        f"--WANDB-KEY={SECRET}",
        f"--wandb-k {SECRET}",
        f"--wandb-ke={SECRET}",
        f"--hf_token={SECRET}",
        f"--sglang-api-k {SECRET}",
    ],
)
def test_credential_flags_are_refused_in_every_argparse_spelling(extra: str) -> None:
    with pytest.raises(RecipeError) as error:
        Recipe(extra_args=extra)
    assert "credential" in str(error.value) and SECRET not in str(error.value)


def test_flags_that_only_look_alike_stay_allowed() -> None:
    Recipe(extra_args="--wandb-project p --fim-pad-token x --rollout-stop-token-ids 1")


# ---------------------------------------------------------------------------- history


def record(run_dir: str) -> HistoryRecord:
    return HistoryRecord(
        "2026-01-01T00:00:00+00:00", "gpt_oss_20b_lora", None, "patched", None, "patched",
        None, None, run_dir, "pass", "ok", 20, (), {"rollout/raw_reward": [(0, 0.5), (1, 1e308)]},
    )  # fmt: skip


@pytest.mark.parametrize(
    "corruption",
    [
        "UPDATE runs SET failed_checks = '[\"a\", ' WHERE run_id = 2",
        "UPDATE runs SET rollouts = 'many' WHERE run_id = 2",
        "UPDATE summaries SET mean = 'x' WHERE run_id = 2",
    ],
)
def test_a_corrupt_history_row_is_named_and_skipped(tmp_path: Path, corruption: str) -> None:
    path = tmp_path / "history.sqlite"
    with HistoryStore(path) as store:
        for name in ("a", "b", "c"):
            store.append(record(name))
    with sqlite3.connect(path) as db:
        db.execute(corruption)
    result = CliRunner().invoke(app, ["history", "--history", str(path)])
    assert result.exit_code == 0, result.output
    assert "run 2 of" in result.stderr and "skipped" in result.stderr
    listed = [
        line.split()[0] for line in result.stdout.splitlines()[1:] if line.strip()[:1].isdigit()
    ]
    assert listed == ["1", "3"]


def test_a_gate_whose_history_cannot_take_the_verdict_keeps_the_verdict(tmp_path: Path) -> None:
    run_dir = example(tmp_path)
    history = tmp_path / "history.sqlite"
    HistoryStore(history).close()
    with sqlite3.connect(history) as db:
        db.execute("DROP TABLE summaries")
    args = ["gate", "--run-dir", str(run_dir), "--baseline", "patched", "--history", str(history)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output  # the example passes, whatever the history
    assert "NOT appended" in result.output and "Traceback" not in result.output


# ---------------------------------------------------------------------------- pull-back


def frame_line(path: str, content: bytes, **override: object) -> str:
    raw = {
        "path": path,
        "size": len(content),
        "sha256": hashlib.sha256(content).hexdigest(),
        "offset": 0,
        "data": base64.b64encode(content).decode(),
        **override,
    }
    return FRAME + json.dumps(raw)


GOOD = frame_line("ci_history/1.jsonl", b"{}\n")
FRAME_CASES = {
    "not JSON": FRAME + "{cut",
    "a JSON list": FRAME + "[1]",
    "a missing field": FRAME + json.dumps({"path": "ci_history/1.jsonl"}),
    "a string size": frame_line("ci_history/1.jsonl", b"x", size="1"),
    "bad base64": frame_line("ci_history/1.jsonl", b"x", data="!!"),
    "a duplicate key": FRAME + '{"path": "ci_history/a", "path": "tensorboard/b"}',
    "over the gate's cap": frame_line("ci_history/1.jsonl", b"x", size=1 << 40),
    "a path outside": frame_line("../etc/passwd", b"x"),
    "an offset past the size": frame_line("ci_history/1.jsonl", b"x", offset=5),
    "an end marker that is no object": GOOD + "\n" + END + "7",
}


@pytest.mark.parametrize("case", FRAME_CASES)
def test_a_malformed_frame_is_the_pull_backs_own_error(case: str) -> None:
    log = FRAME_CASES[case]
    if END not in log:
        log += "\n" + END + '{"files": 1}'
    with pytest.raises(PullError):
        parse_frames(log)


def test_a_cut_transfer_is_the_pull_backs_own_error() -> None:
    with pytest.raises(PullError, match="transfer cut"):
        parse_frames(GOOD)


def test_a_local_link_is_not_followed_when_a_frame_is_applied(tmp_path: Path) -> None:
    (tmp_path / "ci_history").mkdir()
    outside = tmp_path / "outside.jsonl"
    outside.write_text("secret")
    (tmp_path / "ci_history" / "1.jsonl").symlink_to(outside)
    (parsed,) = parse_frames(GOOD + "\n" + END + '{"files": 1}')
    with pytest.raises(PullError, match="symbolic link"):
        apply_frame(tmp_path, parsed)
    assert outside.read_text() == "secret"


def test_the_node_side_follows_no_link_and_caps_sizes(tmp_path: Path, monkeypatch) -> None:
    root = tmp_path / "node"
    (root / "ci_history").mkdir(parents=True)
    (root / "ci_history" / "1.jsonl").write_text("{}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "tensorboard").symlink_to(elsewhere)
    assert "symbolic link" in pullback_node.read_dir(str(root), ["tensorboard"], {})["error"]
    (root / "ci_history" / "evil").symlink_to(elsewhere)
    assert "symbolic link" in pullback_node.read_dir(str(root), ["ci_history"], {})["error"]
    (root / "ci_history" / "evil").unlink()
    assert len(pullback_node.read_dir(str(root), ["ci_history"], {})["files"]) == 1
    monkeypatch.setitem(pullback_node.CAPS, "ci_history", 2)
    assert "over the 2-byte cap" in pullback_node.read_dir(str(root), ["ci_history"], {})["error"]


def test_the_node_side_caps_are_the_gates() -> None:
    from miles_amd.evidence.safe_open import EVENT_FILE, RECORD_FILE

    assert {"tensorboard": EVENT_FILE.cap, "ci_history": RECORD_FILE.cap} == pullback_node.CAPS
