"""Sequential looks (issue 27): a red run decided at the first look that crosses.

The gate decides a KL doubled at the first look that crosses, reports it in report.json,
report.md, the terminal and metrics.png; a look only fails a run (a crossing stands, a
healthy run is judged at every look and passes at its end); ``--no-looks`` judges the end
only; the watcher's judge stops at the same look; a job stopped right after its look is
decided by the look; ``baseline record`` re-derives the boundaries (the history keeps the
look: ``tests/unit/test_history.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from miles_amd.baseline.model import parse_baseline
from miles_amd.evidence.load import load_run
from miles_amd.evidence.types import JobRecord, RunEvidence
from miles_amd.judge.gate import early_failures, judge
from miles_amd.records.job import LookStop
from miles_amd.rules.model import BOUNDARIES, Baseline
from miles_amd.rules.registry import rule_boundaries
from miles_amd.run.watcher import FailFastWatcher
from miles_amd.testing.faults import healthy_kl
from tests.constants import KL, LOGPROB
from tests.run_dirs import published_values, write_run

KL_RULE = "train_rollout_kl.mean"


def kl_values(doubled_from: int | None) -> dict[str, list[float]]:
    """The published run with a healthy KL (the fault's), doubled from a rollout."""
    values = published_values()
    gap = tuple(enumerate(values[LOGPROB]))
    kl = [v for _, v in healthy_kl(gap)]
    if doubled_from is not None:
        kl = [2 * v if i >= doubled_from else v for i, v in enumerate(kl)]
    return {**values, KL: kl}


def evidence(values: dict[str, list[float]], job: JobRecord | None = None) -> RunEvidence:
    series = {m: tuple(enumerate(vs)) for m, vs in values.items()}
    return RunEvidence(
        run_dir="runs/kl",
        series=series,
        sources=dict.fromkeys(series, "tensorboard"),
        job=job or JobRecord("raysubmit_k", "SUCCEEDED"),
    )


def test_a_doubled_kl_is_decided_at_the_first_look_that_crosses(patched: Baseline) -> None:
    assert judge(evidence(kl_values(None)), patched).verdict == "pass"
    verdict = judge(evidence(kl_values(0)), patched)
    assert verdict.verdict == "fail" and verdict.looks == patched.run_shape.looks
    decided = verdict.decision
    assert decided is not None and decided.check == KL_RULE and decided.at_look
    (check,) = [c for c in verdict.checks if c.name == KL_RULE]
    assert check.look == decided.rollout < 20
    assert check.detail.startswith(f"look at rollout {decided.rollout}: geometric mean")
    assert decided.alpha_spent == check.numbers["alpha_spent"] > 0
    bounds = {b["rollout"]: b for b in rule(patched, KL_RULE).params[BOUNDARIES]}
    assert check.numbers["z_max"] == bounds[decided.rollout]["z"]
    # the looks before it did not cross
    for look in (k for k in patched.run_shape.looks if k < decided.rollout):
        early = early_failures(evidence(cut(kl_values(0), look)), patched)
        assert KL_RULE not in {c.name for c in early}
    # at the end only, the same run is red at its end
    at_end = judge(evidence(kl_values(0)), patched, looks=False)
    assert at_end.looks == () and at_end.decision is not None
    assert (at_end.decision.rollout, at_end.decision.at_look) == (20, False)


def rule(baseline: Baseline, rule_id: str):
    return next(r for r in baseline.rules if r.id == rule_id)


def cut(values: dict[str, list[float]], rollouts: int) -> dict[str, list[float]]:
    return {m: vs[:rollouts] for m, vs in values.items()}


def test_a_look_decides_only_red_and_a_crossing_stands(patched: Baseline) -> None:
    """A KL tripled until the first look only: red at that look, though the whole run's
    level is back inside its bound at 20 (the look spent its rate; nothing undoes it)."""
    first = patched.run_shape.looks[0]
    values = kl_values(None)
    values[KL] = [3 * v if i < first else v for i, v in enumerate(values[KL])]
    verdict = judge(evidence(values), patched)
    assert verdict.decision is not None and verdict.decision.rollout == first
    assert judge(evidence(values), patched, looks=False).verdict == "pass"
    # a healthy run is judged at every look and passes: no look accepts it early
    healthy = judge(evidence(kl_values(None)), patched)
    assert healthy.decision is None and healthy.looks == patched.run_shape.looks


def test_a_run_stopped_right_after_its_look_is_decided_by_the_look(patched: Baseline) -> None:
    """The driver stopped the job as its look's last rollout was logged: the job's STOPPED
    end and its missing steps show at the same rollout, and the look is what decided it."""
    decided = judge(evidence(kl_values(0)), patched).decision
    assert decided is not None
    stop = LookStop(decided.rollout, KL_RULE, decided.alpha_spent or 1.0)
    job = JobRecord("raysubmit_k", "STOPPED", stopped_by="look", look=stop)
    verdict = judge(evidence(cut(kl_values(0), decided.rollout), job=job), patched)
    failed = {c.name for c in verdict.failures}
    assert {"job.status", "logprob_abs_diff.steps", KL_RULE} <= failed
    assert verdict.decision == decided
    (status,) = [c for c in verdict.checks if c.name == "job.status"]
    assert f"stopped at the look at rollout {decided.rollout}: {KL_RULE} crossed" in status.detail


def test_a_value_that_fails_at_once_decides_at_its_rollout(patched: Baseline) -> None:
    values = published_values()
    values[LOGPROB][6] = 0.4  # a spike at rollout 6
    verdict = judge(evidence(values), patched)
    assert verdict.decision is not None
    assert (verdict.decision.rollout, verdict.decision.at_look) == (7, False)
    assert verdict.decision.check == "logprob_abs_diff.spikes"


def test_the_watcher_stops_a_doubled_kl_at_the_same_look(tmp_path: Path, patched: Baseline) -> None:
    decided = judge(evidence(kl_values(0)), patched).decision
    assert decided is not None
    partial = write_run(tmp_path / "partial", cut(kl_values(0), decided.rollout + 1))
    trip = FailFastWatcher(partial, lambda ev: early_failures(ev, patched)).poll()
    assert trip is not None and trip.reason == "look"
    assert (trip.rule, trip.look, trip.alpha_spent) == (
        KL_RULE,
        decided.rollout,
        decided.alpha_spent,
    )
    assert trip.step == decided.rollout - 1
    healthy = write_run(tmp_path / "healthy", cut(kl_values(None), 16))
    assert FailFastWatcher(healthy, lambda ev: early_failures(ev, patched)).poll() is None


def test_gate_reports_the_look_in_every_report(patched: Baseline) -> None:
    from miles_amd.report.render import render_markdown, render_text, to_json

    verdict = judge(evidence(kl_values(0)), patched)
    report: dict[str, Any] = to_json(verdict)
    rollout = report["decided_at_rollout"]
    assert report["looks"] == list(patched.run_shape.looks) and rollout in report["looks"][:-1]
    assert report["decided_by"] == KL_RULE and report["alpha_spent"] > 0
    sentence = f"decided at the look at rollout {rollout} of 20 by {KL_RULE}"
    assert sentence in report["summary"]
    assert sentence in render_markdown(verdict) and sentence in render_text(verdict)
    report = to_json(judge(evidence(kl_values(0)), patched, looks=False))  # --no-looks
    assert report["looks"] == [] and report["decided_at_rollout"] == 20
    assert report["decided_by"] == KL_RULE and report["alpha_spent"] is None
    # a pass reports none of them: test_history.py reads them back as None


def test_metrics_png_marks_the_look(patched: Baseline) -> None:
    from miles_amd.report.plot import metrics_figure

    run = evidence(kl_values(0))
    verdict = judge(run, patched)
    assert verdict.decision is not None
    figure = metrics_figure(verdict, run, patched)
    marks = [line for ax in figure.axes for line in ax.lines if line.get_gid() == "decided"]
    assert len(marks) == len([ax for ax in figure.axes if ax.has_data()])
    assert {tuple(m.get_xdata()) for m in marks} == {(verdict.decision.rollout - 0.5,) * 2}
    healthy = evidence(kl_values(None))
    figure = metrics_figure(judge(healthy, patched), healthy, patched)
    assert not [line for ax in figure.axes for line in ax.lines if line.get_gid() == "decided"]


def test_record_derives_the_boundaries_of_the_recorded_run(
    tmp_path: Path, patched: Baseline
) -> None:
    from miles_amd.baseline.record import record_baseline

    run_dir = write_run(tmp_path / "run", cut(kl_values(None), 15))
    doc = record_baseline(
        load_run(run_dir), patched, variant="patched", name="patched", recorded_at="t",
        allow_no_preflight=True, rollouts=15,
    )  # fmt: skip
    assert doc["run_shape"]["looks"] == [6, 8, 10, 12, 14, 15]  # the shipped ones below 15
    recorded = parse_baseline(json.dumps(doc), path="recorded.json")  # the loader agrees
    kl = rule(recorded, KL_RULE)
    assert [b["rollout"] for b in kl.params[BOUNDARIES]] == [6, 8, 10, 12, 14, 15]
    assert kl.params[BOUNDARIES] != rule(patched, KL_RULE).params[BOUNDARIES]  # its own spread
    assert kl.params[BOUNDARIES] == [
        b.to_json() for b in rule_boundaries(kl, recorded, 15, (6, 8, 10, 12, 14, 15))
    ]
