"""A red stock run that ROCm/aiter#5694 explains is the A/B's control failing as expected
(``judge.known_bug``), decided from a canary.json and a run dir gated into a report.

Every canary.json is written by the real writer from the real merge (``test_gate_canary``'s
``canary``); the run dirs by ``MilesRunWriter``; the report by the real ``miles-amd gate``.
"""

from __future__ import annotations

import json
from pathlib import Path

from miles_amd.baseline.model import load_baseline
from miles_amd.evidence.load import load_run
from miles_amd.judge.gate import judge
from miles_amd.judge.known_bug import EXPLAINED_KINDS, LOGPROB_METRIC, expected_failure
from tests.cli_runs import run_cli
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
    assert expected["canary"].startswith("2 wrong sum(s) from aiter's all-reduce, first at N=29")
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
