"""Record a baseline from a run: when a run may become one (else :class:`RecordError`, one line
naming the file or flag and the fix), and what the new file holds: the template's rules with
each band and spending boundary re-derived from the run, its series, summaries and provenance.
``--from-history``: the median of at least :data:`MIN_TRUSTED_RUNS` trusted runs of a key is the
reference, and every other must pass it. Explained in ``docs/cli.md`` ("What a recorded
baseline holds", "The commands").
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from miles_amd import numeric, variants
from miles_amd.baseline.model import BaselineError, parse_baseline
from miles_amd.baseline.shipped import evidence_digest
from miles_amd.evidence.types import EnvRecord, RunEvidence
from miles_amd.judge.environment import Environment, run_environment
from miles_amd.judge.gate import judge
from miles_amd.rules import bands
from miles_amd.rules.bands import BandParams
from miles_amd.rules.looks import run_looks
from miles_amd.rules.model import BOUNDARIES, Baseline, Rule
from miles_amd.rules.registry import KINDS, rule_boundaries
from miles_amd.run_dir import RunDir

NAME_PATTERN = re.compile(r"^[a-z0-9_.-]+$")
MIN_TRUSTED_RUNS = 3
PRIMARY = "train/train_rollout_logprob_abs_diff"
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
            found = [
                f"{what} {_steps_text(steps)}"
                for what, steps in (("missing steps", missing), ("duplicated steps", duplicated),
                                    (f"steps outside 0..{rollouts - 1}:", unexpected))
                if steps
            ]  # fmt: skip
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


def baseline_json_text(doc: Mapping[str, Any]) -> str:
    """The document as a baseline file: 2-space indent, number lists on one line, UTF-8."""
    return _dump(doc, 0) + "\n"


def _dump(value: Any, level: int, in_list: bool = False) -> str:
    """Containers one item a line, except a list of scalars and, in a list, a mapping of
    numbers only (a look's boundary)."""
    pad, end = "  " * (level + 1), "  " * level
    flat = in_list and isinstance(value, Mapping) and value and _numbers_only(value)
    if isinstance(value, Mapping) and value and not flat:
        items = [f"{pad}{json.dumps(k)}: {_dump(v, level + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    if isinstance(value, list) and any(isinstance(v, (Mapping, list)) for v in value):
        rows = (pad + _dump(v, level + 1, in_list=True) for v in value)
        return "[\n" + ",\n".join(rows) + "\n" + end + "]"
    return json.dumps(dict(value) if flat else value, ensure_ascii=False, allow_nan=False)


def _numbers_only(value: Mapping[str, Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values())


@dataclass(frozen=True)
class _Recording:
    """What one recording is about: the run, its template, and the flags it was asked with."""

    evidence: RunEvidence
    template: Baseline
    variant: str
    rollouts: int
    run_id: str
    recorded_at: str


def _summaries(rec: _Recording, recorded: Mapping[str, tuple[float, ...]]):
    """(summaries, metrics carried over from the template)."""
    summaries: dict[str, Any] = {}
    carried: list[str] = []
    for metric in dict.fromkeys(r.metric for r in rec.template.rules if r.metric is not None):
        if metric in recorded:
            values = recorded[metric]
            summary: dict[str, Any] = {"n": len(values), "min": min(values)}
            summary |= {"mean": math.fsum(values) / len(values), "max": max(values)}
            for rule in rec.template.rules:
                add = KINDS[rule.kind].summary
                if rule.metric == metric and add is not None:
                    summary.update(add(rule, list(values)))
            source = rec.evidence.sources.get(metric, "unknown")
            summary["source"] = (
                f"run {rec.run_id}: the {source} series, rollouts 0..{len(values) - 1}"
            )
            summaries[metric] = summary
        elif metric in rec.template.summaries:
            summary = dict(rec.template.summaries[metric])
            note = (
                f"carried over from the shipped {rec.template.name} baseline (run "
                f"{rec.template.run_id}): run {rec.run_id} did not log this metric"
            )
            summary["note"] = f"{summary['note']}; {note}" if summary.get("note") else note
            summaries[metric] = summary
            carried.append(metric)
    return summaries, carried


def _fact_text(env: EnvRecord | None, name: str) -> str:
    if env is None:
        return "unrecorded (no env.json)"
    fact = env.facts.get(name)
    if fact is None:
        return f"unrecorded (env.json has no {name} fact)"
    if fact.status == "ok" and fact.value:
        return fact.value
    value = fact.value
    return f"unrecorded (preflight {name}: {fact.status}{', ' + value if value else ''})"


def _notes(rec: _Recording, recorded, carried: Sequence[str], preflight: str) -> str:
    by_source: dict[str, list[str]] = {}
    for metric in recorded:
        by_source.setdefault(rec.evidence.sources.get(metric, "unknown"), []).append(metric)
    template = rec.template
    notes = [
        f"recorded_at {rec.recorded_at}",
        f"preflight: {preflight}",
        "series read from "
        + "; ".join(f"{src}: {', '.join(ms)}" for src, ms in sorted(by_source.items())),
        f"rules, rationales and non-band tolerances are the shipped {template.name} baseline's "
        f"(run {template.run_id}); figures quoted in the derivation texts of non-band rules "
        "are that run's",
    ]
    if carried:
        notes.append(
            f"not logged by this run, summaries carried over from run {template.run_id}: "
            + ", ".join(carried)
        )
    known = [f"{h.name} x{h.count}" for h in rec.evidence.sentinels if h.severity == "known"]
    if known:
        notes.append(f"known log signatures: {', '.join(known)}")
    return "; ".join(notes)


def _provenance(rec: _Recording, recorded, carried, preflight: str, source: str) -> dict:
    """The run's identity; an environment only from a preflight that passed (the readings of
    one that failed cannot vouch for hardware; the gate fails such an env.json)."""
    job, env, variant = rec.evidence.job, rec.evidence.env, rec.variant
    assert job is not None
    aiter = f"{variants.describe(variant)}; declared by --variant, no passing preflight"
    found = Environment()
    if env is not None and env.ok:
        aiter = f"{variants.describe(variant)}: {_fact_text(env, 'aiter')}"
        if env.aiter_variant is None:
            aiter += "; variant declared by --variant, preflight recorded none"
        found = run_environment(env)
    provenance: dict[str, Any] = {
        "run_id": job.job_id,
        "aiter": aiter,
        "environment": replace(found, aiter_variant=variant).to_json(),
        "hardware": _fact_text(env, "gpus"),
        "rocm": _fact_text(env, "rocm"),
        "image": _fact_text(env, "image"),
        "rollouts": rec.rollouts,
        "optimizer_steps": rec.rollouts * rec.template.run_shape.train_steps_per_rollout,
        "job_status": job.status,
    }
    start, end = job.start_time, job.end_time
    if start is not None and end is not None and end >= start:
        minutes, seconds = divmod(round(end - start), 60)
        hours, minutes = divmod(minutes, 60)
        duration = f"{minutes}m{seconds:02d}s"
        provenance["duration"] = f"{hours}h{minutes:02d}m{seconds:02d}s" if hours else duration
    provenance["source"] = source
    provenance["notes"] = _notes(rec, recorded, carried, preflight)
    return provenance


def _recorded_rule(rule: Rule, draft: Baseline, rec: _Recording) -> Rule:
    """The template's rule with the params its kind re-derives from the recorded run; a run
    whose values the derivation cannot take (a reward of -1 has no binomial spread) is a
    :class:`RecordError` naming the rule and the metric."""
    kind = KINDS[rule.kind]
    params = dict(rule.params)
    try:
        if kind.rederive is not None:
            params.update(kind.rederive(rule, draft, rec.rollouts))
        looks = draft.run_shape.looks
        bounds = rule_boundaries(replace(rule, params=params), draft, rec.rollouts, looks)
        if bounds:  # a spending rule: its bound at each look, from the recorded run
            params[BOUNDARIES] = [b.to_json() for b in bounds]
        derivation = rule.derivation
        if kind.params is BandParams and rule.metric is not None and rule.metric in draft.series:
            derive = BandParams.of(rule).derive
            spread = bands.spread_of(draft, rule.metric)
            cover = "[" + ", ".join(f"{c:g}" for c in derive.cover) + "]"
            origin = (
                f"center {spread.mean:.6g}, per-rollout sd {spread.sd:.4g} (sample sd of the "
                f"{spread.n}-rollout series of run {rec.run_id}, recorded by miles-amd baseline "
                f"record; k and cover {cover} kept from the shipped {rec.template.name} baseline)"
            )
            derivation = bands.derivation_text(
                derive.method, origin, spread.n, derive.k, cover, derive.run_sd, derive.rho
            )
    except (ArithmeticError, ValueError, KeyError) as exc:
        raise RecordError(
            f"--run-dir {rec.evidence.run_dir}: rule {rule.id} cannot be derived from its "
            f"{rule.metric or 'values'} ({' '.join(str(exc).split()) or type(exc).__name__}); "
            "fix: record a healthy run of the recipe (its values in their usual range)"
        ) from None
    return replace(rule, params=params, derivation=derivation)


def _check_request(template: Baseline, variant: str, name: str, rollouts: int) -> None:
    if variant not in variants.BASELINE_VARIANTS:
        choices = ", ".join(variants.BASELINE_VARIANTS)
        raise RecordError(f"--variant {variant}: unknown; fix: use one of {choices}")
    if not NAME_PATTERN.match(name):
        raise RecordError(
            f"--name {name!r}: a baseline name is lower case letters, digits, '_', '.', '-'; "
            "fix: pass --name with such a name (default: the variant)"
        )
    if rollouts < 2:
        raise RecordError(
            f"--num-rollouts {rollouts}: a spread needs 2 rollouts; fix: pass 2 or more"
        )
    if template.run_shape.train_steps_per_rollout != 1:
        raise RecordError(
            f"{template.path}: run_shape.train_steps_per_rollout is "
            f"{template.run_shape.train_steps_per_rollout}; recording supports one train step "
            "per rollout (the recipe's); fix: use a template with one step per rollout"
        )


def record_baseline(
    evidence: RunEvidence,
    template: Baseline,
    *,
    variant: str,
    name: str,
    recorded_at: str,
    rollouts: int | None = None,
    allow_no_preflight: bool = False,
    schema_ref: str | None = None,
) -> dict[str, Any]:
    """The baseline JSON object recorded from ``evidence``, or :class:`RecordError`.

    ``template`` is the shipped baseline of ``variant`` (its rules are kept); ``rollouts``
    defaults to the template's; ``schema_ref`` becomes ``$schema`` when given. The result is
    checked with the loader (``parse_baseline``) and the gate (the run must pass it).
    """
    n = template.run_shape.rollouts if rollouts is None else rollouts
    _check_request(template, variant, name, n)
    check_sources(evidence)
    run_id = check_job(evidence)
    preflight = check_preflight(evidence, variant, allow_no_preflight)
    check_sentinels(evidence)
    recorded = recorded_series(evidence, template, n)
    rec = _Recording(evidence, template, variant, n, run_id, recorded_at)

    summaries, carried = _summaries(rec, recorded)
    flags = f" --num-rollouts {rollouts}" if rollouts is not None else ""
    flags += " --allow-no-preflight" if allow_no_preflight else ""
    source = f"miles-amd baseline record --run-dir {evidence.run_dir} --variant {variant}{flags}"
    description = (
        f"Run {run_id} of the gpt-oss-20b MoE LoRA GRPO recipe, aiter {variant}, {n} rollouts; "
        f"recorded by miles-amd baseline record with the rules of the shipped {variant} baseline."
    )
    draft = Baseline(
        name=name,
        path=f"<recorded from {evidence.run_dir}>",
        description=description,
        provenance=_provenance(rec, recorded, carried, preflight, source),
        run_shape=replace(template.run_shape, rollouts=n, looks=run_looks(template.run_shape, n)),
        series=recorded,
        summaries=summaries,
        rules=(),
    )
    digest = {"evidence_sha256": evidence_digest(draft)}  # what the loader checks when shipped
    draft = replace(draft, provenance={**draft.provenance, **digest})
    recorded_rules = tuple(_recorded_rule(rule, draft, rec) for rule in template.rules)
    document = replace(draft, rules=recorded_rules, schema_ref=schema_ref)
    _check_round_trip(document, evidence, n)
    return document.to_json()


def _check_round_trip(document: Baseline, evidence: RunEvidence, rollouts: int) -> None:
    """The run must pass the document (judged first: a broken run is refused as what it is),
    and the loader must accept its text (a rule the judge cannot evaluate is left to it)."""
    where = f"<recorded {document.name}>"
    try:
        verdict = judge(evidence, document, expected_rollouts=rollouts)
    except (KeyError, ValueError):
        verdict = None
    if verdict is not None and verdict.verdict != "pass":
        failed = [f"{c.name} ({c.detail})" for c in verdict.failures]
        shown = "; ".join(failed[:3]) + (
            f"; ... ({len(failed) - 3} more)" if len(failed) > 3 else ""
        )
        raise RecordError(
            f"--run-dir {evidence.run_dir}: the run fails the rules of its own recorded baseline: "
            f"{shown}; fix: record a run that passes the {document.name} rules (a spike, an "
            "off-grid reward or a clipped token is a broken run, not a reference)"
        )
    try:
        parse_baseline(baseline_json_text(document.to_json()), path=where)
    except BaselineError as exc:
        raise RecordError(
            f"--run-dir {evidence.run_dir}: the recorded baseline does not load ({exc}); "
            "fix: record a run the baseline's rules can be derived from"
        ) from exc


@dataclass(frozen=True)
class Candidate:
    """A trusted run of the key, as read back: its history id and its evidence."""

    run_id: int
    evidence: RunEvidence


def _level(candidate: Candidate) -> float:
    values = [v for _, v in candidate.evidence.series.get(PRIMARY, ())]
    return numeric.mean(values) if values else float("inf")


def pick_reference(
    candidates: Sequence[Candidate], key: str, *, passed_over: Sequence[str] = ()
) -> tuple[Candidate, list[Candidate]]:
    """The reference run (the median level) and the others; ``RecordError`` with fewer
    than :data:`MIN_TRUSTED_RUNS` (``passed_over``: why other runs did not count)."""
    if len(candidates) < MIN_TRUSTED_RUNS:
        why = f" ({'; '.join(passed_over)})" if passed_over else ""
        raise RecordError(
            f"--from-history: {len(candidates)} trusted run(s) of {key}{why}; a baseline needs "
            f"{MIN_TRUSTED_RUNS} (the median one is the reference, the others must pass it); "
            "fix: gate more runs of this key with --baseline auto into the history"
        )
    ordered = sorted(candidates, key=lambda c: (_level(c), c.run_id))
    reference = ordered[(len(ordered) - 1) // 2]
    return reference, [c for c in ordered if c is not reference]


def check_window(recorded: Baseline, others: Sequence[Candidate], key: str) -> None:
    """Every other trusted run passes the recorded baseline, else ``RecordError``."""
    rollouts = recorded.run_shape.rollouts
    for other in others:
        verdict = judge(other.evidence, recorded, expected_rollouts=rollouts)
        if verdict.verdict != "pass":
            failed = ", ".join(c.name for c in verdict.failures) or verdict.reason
            raise RecordError(
                f"--from-history: run {other.run_id} ({other.evidence.run_dir}), a trusted run "
                f"of {key}, fails the baseline recorded from the median run: {failed}; fix: "
                "mark it untrusted (miles-amd history mark-untrusted ID) if it is not a healthy "
                "run, or wait for more runs"
            )
