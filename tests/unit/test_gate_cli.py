"""`miles-amd gate` end to end, in process: real run directories, real readers, exit codes,
what is printed where, and the report files.

Run dirs are the embedded example (copied, then changed) or written by
``miles_amd.testing.miles_writer`` (the writer of miles' formats).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

import miles_amd
from miles_amd.app.baselines import load
from miles_amd.evidence.load import load_run
from miles_amd.judge.gate import judge
from miles_amd.report.render import render_markdown, to_json
from tests.cli_runs import flat, one_error_line, run_cli
from tests.constants import CLIPFRAC, EXAMPLE, FATAL_LINE, KNOWN_LINE, LOGPROB, REWARD, SHIPPED
from tests.run_dirs import published_values, write_run


def copy_example(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(EXAMPLE, run_dir, ignore=shutil.ignore_patterns("report"))
    return run_dir


def report_of(directory: Path) -> dict:
    return json.loads((directory / "report.json").read_text())


def test_the_example_passes_and_says_where_the_report_is(tmp_path: Path) -> None:
    out = tmp_path / "report"
    args = ["gate", "--run-dir", str(EXAMPLE), "--baseline", "patched", "--report-dir", str(out)]
    done = run_cli(*args, "--history", str(tmp_path / "h.sqlite"))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("miles-amd gate: PASS - run ")
    assert "against baseline patched (jvvnhop9)" in flat(done.stdout)
    assert next(line for line in lines if line.startswith("PASS: ")).startswith(
        "PASS: this run is accepted: all 19 measured checks"
    )
    assert lines[-3].startswith("history: appended as run ")  # the history's lines before it
    assert lines[-1] == f"report written to {out / 'report.md'} (also report.json, metrics.png)"
    report = report_of(out)
    statuses = {row["name"]: row["status"] for row in report["checks"]}
    for required in ("logprob_abs_diff.spikes", "raw_reward.paired", "pg_clipfrac.near_zero"):
        assert statuses[required] == "pass"
    assert statuses["train_rollout_kl.mean"] == "not_measured"
    assert (out / "report.md").read_text().startswith("**miles-amd gate: PASS**")
    assert (out / "metrics.png").read_bytes().startswith(b"\x89PNG")
    sources = report["evidence"]["sources"]  # the preferred source, the others agreeing
    assert {sources[m] for m in (LOGPROB, REWARD, CLIPFRAC)} == {"tensorboard"}
    assert report["evidence"]["problems"] == [] and report["evidence"]["conflicts"] == []
    # json and markdown: stdout is the document, where it went is stderr's last line
    as_json = run_cli(*args, "--no-history", "--format", "json")
    assert json.loads(as_json.stdout)["summary"].startswith("this run is accepted")
    assert as_json.stderr.splitlines()[-1] == lines[-1]
    as_md = run_cli(*args, "--no-history", "--format", "markdown")
    assert as_md.stdout == (out / "report.md").read_text()


def fail_job(run_dir: Path) -> None:
    job = json.loads((run_dir / "job.json").read_text())
    (run_dir / "job.json").write_text(json.dumps({**job, "status": "FAILED"}))


def append(text: str) -> Callable[[Path], None]:
    def change(run_dir: Path) -> None:
        with open(run_dir / "job.log", "a", encoding="utf-8") as log:
            log.write(text)

    return change


def corrupt_record(run_dir: Path) -> None:
    record = max((run_dir / "ci_history").iterdir(), key=lambda p: p.stat().st_size)
    record.write_text(record.read_text() + '{"metric": "train/grad_norm", "series": [[0, \n')


def truncate_events(run_dir: Path) -> None:
    events = max((run_dir / "tensorboard").iterdir(), key=lambda p: p.stat().st_size)
    events.write_bytes(events.read_bytes()[:-7])


def disagree(run_dir: Path) -> None:
    log = (run_dir / "job.log").read_text()
    old = "'train/train_rollout_logprob_abs_diff': 0.0208,"
    (run_dir / "job.log").write_text(log.replace(old, "'" + LOGPROB + "': 0.0999,"))


# (change to the example, exit code, check, its status, what its detail names)
CHANGES = {
    "known sentinel": (append(KNOWN_LINE * 8), 0, "logprob_abs_diff.spikes", "pass", ""),
    "job failed": (fail_job, 1, "job.status", "fail", ""),
    "fatal sentinel": (
        append(FATAL_LINE),
        1,
        "sentinel.hip_memory_access_fault",
        "fail",
        "1x in job.log, first at line 61: (MegatronTrainRayActor pid=4243) Memory",
    ),
    "corrupt record": (corrupt_record, 1, "evidence.readable", "fail", ".json"),
    "truncated events": (truncate_events, 1, "evidence.readable", "fail", "events.out"),
    "sources disagree": (disagree, 1, "evidence.consistent", "fail", f"{LOGPROB} at step 0"),
}


@pytest.mark.parametrize("case", sorted(CHANGES))
def test_a_changed_example_is_judged_with_the_named_check(tmp_path: Path, case: str) -> None:
    """The gate's reading and judging of a changed example (the CLI's exit code and report
    files: the other tests here), without drawing its PNG."""
    change, code, name, status, detail = CHANGES[case]
    run_dir = copy_example(tmp_path)
    change(run_dir)
    verdict = judge(load_run(run_dir), load("patched", "--baseline"))
    assert verdict.exit_code == code, verdict.reason
    report = to_json(verdict)
    rows = {r["name"]: r for r in report["checks"]}  # type: ignore[attr-defined]
    assert rows[name]["status"] == status and detail in rows[name]["detail"]
    if case == "job failed":
        assert [n for n, r in rows.items() if r["status"] == "fail"] == ["job.status"]
    if case == "known sentinel":
        hits = [
            (h["name"], h["severity"], h["count"], h["first_line"])
            for h in report["sentinels"]  # type: ignore[attr-defined]
        ]
        assert hits == [("megatron_moe_router_not_fp32", "known", 8, 61)]
        assert "megatron_moe_router_not_fp32 | known | 8 | 61 |" in render_markdown(verdict)
    if case == "corrupt record":
        assert rows["logprob_abs_diff.mean"]["status"] == "pass"  # the rest is still judged


def test_a_spike_written_by_miles_writers_fails(tmp_path: Path) -> None:
    values = published_values()
    values[LOGPROB][13] = 0.37
    run_dir = write_run(tmp_path / "spiky", values)
    done = run_cli("gate", "--run-dir", str(run_dir), "--baseline", "stock", "--format", "json")
    assert done.returncode == 1
    spikes = next(r for r in json.loads(done.stdout)["checks"] if r["name"].endswith(".spikes"))
    assert spikes["status"] == "fail" and spikes["observed"] == 1
    assert "rollout 13 (0.37)" in spikes["detail"]
    md = (run_dir / "report" / "report.md").read_text()
    assert md.index("| FAIL | logprob_abs_diff.spikes") < md.index("| pass |")


def test_the_rollouts_a_run_must_have(tmp_path: Path) -> None:
    """Set by the hidden old spelling too; past the bound (10**12 exhausted memory) one line
    naming it, nothing written."""
    run_dir = write_run(tmp_path / "smoke", published_values(3))
    args = ["gate", "--run-dir", str(run_dir), "--baseline", "patched", "--no-history"]
    done = run_cli(*args, "--expected-rollouts", "3")
    assert done.returncode == 0, done.stderr
    assert report_of(run_dir / "report")["expected_rollouts"] == 3
    twenty = run_cli(*args)
    assert twenty.returncode == 1 and "logprob_abs_diff.steps" in twenty.stdout
    shutil.rmtree(run_dir / "report")
    one_error_line(run_cli(*args, "--num-rollouts", "100001"), "'--num-rollouts'", "100000")
    assert not (run_dir / "report").exists()


def bad_inputs(tmp_path: Path) -> Path:
    raw = json.loads((SHIPPED / "patched.json").read_text())
    raw["rules"][4]["threshold"] = "high"
    (tmp_path / "bad.json").write_text(json.dumps(raw))
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "a-file").write_text("not a directory")
    (tmp_path / "empty").mkdir()
    return tmp_path


# (arguments after `gate --no-history`, the start of the line after "miles-amd: error: ")
BAD_INPUT = [
    (["--run-dir", "{t}/nope", "--baseline", "patched"],
     "--run-dir {t}/nope: no such directory; fix: point it at a run directory"),
    (["--run-dir", "{t}/empty", "--baseline", "patched"],
     "--run-dir {t}/empty: not a run directory"),
    (["--run-dir", "{ex}", "--baseline", "{t}/bad.json", "--report-dir", "{t}/out"],
     "--baseline {t}/bad.json: $.rules[4].threshold: "),
    (["--run-dir", "{ex}", "--baseline", "{t}/broken.json"],
     "--baseline {t}/broken.json: line 1 column 2: invalid JSON"),
    (["--run-dir", "{ex}", "--baseline", "nightly", "--report-dir", "{t}/out"],
     "--baseline nightly: no such baseline file; "),
    (["--run-dir", "{ex}", "--baseline", "patched", "--report-dir", "{t}/a-file"],
     "--report-dir {t}/a-file: cannot write the report"),
    (["--baseline", "patched"], "--run-dir and --example: neither given; fix: "),
    (["--example", "--run-dir", "{ex}", "--baseline", "patched"],
     "--run-dir and --example: give one, not both; fix: "),
    (["--example", "--baseline", "patched", "--report-dir", "{pkg}/report-here"],
     "--report-dir {pkg}/report-here: the report would go into the installed miles_amd "
     "package"),
    (["--run-dir", "{ex}", "--baseline", "patched", "--format", "html"],
     "Invalid value for '--format'"),
    (["--run-dir", "{ex}", "--baseline", "patched", "--expected-rollouts", "0"],
     "Invalid value for '--expected-rollouts'"),
    (["--run-dir", "{ex}"], "Missing option '--baseline'"),
    # a mistyped baseline name gets a hint
    (["--example", "--baseline", "Patched"], "--baseline Patched: no such baseline file "
     "(baseline names are lower case: --baseline patched); fix: use --baseline stock, "
     "--baseline patched"),
    (["--example", "--baseline", "STOCK"], "--baseline STOCK: no such baseline file "
     "(baseline names are lower case: --baseline stock)"),
    (["--example", "--baseline", "rccl"], "--baseline rccl: no such baseline file (rccl has no "
     "baseline of its own: a run of it is gated with --baseline stock"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "line"), BAD_INPUT, ids=lambda v: str(v)[:40])
def test_bad_input_is_one_line_exit_2_and_nothing_written(
    tmp_path: Path, args: list[str], line: str
) -> None:
    root = bad_inputs(tmp_path)
    pkg = Path(miles_amd.__file__).resolve().parent
    fill = {"t": str(root), "pkg": str(pkg), "ex": str(EXAMPLE)}
    before = sorted(p.name for p in root.rglob("*")), sorted(EXAMPLE.rglob("*"))
    got = one_error_line(run_cli("gate", "--no-history", *(a.format(**fill) for a in args)))
    assert got.startswith("miles-amd: error: " + line.format(**fill)), got
    assert (sorted(p.name for p in root.rglob("*")), sorted(EXAMPLE.rglob("*"))) == before
    assert not (pkg / "report-here").exists()


def test_a_run_dir_with_nothing_readable_is_an_error_with_a_report(tmp_path: Path) -> None:
    run_dir = tmp_path / "empty"
    (run_dir / "tensorboard").mkdir(parents=True)
    args = ["gate", "--run-dir", str(run_dir), "--baseline", "patched", "--no-history"]
    line = one_error_line(run_cli(*args), stdout="miles-amd gate: ")  # the report, then the line
    assert line.startswith(f"miles-amd: error: --run-dir {run_dir}: nothing readable in")
    report = report_of(run_dir / "report")
    assert report["verdict"] == "error" and report["exit_code"] == 2
    assert "no event files" in report["reason"]
    (run_dir / "tensorboard" / "events.out.tfevents.1.host.1.0").write_bytes(b"\x00" * 5)
    assert run_cli(*args).returncode == 2
    assert report_of(run_dir / "report")["evidence"]["problems"][0]["source"] == "tensorboard"


def test_the_example_reports_to_a_new_temporary_dir_and_stays_as_it_is() -> None:
    before = sorted(p.relative_to(EXAMPLE) for p in EXAMPLE.rglob("*"))
    done = run_cli("gate", "--example", "--baseline", "patched", "--no-history")
    last = done.stdout.splitlines()[-1]
    made = Path(last.removeprefix("report written to ").split(" (also")[0]).parent
    try:
        assert made.parent == Path(tempfile.gettempdir())
        assert made.name.startswith("miles-amd-example-") and report_of(made)["verdict"] == "pass"
    finally:
        shutil.rmtree(made, ignore_errors=True)
    assert sorted(p.relative_to(EXAMPLE) for p in EXAMPLE.rglob("*")) == before
