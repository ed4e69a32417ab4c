"""When a finished run may not become a reference baseline.

Decides the refusals of ``miles-amd baseline record`` (each a :class:`RecordError`, one
line naming the file or flag and the fix); what the recorded file holds is
``miles_amd.baseline.record``'s. A run is refused when:

1. any source could not be read (a :class:`~miles_amd.evidence.types.SourceProblem`: a corrupt
   event file, bad JSON, an unreadable job.json or env.json) or two sources disagree (a
   :class:`~miles_amd.evidence.types.Conflict`);
2. ``job.json`` is missing, or the Ray job did not end ``SUCCEEDED``;
3. ``env.json`` is missing or its ``ok`` is not ``true`` (preflight did not run, or did not
   pass) -- unless ``allow_no_preflight`` (``--allow-no-preflight``: the embedded example and
   a CPU rehearsal have no GPUs to pass a preflight); the provenance then says so
   (``tests/unit/test_baseline_record.py``); ``env.json``'s ``aiter_variant``, when
   recorded, must equal the variant asked for;
4. ``job.log`` holds a ``fatal`` sentinel;
5. a metric a required rule names is absent, or any metric a rule names is present but not
   exactly steps ``0..N-1`` once each (``N`` = the rollouts asked for, default the template's
   ``run_shape.rollouts``, 20; one train step per rollout), or holds a NaN or infinity.

(The sixth refusal, a run that fails its own recorded baseline, needs the document and is
``record``'s.)

Explained for people in ``docs/cli.md``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from miles_amd.evidence.types import RunEvidence
from miles_amd.rules.model import Baseline
from miles_amd.rules.registry import KINDS
from miles_amd.run_dir import RunDir

_LIST_LIMIT = 8


class RecordError(ValueError):
    """A run that cannot become a baseline; ``str()`` is one line naming the file/flag and fix."""


def _steps_text(steps: Sequence[int]) -> str:
    """``3, 7..9, 12`` (runs of consecutive steps collapsed), at most 8 items shown."""
    items: list[str] = []
    ordered = sorted(steps)
    start = prev = ordered[0] if ordered else 0
    for step in [*ordered[1:], None]:
        if step is not None and step == prev + 1:
            prev = step
            continue
        items.append(str(start) if start == prev else f"{start}..{prev}")
        if step is not None:
            start = prev = step
    shown = ", ".join(items[:_LIST_LIMIT])
    return shown + (f", ... ({len(items) - _LIST_LIMIT} more)" if len(items) > _LIST_LIMIT else "")


def check_sources(evidence: RunEvidence) -> None:
    run = evidence.run_dir
    if evidence.problems:
        first = evidence.problems[0]
        raise RecordError(
            f"{first.path}: unreadable evidence ({first.source}: {first.detail}; "
            f"{len(evidence.problems)} problem(s) in {run}); fix: record a run whose files are "
            "intact (a corrupt or truncated source cannot vouch for a reference)"
        )
    if evidence.conflicts:
        conflict = evidence.conflicts[0]
        values = ", ".join(f"{src}={v!r}" for src, v in sorted(conflict.values.items()))
        raise RecordError(
            f"--run-dir {run}: its sources disagree on {conflict.metric} at step {conflict.step} "
            f"({values}; {len(evidence.conflicts)} conflict(s)); fix: record a run whose "
            "TensorBoard, CI history and job.log agree"
        )


def check_job(evidence: RunEvidence) -> str:
    """The run id; refuses a missing job.json or a job that did not succeed."""
    where = RunDir(Path(evidence.run_dir)).job_json
    job = evidence.job
    if job is None:
        raise RecordError(
            f"{where}: missing, so the run's end state is unknown; fix: record a run "
            "the driver finished (miles-amd train writes job.json)"
        )
    if job.status != "SUCCEEDED":
        why = f", stopped by {job.stopped_by}" if job.stopped_by else ""
        raise RecordError(
            f"{where}: the Ray job {job.job_id} ended {job.status}{why}, not SUCCEEDED; "
            "fix: record a run that finished all its rollouts"
        )
    return job.job_id


def check_preflight(evidence: RunEvidence, variant: str, allow_no_preflight: bool) -> str:
    """The preflight outcome for ``provenance.notes``; refuses what the flags do not allow."""
    where = RunDir(Path(evidence.run_dir)).env_json
    env = evidence.env
    allow = "or pass --allow-no-preflight to record anyway (noted in the provenance)"
    if env is None:
        if not allow_no_preflight:
            raise RecordError(
                f"{where}: missing, so preflight did not run for this run; fix: run "
                f"`miles-amd preflight --run-dir {evidence.run_dir} --aiter-variant {variant}` "
                f"before the run, {allow}"
            )
        return "not run (no env.json; recorded with --allow-no-preflight)"
    if not env.ok:
        failing = [f"{fact.name} {fact.status}" for fact in env.failed]
        facts = ", ".join(failing) or "; ".join(env.problems) or '"ok" is not true'
        if not allow_no_preflight:
            raise RecordError(
                f"{where}: preflight did not pass ({facts}); fix: record a run whose "
                f"preflight passed, {allow}"
            )
        return f"failed: {facts} (recorded with --allow-no-preflight)"
    recorded = env.aiter_variant
    if recorded is not None and recorded != variant:
        raise RecordError(
            f"--variant {variant}: env.json records aiter_variant {recorded!r} for this run; "
            f"fix: pass --variant {recorded}"
        )
    written = env.written_at
    return "passed" + (f" (env.json written_at {written})" if written else "")


def check_sentinels(evidence: RunEvidence) -> None:
    fatal = [hit for hit in evidence.sentinels if hit.severity == "fatal"]
    if fatal:
        hit, log = fatal[0], RunDir(Path(evidence.run_dir)).job_log
        raise RecordError(
            f"{log}: fatal log signature {hit.name} ({hit.count}x, first at line "
            f"{hit.first_line}); fix: record a run whose log has no fatal signature"
        )


def _check_absent(metric: str, template: Baseline, run: str) -> None:
    """A metric the run did not log is allowed only when no rule needs the run's values:
    its rules are optional, and a band rule's spread can come from the template's summary."""
    rules = [r for r in template.rules if r.metric == metric]
    where = f"--run-dir {run}: no {metric} in any source (TensorBoard, CI history, job.log)"
    fix = "fix: record a run that logs it (--use-tensorboard, MILES_CI_GATE_RECORD_DIR)"
    required = [r.id for r in rules if r.required]
    if required:
        raise RecordError(f"{where}, and the {template.name} rule {required[0]} requires it; {fix}")
    uncarried = [
        r.id
        for r in rules
        if KINDS[r.kind].reference_series
        or (KINDS[r.kind].needs_spread and metric not in template.summaries)
    ]
    if uncarried:
        raise RecordError(
            f"{where}, and the {template.name} rule {uncarried[0]} needs the run's own series "
            f"(the template has no summary to carry over); {fix}"
        )


def recorded_series(
    evidence: RunEvidence, template: Baseline, rollouts: int
) -> dict[str, tuple[float, ...]]:
    """Every ruled metric the run logged, as a complete finite per-rollout series."""
    run = evidence.run_dir
    metrics = [r.metric for r in template.rules if r.metric is not None]
    recorded: dict[str, tuple[float, ...]] = {}
    for metric in dict.fromkeys(metrics):
        points = evidence.series.get(metric, ())
        if not points:
            _check_absent(metric, template, run)
            continue
        counts = Counter(step for step, _ in points)
        missing = [s for s in range(rollouts) if s not in counts]
        duplicated = [s for s, c in counts.items() if c > 1]
        unexpected = [s for s in counts if not 0 <= s < rollouts]
        if missing or duplicated or unexpected:
            found = []
            if missing:
                found.append(f"missing steps {_steps_text(missing)}")
            if duplicated:
                found.append(f"duplicated steps {_steps_text(duplicated)}")
            if unexpected:
                found.append(f"steps outside 0..{rollouts - 1}: {_steps_text(unexpected)}")
            raise RecordError(
                f"--run-dir {run}: {metric} is not one value at each step 0..{rollouts - 1} "
                f"({'; '.join(found)}; the run logged {len(counts)} step(s)); fix: record a "
                "run that finished all rollouts, or pass --num-rollouts with the count the run "
                "was launched with"
            )
        bad = [(s, v) for s, v in points if not math.isfinite(v)]
        if bad:
            raise RecordError(
                f"--run-dir {run}: {metric} is {bad[0][1]!r} at step {bad[0][0]} "
                f"({len(bad)} non-finite value(s)); fix: a run with non-finite values "
                "diverged and cannot be a reference; record a healthy run"
            )
        by_step = dict(points)
        recorded[metric] = tuple(by_step[s] for s in range(rollouts))
    return recorded
