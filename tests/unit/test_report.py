"""miles_amd.report.render: report.json (held to its schema), report.md and the text."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest

from miles_amd import escape
from miles_amd.baseline.model import load_baseline
from miles_amd.evidence.load import load_run
from miles_amd.evidence.types import Conflict, JobRecord, RunEvidence, SentinelHit, SourceProblem
from miles_amd.judge.gate import Verdict, judge
from miles_amd.report.render import (
    SCHEMA_PATH,
    SCHEMA_VERSION,
    ordered_checks,
    render,
    render_json,
    render_markdown,
    render_text,
    to_json,
)
from miles_amd.rules.model import Baseline
from tests.cli_runs import flat
from tests.constants import CLIPFRAC, EXAMPLE, LOGPROB, REWARD

HTTP_404 = "requests.exceptions.HTTPError: 404 Client Error | Not Found for url: .../register_lora"
FATAL = SentinelHit("sglang_register_lora_adapter_404", "fatal", 2, 311, HTTP_404,
                    "image without /register_lora_adapter")  # fmt: skip
EXPERTS = "Using a large number of experts (e.g. >=32) without fp32 routing."
KNOWN = SentinelHit("megatron_router_dtype_dropped", "known", 8, 57, EXPERTS, "radixark/miles#3263")


def published(baseline: Baseline) -> dict[str, list[float]]:
    return {
        LOGPROB: list(baseline.series[LOGPROB]),
        REWARD: [round(v * 64) / 64 for v in baseline.series[REWARD]],
        CLIPFRAC: [0.0] * 20,
    }


def make_evidence(values: dict[str, list[float]], **fields) -> RunEvidence:
    series = {metric: tuple(enumerate(vs)) for metric, vs in values.items()}
    fields.setdefault("job", JobRecord("raysubmit_r", "SUCCEEDED"))
    return RunEvidence("runs/r", series, dict.fromkeys(series, "tensorboard"), **fields)


@pytest.fixture(scope="module")
def failing(patched: Baseline) -> tuple[Verdict, RunEvidence]:
    values = published(patched)
    values[LOGPROB][6] = 0.42  # a spike
    values[REWARD][9] = math.nan
    evidence = make_evidence(
        values,
        problems=(SourceProblem("ci_history", "runs/r/ci_history/1-a.jsonl", "line 2: bad JSON"),),
        conflicts=(Conflict(LOGPROB, 6, {"tensorboard": 0.42, "job_log": 0.0166}),),
        sentinels=(KNOWN, FATAL),
    )
    return judge(evidence, patched), evidence


@pytest.fixture(scope="module")
def passing(patched: Baseline) -> tuple[Verdict, RunEvidence]:
    evidence = make_evidence(published(patched), sentinels=(KNOWN,))
    return judge(evidence, patched), evidence


def strict_json(text: str) -> object:
    def reject(name: str) -> float:
        raise AssertionError(f"non-strict JSON constant {name}")

    return json.loads(text, parse_constant=reject)


def test_report_json_rows(failing, patched: Baseline) -> None:
    verdict, _ = failing
    report = strict_json(render_json(verdict))
    assert report["verdict"] == "fail"
    assert report["exit_code"] == 1
    assert report["baseline"] == {
        "name": "patched",
        "path": patched.path,
        "run_id": "jvvnhop9",
        # judged here without the app layer, which sets the digests (test_baseline_trust)
        "sha256": None,
        "shipped_sha256": None,
        "matches_shipped": False,
    }
    assert report["expected_rollouts"] == 20
    assert len(report["checks"]) == len(verdict.checks)
    for row in report["checks"]:
        assert {"name", "metric", "observed", "expected", "status", "detail"} <= set(row)
        assert row["status"] in {"pass", "fail", "not_measured", "error"}
    rows = {row["name"]: row for row in report["checks"]}
    spikes = rows["logprob_abs_diff.spikes"]
    assert spikes["status"] == "fail"
    assert spikes["observed"] == 1
    assert spikes["expected"] == "0 values above 0.15"
    assert spikes["failing_steps"] == [6]
    assert "rollout 6 (0.42)" in spikes["detail"]
    assert rows["raw_reward.mean"]["observed"] == "NaN"  # strict JSON, miles' marker
    # the NaN at rollout 9 leaves the paired effect undefined from the look at rollout 10 on:
    # decided there, the look and the rate spent by it its only figures
    paired = rows["raw_reward.paired"]
    assert paired["status"] == "fail" and "non-finite" in paired["detail"]
    assert set(paired["numbers"]) == {"look", "alpha_spent"} and paired["numbers"]["look"] == 10
    assert rows["evidence.readable"]["status"] == "fail"
    assert rows["evidence.consistent"]["status"] == "fail"
    assert rows["sentinel.sglang_register_lora_adapter_404"]["observed"] == 2
    assert rows["train_rollout_kl.mean"]["status"] == "not_measured"
    assert report["counts"]["fail"] == sum(c.status == "fail" for c in verdict.checks)
    assert [h["name"] for h in report["sentinels"]] == [KNOWN.name, FATAL.name]
    assert report["sentinels"][0]["reference"] == "radixark/miles#3263"
    problem = {"source": "ci_history", "path": "runs/r/ci_history/1-a.jsonl"}
    assert report["evidence"]["problems"] == [{**problem, "detail": "line 2: bad JSON"}]
    assert report["evidence"]["conflicts"][0]["values"] == {"job_log": 0.0166, "tensorboard": 0.42}
    assert report["evidence"]["sources"][LOGPROB] == "tensorboard"


def test_markdown_verdict_first_failures_first_then_sentinels_then_evidence(failing) -> None:
    verdict, _ = failing
    text = render_markdown(verdict)
    lines = text.splitlines()
    assert lines[0].startswith("**miles-amd gate: FAIL** - this run is NOT accepted: 11 of 20")
    assert "against baseline patched (jvvnhop9) failed (" in lines[0]
    assert lines[2].startswith("Run `runs/r` against baseline `patched` (jvvnhop9)")
    judged = [c for c in verdict.checks if c.status != "not_measured"]
    table = [line for line in lines if line.startswith("| ") and "| check |" not in line]
    statuses = [line.split(" | ")[0].removeprefix("| ") for line in table[: len(judged)]]
    order = {"FAIL": 0, "ERROR": 1, "pass": 2}
    assert statuses == sorted(statuses, key=order.__getitem__)
    assert statuses[0] == "FAIL" and statuses[-1] == "pass"
    assert "NOT MEASURED" not in text  # one short list after the passes instead
    (unmeasured,) = [line for line in lines if line.startswith("Not measured (optional")]
    assert lines.index(unmeasured) > lines.index(table[len(judged) - 1])
    # one item per reason, saying why (the checks' detail: what the run lacked)
    assert (
        "- train_rollout_kl (steps, finite, mean): not measured: no train/train_rollout_kl in "
        "any source (TensorBoard, CI history, job.log)"
    ) in lines
    assert text.index("### Checks") < text.index("### Sentinel hits") < text.index("### Evidence")
    sentinels = text[text.index("### Sentinel hits") : text.index("### Evidence")]
    assert "| megatron_router_dtype_dropped | known | 8 | 57 | radixark/miles#3263 |" in sentinels
    assert "| sglang_register_lora_adapter_404 | fatal | 2 | 311 |" in sentinels
    assert "404 Client Error \\| Not Found" in sentinels  # a pipe cannot break the table
    evidence_part = text[text.index("### Evidence") :]
    assert "- ci_history: runs/r/ci_history/1-a.jsonl: line 2: bad JSON" in evidence_part
    assert f"- {LOGPROB} at step 6: job_log=0.0166, tensorboard=0.42" in evidence_part
    assert "0 spikes" not in text


def test_json_and_markdown_of_a_passing_run(passing) -> None:
    verdict, _ = passing
    report = to_json(verdict)
    assert report["verdict"] == "pass" and report["exit_code"] == 0
    paired = next(r for r in report["checks"] if r["name"] == "raw_reward.paired")
    assert set(paired["numbers"]) == {"mean_diff", "se", "n", "z", "z_max"}
    assert paired["numbers"]["n"] == 20
    assert strict_json(render(verdict, "json")) == json.loads(json.dumps(report))
    text = render_markdown(verdict)
    assert text.startswith("**miles-amd gate: PASS**")
    assert "Problems: none." in text and "Conflicts: none." in text
    assert text.splitlines()[0].startswith(
        "**miles-amd gate: PASS** - this run is accepted: all 19 measured checks agree with "
        "baseline patched (jvvnhop9); 16 optional checks were not measured"
    )
    assert "train_rollout_kl (steps, finite, mean)" in text
    assert "| FAIL |" not in text


def test_text_output_is_ordered_like_the_markdown(failing) -> None:
    verdict, _ = failing
    text = render_text(verdict)
    lines = text.splitlines()
    assert lines[0].startswith("miles-amd gate: FAIL - run runs/r against baseline patched")
    assert lines[1].startswith("FAIL: this run is NOT accepted: 11 of 20 checks")
    names = [c.name for c in ordered_checks(verdict) if c.status != "not_measured"]
    positions = [text.index(f"  {name}  ") for name in names]
    assert positions == sorted(positions)
    assert "fatal  sglang_register_lora_adapter_404: 2x, first at job.log:311" in text
    assert "known  megatron_router_dtype_dropped: 8x, first at job.log:57 [radixark/" in text
    assert "evidence problem: ci_history: runs/r/ci_history/1-a.jsonl: line 2: bad JSON" in text
    assert render(verdict, "text") == text
    assert render(verdict, "markdown") == render_markdown(verdict)


def test_report_json_of_every_verdict_matches_its_schema(failing, passing, tmp_path) -> None:
    """report.json's schema (generated from report/schema.py) holds a pass, a fail and an
    error, and refuses a report of another shape."""
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    unreadable = tmp_path / "unreadable"
    (unreadable / "tensorboard").mkdir(parents=True)
    (unreadable / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"\x00garbage")
    error = judge(load_run(unreadable), load_baseline("patched"))
    for verdict, expected in ((failing[0], "fail"), (passing[0], "pass"), (error, "error")):
        report = strict_json(render_json(verdict))
        assert (report["verdict"], report["schema_version"]) == (expected, SCHEMA_VERSION)
        assert [f"{e.json_path}: {e.message}" for e in validator.iter_errors(report)] == []
    for broken in (
        {**report, "schema_version": SCHEMA_VERSION + 1},
        {**report, "verdict": "maybe"},
        {k: v for k, v in report.items() if k != "checks"},
        {**report, "checks": [{**report["checks"][0], "status": "skipped"}]},
    ):
        assert list(validator.iter_errors(broken)) != []


def test_a_report_says_why_checks_were_not_measured(patched: Baseline) -> None:
    """The example lacks the KL series: each check not measured says why, in every form."""
    verdict = judge(load_run(EXAMPLE), patched)
    report = strict_json(render_json(verdict))
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    assert list(validator.iter_errors(report)) == []
    unmeasured = [c for c in report["checks"] if c["status"] == "not_measured"]
    assert unmeasured, "the example lacks the KL series: some checks are not measured"
    text, markdown = render_text(verdict), render_markdown(verdict)
    for check in unmeasured:
        assert check["detail"], check
        assert flat(escape.terminal(check["detail"])) in flat(text), check["detail"]
        assert escape.markdown(check["detail"]) in markdown, check["detail"]
    assert "not measured (optional, so they do not change the verdict):" in text
