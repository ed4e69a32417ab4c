"""`miles-amd gate` end to end: real run directories, real readers, exit codes and report files.

Run dirs are the embedded example (copied) or written by ``miles_amd.testing.miles_writer`` (the
writer of miles' formats); the command runs through ``tests.cli_runs.run_cli`` (the console
script's own entry, in-process) for the exit codes a CI step sees, and through typer's
CliRunner for the rest; a fresh interpreter only for what the command module imports.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from miles_amd.cli.main import app
from tests.cli_runs import CliRun, flat, run_cli
from tests.constants import (
    CLIPFRAC,
    EXAMPLE,
    FATAL_LINE,
    KNOWN_LINE,
    LOGPROB,
    REWARD,
    SHIPPED,
)
from tests.run_dirs import published_values, write_run


def gate_main(*args: str) -> CliRun:
    return run_cli("gate", *args)


def gate(*args: str):
    return CliRunner().invoke(app, ["gate", *args])


def copy_example(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(EXAMPLE, run_dir, ignore=shutil.ignore_patterns("report"))
    return run_dir


def report_of(directory: Path) -> dict:
    return json.loads((directory / "report.json").read_text())


# ---------------------------------------------------------------------------- exit 0


def test_the_embedded_example_passes_patched(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = gate_main("--run-dir", str(EXAMPLE), "--baseline", "patched", "--report-dir", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("miles-amd gate: PASS - run ")
    assert result.stderr == ""
    report = report_of(out)
    assert report["verdict"] == "pass"
    statuses = {row["name"]: row["status"] for row in report["checks"]}
    for required in ("logprob_abs_diff.spikes", "raw_reward.paired", "pg_clipfrac.near_zero"):
        assert statuses[required] == "pass"
    assert statuses["train_rollout_kl.mean"] == "not_measured"
    assert (out / "report.md").read_text().startswith("**miles-amd gate: PASS**")
    assert (out / "metrics.png").read_bytes().startswith(b"\x89PNG")
    # every gated metric came from the preferred source, and the others agree with it
    sources = report["evidence"]["sources"]
    assert {sources[m] for m in (LOGPROB, REWARD, CLIPFRAC)} == {"tensorboard"}
    assert report["evidence"]["problems"] == [] and report["evidence"]["conflicts"] == []


def test_the_example_also_passes_stock(tmp_path: Path) -> None:
    result = gate("--run-dir", str(EXAMPLE), "--baseline", "stock", "--report-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert report_of(tmp_path)["baseline"]["run_id"] == "4it2x89i"


def test_default_report_dir_is_inside_the_run_dir(tmp_path: Path) -> None:
    run_dir = copy_example(tmp_path)
    result = gate("--run-dir", str(run_dir), "--baseline", "patched", "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["verdict"] == "pass"
    assert sorted(p.name for p in (run_dir / "report").iterdir()) == [
        "metrics.png",
        "report.json",
        "report.md",
    ]


def test_markdown_format_prints_the_table(tmp_path: Path) -> None:
    result = gate(
        "--run-dir", str(EXAMPLE), "--baseline", "patched", "--report-dir", str(tmp_path),
        "--format", "markdown",
    )  # fmt: skip
    assert result.exit_code == 0
    assert result.stdout == (tmp_path / "report.md").read_text()


def test_a_three_rollout_smoke_with_expected_rollouts(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "smoke", published_values(3))
    result = gate("--run-dir", str(run_dir), "--baseline", "patched", "--expected-rollouts", "3")
    assert result.exit_code == 0, result.output
    assert report_of(run_dir / "report")["expected_rollouts"] == 3
    result = gate("--run-dir", str(run_dir), "--baseline", "patched")
    assert result.exit_code == 1
    assert "logprob_abs_diff.steps" in result.stdout


def test_a_known_sentinel_is_reported_but_passes(tmp_path: Path) -> None:
    run_dir = copy_example(tmp_path)
    with open(run_dir / "job.log", "a", encoding="utf-8") as log:
        log.write(KNOWN_LINE * 8)
    result = gate("--run-dir", str(run_dir), "--baseline", "patched")
    assert result.exit_code == 0, result.output
    hits = report_of(run_dir / "report")["sentinels"]
    assert [(h["name"], h["severity"], h["count"], h["first_line"]) for h in hits] == [
        ("megatron_moe_router_not_fp32", "known", 8, 61)
    ]
    assert (
        "megatron_moe_router_not_fp32 | known | 8 | 61 |"
        in (run_dir / "report" / "report.md").read_text()
    )


# ---------------------------------------------------------------------------- exit 1


def test_failed_job_fails(tmp_path: Path) -> None:
    run_dir = copy_example(tmp_path)
    job = json.loads((run_dir / "job.json").read_text())
    job["status"] = "FAILED"
    (run_dir / "job.json").write_text(json.dumps(job))
    result = gate_main("--run-dir", str(run_dir), "--baseline", "patched")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.startswith("miles-amd gate: FAIL")
    failed = [r for r in report_of(run_dir / "report")["checks"] if r["status"] == "fail"]
    assert [r["name"] for r in failed] == ["job.status"]


def test_a_spike_written_by_miles_writers_fails(tmp_path: Path) -> None:
    values = published_values()
    values[LOGPROB][13] = 0.37
    run_dir = write_run(tmp_path / "spiky", values)
    result = gate("--run-dir", str(run_dir), "--baseline", "stock", "--format", "json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    spikes = next(r for r in report["checks"] if r["name"] == "logprob_abs_diff.spikes")
    assert spikes["status"] == "fail" and spikes["observed"] == 1
    assert "rollout 13 (0.37)" in spikes["detail"]
    md = (run_dir / "report" / "report.md").read_text()
    assert md.index("| FAIL | logprob_abs_diff.spikes") < md.index("| pass |")


def test_a_fatal_sentinel_fails_with_its_line(tmp_path: Path) -> None:
    run_dir = copy_example(tmp_path)
    with open(run_dir / "job.log", "a", encoding="utf-8") as log:
        log.write(FATAL_LINE)
    result = gate("--run-dir", str(run_dir), "--baseline", "patched")
    assert result.exit_code == 1
    rows = {r["name"]: r for r in report_of(run_dir / "report")["checks"]}
    sentinel = rows["sentinel.hip_memory_access_fault"]
    assert sentinel["status"] == "fail"
    assert (
        "1x in job.log, first at line 61: (MegatronTrainRayActor pid=4243) Memory"
        in (sentinel["detail"])
    )


def test_a_corrupt_source_fails_with_a_named_check(tmp_path: Path) -> None:
    run_dir = copy_example(tmp_path)
    record = max((run_dir / "ci_history").iterdir(), key=lambda p: p.stat().st_size)
    record.write_text(record.read_text() + '{"metric": "train/grad_norm", "series": [[0, \n')
    result = gate("--run-dir", str(run_dir), "--baseline", "patched")
    assert result.exit_code == 1
    rows = {r["name"]: r for r in report_of(run_dir / "report")["checks"]}
    assert rows["evidence.readable"]["status"] == "fail"
    assert record.name in rows["evidence.readable"]["detail"]
    assert rows["logprob_abs_diff.mean"]["status"] == "pass"  # the rest is still judged


def test_a_truncated_event_file_fails(tmp_path: Path) -> None:
    run_dir = copy_example(tmp_path)
    events = max((run_dir / "tensorboard").iterdir(), key=lambda p: p.stat().st_size)
    events.write_bytes(events.read_bytes()[:-7])
    result = gate("--run-dir", str(run_dir), "--baseline", "patched")
    assert result.exit_code == 1
    readable = next(
        r for r in report_of(run_dir / "report")["checks"] if r["name"] == "evidence.readable"
    )
    assert readable["status"] == "fail" and events.name in readable["detail"]


def test_disagreeing_sources_fail(tmp_path: Path) -> None:
    run_dir = copy_example(tmp_path)
    log = (run_dir / "job.log").read_text()
    (run_dir / "job.log").write_text(
        log.replace("'train/train_rollout_logprob_abs_diff': 0.0208,", "'" + LOGPROB + "': 0.0999,")
    )
    result = gate("--run-dir", str(run_dir), "--baseline", "patched")
    assert result.exit_code == 1
    rows = {r["name"]: r for r in report_of(run_dir / "report")["checks"]}
    assert rows["evidence.consistent"]["status"] == "fail"
    assert f"{LOGPROB} at step 0" in rows["evidence.consistent"]["detail"]


# ---------------------------------------------------------------------------- exit 2


@pytest.mark.parametrize("flag", ["--num-rollouts", "--expected-rollouts"])
def test_an_absurd_rollout_count_is_refused_where_it_is_parsed(tmp_path: Path, flag: str) -> None:
    """10**12 rollouts exhausted memory building the bands; past the bound is one line naming
    the flag and the limit, exit 2, nothing written."""
    done = run_cli(
        "gate", "--example", "--baseline", "patched", "--no-history",
        "--report-dir", str(tmp_path / "report"), flag, "100001",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert f"'{flag}'" in line and "100000" in line, line
    assert not (tmp_path / "report").exists()


def test_missing_run_dir_is_unusable_input(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = gate_main("--run-dir", str(missing), "--baseline", "patched")
    assert result.returncode == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line == (
        f"miles-amd: error: --run-dir {missing}: no such directory; fix: point it at a run "
        "directory"
    )
    assert not missing.exists()


def test_a_dir_that_is_no_run_dir_is_refused_and_nothing_written(tmp_path: Path) -> None:
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    result = gate_main("--run-dir", str(run_dir), "--baseline", "patched")
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"miles-amd: error: --run-dir {run_dir}: not a run directory")
    assert list(run_dir.iterdir()) == []


def test_empty_run_dir_is_an_error_with_a_report(tmp_path: Path) -> None:
    """A run dir (its evidence dirs are there) with nothing readable: the report says why."""
    run_dir = tmp_path / "empty"
    (run_dir / "tensorboard").mkdir(parents=True)
    result = gate_main("--run-dir", str(run_dir), "--baseline", "patched")
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"miles-amd: error: --run-dir {run_dir}: nothing readable in")
    report = report_of(run_dir / "report")
    assert report["verdict"] == "error" and report["exit_code"] == 2
    assert "no event files" in report["reason"]


def test_a_run_dir_of_only_corrupt_evidence_is_an_error(tmp_path: Path) -> None:
    run_dir = tmp_path / "corrupt"
    (run_dir / "tensorboard").mkdir(parents=True)
    (run_dir / "tensorboard" / "events.out.tfevents.1.host.1.0").write_bytes(b"\x00" * 5)
    result = gate("--run-dir", str(run_dir), "--baseline", "patched")
    assert result.exit_code == 2
    report = report_of(run_dir / "report")
    assert report["verdict"] == "error"
    assert report["evidence"]["problems"][0]["source"] == "tensorboard"


def test_malformed_baseline_is_unusable_input_and_writes_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    raw = json.loads((SHIPPED / "patched.json").read_text())
    raw["rules"][4]["threshold"] = "high"
    bad.write_text(json.dumps(raw))
    out = tmp_path / "report"
    result = gate_main("--run-dir", str(EXAMPLE), "--baseline", str(bad), "--report-dir", str(out))
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"miles-amd: error: --baseline {bad}: $.rules[4].threshold: ")
    assert "; fix: " in line
    assert not out.exists()


def test_unknown_baseline_is_unusable_input(tmp_path: Path) -> None:
    result = gate("--run-dir", str(EXAMPLE), "--baseline", "nightly", "--report-dir", str(tmp_path))
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("miles-amd: error: --baseline nightly: no such baseline file; ")
    assert "fix: use --baseline stock, --baseline patched or the path" in line
    assert list(tmp_path.iterdir()) == []


def test_baseline_with_invalid_json_is_unusable_input(tmp_path: Path) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text("{")
    result = gate("--run-dir", str(EXAMPLE), "--baseline", str(bad))
    assert result.exit_code == 2
    assert f"{bad}: line 1 column 2: invalid JSON" in result.stderr


def test_unwritable_report_dir_is_unusable_input(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = gate("--run-dir", str(EXAMPLE), "--baseline", "patched", "--report-dir", str(blocker))
    assert result.exit_code == 2
    assert f"--report-dir {blocker}: cannot write the report" in result.stderr
    assert blocker.read_text() == "not a directory"


@pytest.mark.parametrize(
    "args",
    [
        ["--run-dir", str(EXAMPLE)],  # no --baseline
        ["--run-dir", str(EXAMPLE), "--baseline", "patched", "--expected-rollouts", "0"],
        ["--run-dir", str(EXAMPLE), "--baseline", "patched", "--format", "html"],
    ],
)
def test_bad_flags_exit_2(args: list[str]) -> None:
    result = gate(*args)
    assert result.exit_code == 2


def test_the_command_module_imports_only_typer_and_stdlib() -> None:
    code = (
        "import sys, typer; before = set(sys.modules);"
        "import miles_amd.cli.gate as g; app = typer.Typer(); g.register(app);"
        "new = set(sys.modules) - before;"
        "heavy = {'matplotlib', 'tensorboard', 'jsonschema', 'ray', 'torch'};"
        "ours = {'miles_amd.judge.gate', 'miles_amd.app.gate', 'miles_amd.baseline.model',"
        " 'miles_amd.evidence.load'};"
        "print(sorted(m for m in new if m.split('.')[0] in heavy or m in ours))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


# ---------------------------------------------------------------------------- --example


def test_example_reports_to_a_named_dir_and_leaves_the_example_alone(tmp_path: Path) -> None:
    before = sorted(p.relative_to(EXAMPLE) for p in EXAMPLE.rglob("*"))
    out = tmp_path / "example-report"
    result = gate_main("--example", "--baseline", "patched", "--report-dir", str(out))
    assert result.returncode == 0, result.stderr
    assert "against baseline patched (jvvnhop9)" in flat(result.stdout)
    assert result.stdout.splitlines()[-1].startswith(f"report written to {out / 'report.md'}")
    assert report_of(out)["verdict"] == "pass"
    assert sorted(p.relative_to(EXAMPLE) for p in EXAMPLE.rglob("*")) == before


def test_example_without_a_report_dir_reports_to_a_new_temporary_dir() -> None:
    result = run_cli("gate", "--example", "--baseline", "patched")
    assert result.returncode == 0, result.stderr
    last = result.stdout.splitlines()[-1]
    made = Path(last.removeprefix("report written to ").split(" (also")[0]).parent
    try:
        assert made.parent == Path(tempfile.gettempdir())
        assert made.name.startswith("miles-amd-example-")
        assert report_of(made)["verdict"] == "pass"
    finally:
        shutil.rmtree(made, ignore_errors=True)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--baseline", "patched"], "--run-dir and --example: neither given; fix: "),
        (
            ["--example", "--run-dir", str(EXAMPLE), "--baseline", "patched"],
            "--run-dir and --example: give one, not both; fix: ",
        ),
    ],
)
def test_example_or_run_dir_exactly_one(args: list[str], line: str) -> None:
    result = gate_main(*args)
    assert result.returncode == 2
    assert result.stderr.startswith(f"miles-amd: error: {line}"), result.stderr


def test_a_report_dir_inside_the_package_is_refused_and_nothing_written() -> None:
    import miles_amd

    inside = Path(miles_amd.__file__).resolve().parent / "report-here"
    result = gate_main("--example", "--baseline", "patched", "--report-dir", str(inside))
    assert result.returncode == 2
    assert "the report would go into the installed miles_amd package" in result.stderr
    assert "fix: pass --report-dir DIR outside it" in result.stderr
    assert not inside.exists()
