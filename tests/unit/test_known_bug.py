"""A red stock run that ROCm/aiter#5694 explains is the A/B's control failing as expected
(``judge.known_bug``), decided from a canary.json and a run dir gated into a report.

Every canary.json is written by the real writer from the real merge (``test_gate_canary``'s
``canary``); the run dirs by ``MilesRunWriter``; the report by the real ``miles-amd gate``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from miles_amd.baseline.model import load_baseline
from miles_amd.evidence.load import load_run
from miles_amd.judge.gate import judge
from miles_amd.judge.known_bug import EXPLAINED_KINDS, LOGPROB_METRIC, expected_failure
from miles_amd.run.preflight import Fact, write_env_json
from tests.cli_runs import run_cli
from tests.constants import LOGPROB
from tests.run_dirs import published_values, write_run
from tests.unit.test_ab_premise import AITER_LINE
from tests.unit.test_gate_canary import canary, spiking_stock_run

FAULT = "(SGLangEngine pid=7) Memory access fault by GPU node-9 on address 0x7f1c00000000.\n"


def gate_report(run: Path, tmp_path: Path) -> tuple[int, str, dict]:
    """``miles-amd gate`` of ``run`` against stock: exit code, stdout and report.json."""
    out = tmp_path / "report"
    result = run_cli("gate", "--run-dir", str(run), "--baseline", "stock", "--report-dir", str(out))
    return result.returncode, result.stdout, json.loads((out / "report.json").read_text())


def test_a_stock_red_of_the_logprob_rules_with_the_bug_reproduced_is_expected(tmp_path) -> None:
    run = spiking_stock_run(tmp_path / "spike")
    canary(run, "aiter", bad=True, variant="stock")
    code, text, report = gate_report(run, tmp_path)
    failing = [c for c in report["checks"] if c["status"] == "fail"]
    assert failing and all(
        c["metric"] == LOGPROB_METRIC and c["kind"] in EXPLAINED_KINDS for c in failing
    )
    assert report["verdict"] == "fail" and code == report["exit_code"] == 1
    expected = report["expected_failure"]
    assert expected["reason"] == "ROCm/aiter#5694 reproduced"
    assert expected["checks"] == [c["name"] for c in failing]
    assert expected["canary"].startswith("2 wrong sum(s) from aiter's all-reduce, first at N=127")
    assert report["summary"].startswith("this run is NOT accepted, as expected: ROCm/aiter#5694")
    lines = text.splitlines()
    assert lines[0].startswith("miles-amd gate: FAIL (expected: ROCm/aiter#5694 reproduced)")
    verdict_line = next(line for line in lines if line.startswith("FAIL: "))
    assert verdict_line.startswith("FAIL: this run is NOT accepted, as expected: ROCm/aiter#5694")
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert markdown.startswith("**miles-amd gate: FAIL (expected: ROCm/aiter#5694 reproduced)**")


def test_a_stock_red_whose_canary_was_clean_is_a_failure(tmp_path) -> None:
    run = spiking_stock_run(tmp_path / "spike")
    canary(run, "aiter", bad=False, variant="stock")
    code, text, report = gate_report(run, tmp_path)
    assert (code, report["expected_failure"]) == (1, None)
    assert "expected" not in text.splitlines()[0]


def test_a_stock_red_that_the_bug_does_not_explain_is_a_failure(tmp_path) -> None:
    run = spiking_stock_run(tmp_path / "spike")
    canary(run, "aiter", bad=True, variant="stock")
    with open(run / "job.log", "a", encoding="utf-8") as log:
        log.write(FAULT)
    code, _, report = gate_report(run, tmp_path)
    assert "sentinel.hip_memory_access_fault" in report["reason"]
    assert (code, report["expected_failure"]) == (1, None)


def stopped_stock_run(root: Path, stopped_by: str | None, rule: str) -> Path:
    """A stock run the driver stopped after rollout 7 (a spike there), as job.json records a
    watcher's trip (``run.watcher.Trip.to_dict``), with a stock env.json and a red canary."""
    values = published_values()
    values[LOGPROB][7] = 0.4
    run = write_run(root, values, status="STOPPED", rollouts=range(8))
    job = json.loads((run / "job.json").read_text())
    trip = {"rule": rule, "detail": "tripped", "step": 7, "line": None, "fault_time": None}
    job.update(stopped_by=stopped_by, stop_requested_at=1_767_228_700.0)
    job.update(failfast={**trip, "detected_at": 1_767_228_699.0, "look": None, "alpha_spent": None})
    (run / "job.json").write_text(json.dumps(job))
    facts = {"gpus": "8x gfx950 (torch)", "rocm": "7.2.0-43", "aiter": "amd-aiter 0.1.5"}
    write_env_json(
        [Fact(k, "ok", v) for k, v in {**facts, "aiter_variant": "stock"}.items()], run, {}
    )
    with open(run / "job.log", "a", encoding="utf-8") as log:
        log.write(AITER_LINE)
    canary(run, "aiter", bad=True, variant="stock")
    return run


def test_a_stock_run_stopped_at_the_bugs_spike_is_expected(tmp_path) -> None:
    """On the node the watcher stops the run at its first spike: the job's status and the
    missing steps are that stop's, so the bug explains them too."""
    run = stopped_stock_run(tmp_path / "stopped", "fail-fast", "logprob_abs_diff.spikes")
    verdict = judge(load_run(run), load_baseline("stock"))
    failing = {c.name for c in verdict.failures}
    assert {"job.status", "logprob_abs_diff.steps", "raw_reward.steps"} <= failing
    assert verdict.expected_failure is not None
    assert set(verdict.expected_failure.checks) == failing


@pytest.mark.parametrize(
    ("stopped_by", "rule"),
    [("fail-fast", "sentinel.hip_memory_access_fault"), ("timeout", "logprob_abs_diff.spikes")],
)
def test_a_stock_run_stopped_for_anything_else_is_a_failure(tmp_path, stopped_by, rule) -> None:
    run = stopped_stock_run(tmp_path / "stopped", stopped_by, rule)
    verdict = judge(load_run(run), load_baseline("stock"))
    assert verdict.verdict == "fail" and verdict.expected_failure is None


def test_only_stock_and_only_a_red_run_can_be_an_expected_failure(tmp_path) -> None:
    run = spiking_stock_run(tmp_path / "spike")
    canary(run, "aiter", bad=True, variant="stock")
    evidence = load_run(run)
    verdict = judge(evidence, load_baseline("stock"))
    assert verdict.expected_failure is not None
    assert expected_failure(verdict.checks, evidence, "patched") is None
    passing = [c for c in verdict.checks if not c.failed]
    assert expected_failure(passing, evidence, "stock") is None
    without_canary = load_run(run)
    (run / "canary.json").unlink()
    assert expected_failure(verdict.checks, load_run(run), "stock") is None
    assert without_canary.canary is not None  # the same run, read before the canary went
