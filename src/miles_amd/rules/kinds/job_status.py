"""``job_status``: job.json's status is ``expected_status`` (the schema allows only ``SUCCEEDED``)
and the job's full log was fetched (no ``final_log_error``: a partial log may hide a fatal line),
and the record agrees with itself (``JobRecord.contradiction``: ``SUCCEEDED`` with driver exit
code 137 or a fail-fast stop fails). Without job.json: ``not_measured`` when optional, a failure
when required or on the hardware path (``RuleContext.require_env``: the job's end state is
required evidence there).

Judged from job.json, not from a metric; no tolerance. Pure: no file is read.
"""

from __future__ import annotations

from dataclasses import dataclass

from miles_amd.evidence.types import Series
from miles_amd.records.job import JobRecord
from miles_amd.rules.check import Check, RuleContext, Status, passed, rule_check
from miles_amd.rules.kind import KindSpec
from miles_amd.rules.model import Baseline, Params, Rule


@dataclass(frozen=True)
class JobStatusParams(Params):
    expected_status: str


def check(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    job = ctx.evidence.job
    wanted = expected(rule, ctx.baseline, ctx.rollouts)
    if job is None:
        unreadable = [p for p in ctx.evidence.problems if p.source == "job_json"]
        if unreadable:
            detail = f"job.json unreadable: {unreadable[0].detail}"
            return rule_check(rule, "error", None, wanted, detail)
        if ctx.require_env:
            detail = (
                "not measured: no job.json in the run dir; the hardware path (--require-env) "
                "needs the job's end state; fix: gate the run dir miles-amd train wrote (its "
                "driver writes job.json)"
            )
            return rule_check(rule, "fail", None, wanted, detail)
        status: Status = "fail" if rule.required else "not_measured"
        return rule_check(rule, status, None, wanted, "not measured: no job.json in the run dir")
    detail = f"Ray job {job.job_id} ended {job.status}"
    if job.message:
        detail += f": {' '.join(job.message.split())[:200]}"
    detail += _stopped_by(job)
    if job.final_log_error:
        detail += f"; job.log is partial: {job.final_log_error}"
    contradiction = job.contradiction
    if contradiction is not None:
        detail += f"; job.json contradicts itself: {contradiction}"
    ok = (
        job.status == JobStatusParams.of(rule).expected_status
        and not job.final_log_error
        and contradiction is None
    )
    return rule_check(rule, passed(ok), job.status, wanted, detail)


def _stopped_by(job: JobRecord) -> str:
    """The driver's note on why it stopped the job (job.json ``stopped_by``/``failfast``)."""
    if not job.stopped_by:
        return ""
    if job.look is not None:
        look = job.look
        return (
            f"; stopped at the look at rollout {look.rollout}: {look.rule} crossed its "
            f"boundary (α spent {look.alpha_spent:.3g})"
        )
    trip = job.failfast
    if job.stopped_by != "fail-fast" or trip is None:
        return f"; stopped by the driver: {job.stopped_by}"
    where = f" at step {trip['step']}" if trip.get("step") is not None else ""
    latency = job.failfast_latency_s
    after = f", stopped {latency:.1f} s after it appeared" if latency is not None else ""
    return f"; stopped by fail-fast: {trip.get('rule')}{where}{after}"


def expected(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    return JobStatusParams.of(rule).expected_status


SPEC = KindSpec(
    name="job_status", params=JobStatusParams, check=check, expected=expected, needs_series=False
)
