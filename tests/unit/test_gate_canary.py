"""The gate's ``allreduce.canary`` check (``judge.canary``), one test per row of issue 25 item 2,
and a red stock run that ROCm/aiter#5694 explains: the A/B's control failing as expected.

Every canary.json here is written by the real writer (``canary.harness.write_canary``) from a
record the real merge (``canary.harness.merge``) made of ranks' results shaped as
``canary.worker`` writes them; env.json by the preflight's writer; the run dirs are copies
of the embedded example or written by ``MilesRunWriter``; all read by ``evidence.load_run``
and judged by the real gate, rendered by ``report.render``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from miles_amd.baseline.model import load_baseline
from miles_amd.canary.harness import Setup, merge, write_canary
from miles_amd.canary.plan import CPU, build_plan, recipe_shape
from miles_amd.evidence.load import load_run
from miles_amd.judge.canary import (
    EXPLAINED_KINDS,
    KNOWN,
    LOGPROB_METRIC,
    expected_failure,
)
from miles_amd.judge.gate import Check, Verdict, judge
from miles_amd.recipe.settings import Recipe
from miles_amd.records.canary import CanaryRecord, ControlRecord
from miles_amd.report.render import render_markdown, render_text, to_json
from miles_amd.run.preflight import Fact, write_env_json
from tests.cli_runs import flat, run_cli
from tests.constants import LOGPROB
from tests.run_dirs import published_values, write_run
from tests.unit.test_ab_premise import AITER_LINE, run_dir
from tests.unit.test_canary_record import OTHER, STALE, rank_result

NAME = "allreduce.canary"
BROKEN_CONTROL_MISSED = ControlRecord("control-broken", 4000, 0, False, None)
BROKEN_CONTROL_CAUGHT = ControlRecord("control-broken", 4000, 37, True, "stale-read")


def canary(
    run: Path,
    implementation: str,
    *,
    bad: bool,
    variant: str | None = None,
    aiter_commit: str | None = None,
    first: Mapping[str, object] = STALE,
    control: ControlRecord | None = None,
    aiter_fix: str | None = None,
) -> CanaryRecord:
    """Write ``run/canary.json`` of ``implementation``: N=28 clean, N=127 wrong when ``bad``
    (``first`` on rank 2: by default the stale read's fingerprint)."""
    plan = build_plan(recipe_shape(Recipe()), implementation, 0.5, target=CPU, tokens=(28, 127))
    flags = [1, 1] if bad else [0, 0]
    ranks = [rank_result(r, flags, dict(first) if bad and r == 2 else None) for r in range(4)]
    setup = Setup(
        world_size=4,
        device="cpu",
        implementation=implementation,
        reducer="/reducers.py:faulty" if implementation == "reducer" else None,
        variant=variant,
        repeats=2,
        aiter_commit=aiter_commit,
        control=control,
        aiter_fix=aiter_fix,
    )
    record = merge(plan, setup, ranks, 100.0, 107.5)
    write_canary(run, record)
    return record


def gated(run: Path, baseline: str, require_env: bool = False) -> tuple[Verdict, Check]:
    verdict = judge(load_run(run), load_baseline(baseline), require_env=require_env)
    return verdict, next(c for c in verdict.checks if c.name == NAME)


def shown(verdict: Verdict, check: Check) -> None:
    """The check's detail is in the text and the markdown report (escaped for each)."""
    text, markdown = render_text(verdict), render_markdown(verdict)
    assert flat(check.detail[:60]) in flat(text), text
    assert check.detail[:60].replace("|", "\\|") in markdown, markdown


OWN = "(SGLangEngine pid=7) AMD/ROCm: Using 1-stage all-reduce kernel (deterministic)\n"
MISSED, CAUGHT = {"control": BROKEN_CONTROL_MISSED}, {"control": BROKEN_CONTROL_CAUGHT}
# id: ((run variant, job.log, env.json's aiter commit), canary (implementation, bad, variant,
# extra) or None, baseline, require_env, status, verdict (None: either), in the detail, not in it)
CASES = {
    "no canary.json": (
        ("patched", AITER_LINE, None), None, "patched", False, "not_measured", "pass",
        ["no canary.json", "miles-amd canary --variant patched"], [],
    ),
    "no canary.json, required": (
        ("patched", AITER_LINE, None), None, "patched", True, "fail", "fail", [], [],
    ),
    "a wrong sum on patched": (
        ("patched", AITER_LINE, None), ("aiter", True, "patched", {}), "patched", False,
        "fail", "fail",
        [
            "2 wrong sum(s) from aiter's CustomAllreduce",
            "(matches ROCm/aiter#5694's stale read)",
            "N=127 (aiter's 2stage path, non-uniform stage-1 trip count, exposed)",
            f"repeat 0 call 5 rank 2 index {STALE['index']}: expected 4, seen 0",
        ],
        [],
    ),
    "a clean patched canary, with its power": (
        ("patched", AITER_LINE, None), ("aiter", False, "patched", {}), "patched", False,
        "pass", "pass", ["clean: ", "caught with probability", "no positive control ran"],
        ["reproduce"],
    ),
    "a stock wrong sum without a spike: the A/B is meaningful": (
        ("stock", AITER_LINE, None), ("aiter", True, "stock", {}), "stock", False, "pass",
        "pass", ["reproduced", "the A/B is meaningful on this node"], ["trips"],
    ),
    **{
        f"a {variant} positive control missed{', required' * strict}": (
            (variant, AITER_LINE, None), ("aiter", False, variant, MISSED), variant, strict,
            "fail" if strict else "not_measured", None,
            [
                "not measured: the canary could not see this class of race",
                "control-broken made 4000 calls and none was wrong",
            ],
            [],
        )
        for variant in ("stock", "patched")
        for strict in (False, True)
    },
    "a positive control caught: it can see the race": (
        ("stock", AITER_LINE, None), ("aiter", False, "stock", CAUGHT), "stock", True, "pass",
        None, ["control-broken was caught (37 of 4000 calls wrong)"], [],
    ),
    "the control arm, SGLang's own all-reduce clean": (
        ("rccl", OWN, None), ("sglang", False, "rccl", {}), "stock", False, "pass", "pass", [], [],
    ),
    "the control arm, SGLang's own all-reduce wrong": (
        ("rccl", OWN, None), ("sglang", True, "rccl", {}), "stock", False, "fail", "fail",
        ["from SGLang's own CustomAllreduce"], [],
    ),
    "a canary of another implementation": (
        ("rccl", "", None), ("aiter", False, "rccl", {}), "stock", False, "not_measured", None,
        ["not evidence for this run"], [],
    ),
    "a canary of another implementation, required": (
        ("rccl", "", None), ("aiter", False, "rccl", {}), "stock", True, "fail", None,
        [
            "canary.json tested aiter's CustomAllreduce",
            "the rccl run's rollouts use SGLang's own CustomAllreduce",
        ],
        [],
    ),
    # on stock too: only aiter's all-reduce, the one its rollouts use, reproduces the bug
    **{
        f"a wrong sum from {implementation}": (
            ("stock", AITER_LINE, None), (implementation, True, "stock", {}), "stock", False,
            "fail", "fail", ["the all-reduce is wrong", "canary.json tested"], ["not evidence"],
        )
        for implementation in ("rccl", "reducer", "sglang")
    },
    "another variant's canary": (
        ("patched", AITER_LINE, None), ("aiter", False, "stock", {}), "patched", True, "fail",
        None, ["canary.json was run for the stock variant, this is the patched run"], [],
    ),
    "another aiter's canary": (
        ("patched", AITER_LINE, "1a2b3c4d (git x)"),
        ("aiter", False, "patched", {"aiter_commit": "99aa88bb"}), "patched", True, "fail",
        None, ["canary.json tested aiter 99aa88bb, env.json's aiter is 1a2b3c4d"], [],
    ),
    "the same aiter by a commit prefix": (
        ("patched", AITER_LINE, "1a2b3c4d5e (git x)"),
        ("aiter", False, "patched", {"aiter_commit": "1a2b3c4d"}), "patched", True, "pass",
        None, [], [],
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("node", "record", "baseline", "strict", "status", "outcome", "said", "unsaid"),
    CASES.values(),
    ids=CASES.keys(),
)
def test_the_canary_check(tmp_path, node, record, baseline, strict, status, outcome, said, unsaid):
    variant, log, commit = node
    run = run_dir(tmp_path, variant, log, **({"aiter_commit": commit} if commit else {}))
    if record is not None:
        implementation, bad, canary_variant, extra = record
        canary(run, implementation, bad=bad, variant=canary_variant, **extra)
    verdict, check = gated(run, baseline, require_env=strict)
    assert check.status == status, check.detail
    assert outcome is None or verdict.verdict == outcome, verdict.reason
    if status == "fail":
        assert NAME in {c.name for c in verdict.failures}
    if record is not None and record[1]:
        assert check.observed == 2
    assert all(text in check.detail for text in said), check.detail
    assert not any(text in check.detail for text in unsaid), check.detail


def spiking_stock_run(root: Path) -> Path:
    """The published series with one rollout's logprob gap far above the 0.15 spike line,
    as miles writes it, with a stock preflight's env.json."""
    values = published_values()
    values[LOGPROB][7] = 0.4
    return on_a_stock_node(write_run(root, values))


def on_a_stock_node(run: Path) -> Path:
    """``run`` with a stock preflight's env.json and aiter's all-reduce in its job.log."""
    facts = {"gpus": "8x gfx950 (torch)", "rocm": "7.2.0-43", "aiter": "amd-aiter 0.1.5"}
    write_env_json(
        [Fact(k, "ok", v) for k, v in {**facts, "aiter_variant": "stock"}.items()], run, {}
    )
    with open(run / "job.log", "a", encoding="utf-8") as log:
        log.write(AITER_LINE)
    return run


def test_a_stock_wrong_sum_is_the_bug_reproduced_and_its_spike_is_named_known(tmp_path) -> None:
    run = spiking_stock_run(tmp_path / "spike")
    canary(run, "aiter", bad=True, variant="stock")
    verdict, check = gated(run, "stock")
    assert check.status == "pass" and check.observed == 2
    assert check.detail.startswith("reproduced: 2 wrong sum(s)")
    assert "the A/B is meaningful on this node" in check.detail
    assert "it trips logprob_abs_diff.spikes: that failure is this known bug" in check.detail
    spikes = next(c for c in verdict.checks if c.name == "logprob_abs_diff.spikes")
    assert spikes.status == "fail" and spikes.detail.startswith(KNOWN + ": ")
    assert verdict.verdict == "fail"  # the stock baseline's rule was still broken
    others = [c for c in verdict.failures if c.name != "logprob_abs_diff.spikes"]
    assert all(not c.detail.startswith("known:") for c in others)
    shown(verdict, check)
    shown(verdict, spikes)


@pytest.mark.parametrize(
    ("bad", "first", "status", "said"),
    [
        (False, STALE, "pass", "the A/B says nothing about ROCm/aiter#5694 on this node"),
        (True, OTHER, "fail", "(another fault)"),  # not #5694's fingerprint: red on stock too
    ],
)
def test_a_spiking_stock_run_whose_canary_is_not_the_bug_is_not_known(
    tmp_path, bad, first, status, said
) -> None:
    run = spiking_stock_run(tmp_path / "spike")
    canary(run, "aiter", bad=bad, variant="stock", first=first)
    verdict, check = gated(run, "stock")
    assert check.status == status and said in check.detail and "reproduced:" not in check.detail
    spikes = next(c for c in verdict.checks if c.name == "logprob_abs_diff.spikes")
    assert spikes.status == "fail" and not spikes.detail.startswith("known:")


def test_the_cpu_harness_form_gates_a_canary_only_run_dir(tmp_path) -> None:
    """``canary --reducer ... --run-dir DIR`` then ``gate --run-dir DIR``: the canary is
    judged (exit 1 with its detail), not "nothing readable" (exit 2)."""
    canary(tmp_path / "red", "reducer", bad=True)
    done = run_cli("gate", "--run-dir", str(tmp_path / "red"), "--baseline", "patched")
    assert done.returncode == 1, done.stderr
    text = flat(done.stdout)
    assert "allreduce.canary" in text and "N=127 (aiter's 2stage path" in text
    report = json.loads((tmp_path / "red" / "report" / "report.json").read_text())
    row = next(c for c in report["checks"] if c["name"] == NAME)
    assert row["status"] == "fail" and "the CPU harness's --reducer" in row["detail"]


def test_a_broken_or_linked_canary_json_is_a_named_evidence_problem(tmp_path) -> None:
    run = run_dir(tmp_path / "broken", "patched", AITER_LINE)
    canary(run, "aiter", bad=False, variant="patched")
    data = json.loads((run / "canary.json").read_text())
    data["results"][0]["calls"] = "4"
    (run / "canary.json").write_text(json.dumps(data))
    verdict, check = gated(run, "patched")
    readable = next(c for c in verdict.checks if c.name == "evidence.readable")
    assert readable.status == "fail" and "canary_json" in readable.detail
    assert '"results[0].calls" must be an integer' in readable.detail
    assert check.status == "not_measured"
    linked = run_dir(tmp_path / "linked", "patched", AITER_LINE)
    canary(tmp_path, "aiter", bad=False, variant="patched")
    os.symlink(tmp_path / "canary.json", linked / "canary.json")
    evidence = load_run(linked)
    assert evidence.canary is None and "canary.json" in str(evidence.problems[0])


FAULT = "(SGLangEngine pid=7) Memory access fault by GPU node-9 on address 0x7f1c00000000.\n"


def test_a_stock_red_of_the_logprob_rules_with_the_bug_reproduced_is_expected(tmp_path) -> None:
    run = spiking_stock_run(tmp_path / "spike")
    canary(run, "aiter", bad=True, variant="stock")
    verdict, _ = gated(run, "stock")
    report: dict[str, Any] = to_json(verdict)
    failing = [c for c in report["checks"] if c["status"] == "fail"]
    assert failing and all(
        c["metric"] == LOGPROB_METRIC and c["kind"] in EXPLAINED_KINDS for c in failing
    )
    assert report["verdict"] == "fail" and report["exit_code"] == 1
    expected = report["expected_failure"]
    assert expected["reason"] == "ROCm/aiter#5694 reproduced"
    assert expected["checks"] == [c["name"] for c in failing]
    assert expected["canary"].startswith("2 wrong sum(s) from aiter's all-reduce, first at N=127")
    assert report["summary"].startswith("this run is NOT accepted, as expected: ROCm/aiter#5694")
    lines = render_text(verdict).splitlines()
    assert lines[0].startswith("miles-amd gate: FAIL (expected: ROCm/aiter#5694 reproduced)")
    verdict_line = next(line for line in lines if line.startswith("FAIL: "))
    assert verdict_line.startswith("FAIL: this run is NOT accepted, as expected: ROCm/aiter#5694")
    markdown = render_markdown(verdict)
    assert markdown.startswith("**miles-amd gate: FAIL (expected: ROCm/aiter#5694 reproduced)**")


def stopped_stock_run(root: Path, stopped_by: str, rule: str) -> Path:
    """A stock run the driver stopped after rollout 7 (a spike there), as job.json records a
    watcher's trip (``run.watcher.Trip.to_dict``)."""
    values = published_values()
    values[LOGPROB][7] = 0.4
    run = write_run(root, values, status="STOPPED", rollouts=range(8))
    job = json.loads((run / "job.json").read_text())
    trip = {"rule": rule, "detail": "tripped", "step": 7, "line": None, "fault_time": None}
    job.update(stopped_by=stopped_by, stop_requested_at=1_767_228_700.0)
    job.update(failfast={**trip, "detected_at": 1_767_228_699.0, "look": None, "alpha_spent": None})
    (run / "job.json").write_text(json.dumps(job))
    return on_a_stock_node(run)


SPIKES = "logprob_abs_diff.spikes"


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("a clean canary", False),
        ("a fault the bug does not explain", False),
        # the watcher stopped it at its first spike: the job's status and the missing steps
        # are that stop's, so the bug explains them too
        ("stopped by fail-fast at the bug's spike", True),
        ("stopped by fail-fast at a fault", False),
        ("stopped by a timeout", False),
    ],
)
def test_a_stock_red_is_expected_only_where_the_reproduced_bug_explains_it(
    tmp_path, case, expected
) -> None:
    stops = {
        "stopped by fail-fast at the bug's spike": ("fail-fast", SPIKES),
        "stopped by fail-fast at a fault": ("fail-fast", "sentinel.hip_memory_access_fault"),
        "stopped by a timeout": ("timeout", SPIKES),
    }
    if case in stops:
        run = stopped_stock_run(tmp_path / "stopped", *stops[case])
    else:
        run = spiking_stock_run(tmp_path / "spike")
    canary(run, "aiter", bad=case != "a clean canary", variant="stock")
    if case == "a fault the bug does not explain":
        with open(run / "job.log", "a", encoding="utf-8") as log:
            log.write(FAULT)
    verdict = judge(load_run(run), load_baseline("stock"))
    assert verdict.verdict == "fail" and (verdict.expected_failure is not None) == expected
    if case == "a fault the bug does not explain":
        assert "sentinel.hip_memory_access_fault" in verdict.reason
    if expected:
        failing = {c.name for c in verdict.failures}
        assert {"job.status", "logprob_abs_diff.steps", "raw_reward.steps"} <= failing
        assert verdict.expected_failure is not None
        assert set(verdict.expected_failure.checks) == failing


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
