"""The acceptance gate: one run's evidence and a baseline -> checks -> a verdict.

Decides the checks, in order (evidence, environment, the all-reduce path, the canary, the aiter
fix each process imported, LoRA on the experts, fatal sentinels, then each baseline rule), and
the verdict: ``error`` when nothing was readable, else ``fail`` when any check is ``fail`` or
``error``, else ``pass``; a red run carries the look it was decided at, and a red stock run that
ROCm/aiter#5694 explains its expected failure. :func:`early_failures` judges a partial run (only
red is decided early). ``docs/cli.md`` ("What the gate judges, in order")."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from miles_amd.evidence.types import Conflict, RunEvidence, SentinelHit, SourceProblem
from miles_amd.exit_codes import VERDICT_EXIT_CODES, VerdictName
from miles_amd.judge.allreduce import allreduce_check, fix_check
from miles_amd.judge.canary import (
    ExpectedFailure,
    canary_check,
    expected_failure,
    explain_known_bug,
)
from miles_amd.judge.environment import Environment, environment_check
from miles_amd.judge.model_build import model_build_check
from miles_amd.judge.sequential import (
    CONTROL_ARM,
    Decision,
    decision,
    early_rule_failures,
    rule_checks,
)
from miles_amd.rules.check import BuiltinCheck, Check, RuleContext, fmt, listed, passed
from miles_amd.rules.looks import run_looks
from miles_amd.rules.model import Baseline

__all__ = ["Check", "Decision", "RecordOnly", "Verdict", "VerdictName", "early_failures", "judge"]


@dataclass(frozen=True)
class RecordOnly:
    """A run judged without a reviewed baseline: its key, and the identity the key gives
    (GPU count and model) in place of the template baseline's."""

    key: str
    environment: Environment  # its gpu_count and gpu_model replace the template's


@dataclass(frozen=True)
class Verdict:
    """The gate's answer for one run against one baseline."""

    verdict: VerdictName
    reason: str
    run_dir: str
    baseline_name: str
    baseline_path: str
    baseline_run_id: str
    expected_rollouts: int
    checks: tuple[Check, ...]
    sentinels: tuple[SentinelHit, ...] = ()
    sources: Mapping[str, str] = field(default_factory=dict)
    problems: tuple[SourceProblem, ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    looks: tuple[int, ...] = ()  # the rollouts the run was judged at (empty: --no-looks)
    decision: Decision | None = None  # when a red run was decided (None for a pass)
    # a red stock run the reproduced bug explains (judge.canary); None for any other run
    expected_failure: ExpectedFailure | None = None
    # set by miles_amd.app.gate: the baseline's digest (miles_amd.baseline.shipped) and the
    # shipped baseline of that name's (None: none of that name, or it does not load)
    baseline_sha256: str | None = None
    shipped_sha256: str | None = None
    # the key (shape/gpu/variant) a run was judged record-only for: no reviewed baseline
    record_only: str | None = None

    @property
    def matches_shipped(self) -> bool:
        return self.baseline_sha256 is not None and self.baseline_sha256 == self.shipped_sha256

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT_CODES[self.verdict]

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.failed)


_EVIDENCE = (
    ("readable", "corrupt, truncated or malformed evidence cannot vouch for the run"),
    ("consistent", "two sources with different values for one step: neither can be trusted"),
)


def evidence_checks(evidence: RunEvidence) -> tuple[Check, Check]:
    """``evidence.readable`` and ``evidence.consistent``; both fail the run, never pass it."""
    problems = [str(p) for p in evidence.problems]
    conflicts = [
        f"{c.metric} at step {c.step}: "
        + ", ".join(f"{src}={fmt(v)}" for src, v in sorted(c.values.items()))
        for c in evidence.conflicts
    ]
    readable, consistent = (BuiltinCheck(f"evidence.{n}", "evidence", why) for n, why in _EVIDENCE)
    return (
        readable(
            passed(not problems),
            len(problems),
            "0 unreadable sources",
            f"{len(problems)} source problem(s): {listed(problems)}"
            if problems
            else "every source read cleanly",
            True,
        ),
        consistent(
            passed(not conflicts),
            len(conflicts),
            "sources agree",
            f"{len(conflicts)} conflict(s): {listed(conflicts)}"
            if conflicts
            else "no two sources disagree",
            True,
        ),
    )


_FATAL = "a fatal log signature: the run is broken whatever its metrics say"


def sentinel_checks(hits: Iterable[SentinelHit]) -> list[Check]:
    """One failed check per ``fatal`` sentinel; ``known`` hits are reported, never judged."""
    checks = []
    for hit in hits:
        if hit.severity != "fatal":
            continue
        detail = f"{hit.count}x in job.log, first at line {hit.first_line}: {hit.first_text[:200]}"
        if hit.reference:
            detail += f" [{hit.reference}]"
        if hit.advice:
            detail += f"; fix: {hit.advice}"
        fatal = BuiltinCheck(f"sentinel.{hit.name}", "sentinel", _FATAL)
        check = fatal("fail", hit.count, "absent", detail, True)
        checks.append(replace(check, numbers={"first_line": hit.first_line}))
    return checks


def _reason(
    verdict: VerdictName, checks: Sequence[Check], evidence: RunEvidence, record_only: str | None
) -> str:
    if verdict == "error":
        why = "; ".join(str(p) for p in evidence.problems[:3]) or "no metrics and no job.json"
        return f"nothing readable in {evidence.run_dir}: {why}"
    failed = [c.name for c in checks if c.failed]
    if failed:
        return f"{len(failed)} check(s) failed: {listed(failed)}"
    passed_count = sum(c.status == "pass" for c in checks)
    unmeasured = sum(c.status == "not_measured" for c in checks)
    if record_only:
        return (
            f"{passed_count} checks passed; no reviewed baseline for {record_only}: "
            f"{unmeasured} statistical or optional checks recorded, not judged"
        )
    return f"{passed_count} checks passed; {unmeasured} optional not measured"


def judge(
    evidence: RunEvidence,
    baseline: Baseline,
    *,
    expected_rollouts: int | None = None,
    require_env: bool = False,
    looks: bool = True,
    record_only: RecordOnly | None = None,
) -> Verdict:
    """Judge a finished run: every built-in check and every baseline rule.

    ``expected_rollouts`` overrides the baseline's (sets the steps, rescales the bands);
    ``require_env`` fails what the hardware path must prove instead of ``not_measured``;
    ``looks`` False judges the whole run only (``--no-looks``); ``record_only``: the run's key
    has no reviewed baseline, ``baseline`` is the variant's template whose statistical rules
    are recorded, not judged, with the key's GPU count and model."""
    rollouts = baseline.run_shape.rollouts if expected_rollouts is None else expected_rollouts
    if rollouts < 1:
        raise ValueError(f"expected_rollouts must be >= 1, got {rollouts}")
    declared = run_looks(baseline.run_shape, rollouts) if looks else None
    ctx = RuleContext(evidence, baseline, rollouts, require_env=require_env, looks=declared)
    variant, key = evidence.variant, record_only.key if record_only else None
    control = variant == CONTROL_ARM
    checks = [
        *evidence_checks(evidence),
        environment_check(
            evidence,
            baseline,
            require_env=require_env,
            control_arm=control,
            key=record_only.environment if record_only else None,
        ),
        allreduce_check(evidence, variant, require_env=require_env),
        canary_check(evidence, variant, require_env=require_env),
        fix_check(evidence, variant, require_env=require_env),
        model_build_check(evidence, require_env=require_env),
        *sentinel_checks(evidence.sentinels),
        *rule_checks(ctx, control=control, record_only=key),
    ]
    checks = explain_known_bug(checks, evidence, variant)
    if not (evidence.series or evidence.sentinels or evidence.job or evidence.canary):
        verdict: VerdictName = "error"
    elif any(c.failed for c in checks):
        verdict = "fail"
    else:
        verdict = "pass"
    return Verdict(
        verdict=verdict,
        reason=_reason(verdict, checks, evidence, key),
        run_dir=evidence.run_dir,
        baseline_name=baseline.name,
        baseline_path=baseline.path,
        baseline_run_id=baseline.run_id,
        expected_rollouts=rollouts,
        checks=tuple(checks),
        sentinels=tuple(evidence.sentinels),
        sources=dict(evidence.sources),
        problems=tuple(evidence.problems),
        conflicts=tuple(evidence.conflicts),
        looks=declared or (),
        decision=decision(checks, evidence, baseline, rollouts) if verdict == "fail" else None,
        record_only=key,
        expected_failure=expected_failure(checks, evidence, variant) if verdict == "fail" else None,
    )


def early_failures(
    evidence: RunEvidence, baseline: Baseline, *, looks: bool = True, reference_free: bool = False
) -> list[Check]:
    """What a run read so far has already failed: the rules at once and at the looks it has
    reached (``sequential.early_rule_failures``), then each fatal sentinel; [] while none."""
    rules = early_rule_failures(evidence, baseline, looks=looks, reference_free=reference_free)
    return rules + sentinel_checks(evidence.sentinels)
