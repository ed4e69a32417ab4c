"""Record a baseline from a finished run: what the new baseline file holds.

- Pure: :func:`record_baseline` takes a run's :class:`~miles_amd.evidence.types.RunEvidence`
  and the shipped baseline of the same aiter variant as template, and returns the new
  file's JSON object, in the shape ``rules.model.Baseline.to_json`` spells and the loader
  reads (``tests/unit/test_baseline_shape.py``).
- Rules and ``run_shape`` are the template's (``rollouts = N``, looks re-made for ``N``);
  each spending rule's boundaries are re-derived at those looks.
- Evidence: each ruled metric the run logged, stored exactly as read, with its summary; an
  optional metric the run did not log keeps the template's, marked in its ``note``.
- Bands (``BandParams``) are re-derived for ``N`` rollouts by ``rules.bands.band_for``
  (what the loader checks them with), their derivation text rewritten.
- Provenance: run id, job status and duration, hardware, ROCm, image and aiter from job.json
  and env.json; ``environment`` (``judge.environment.run_environment``); recording notes.
- One refusal is decided here: the run must pass its own recorded baseline; the others are
  ``miles_amd.baseline.refusals``'.

Caveats:

- Values are TensorBoard's float32 roundings, so the band centre is the run's own mean.
- The schema has no ``recorded_at``/``preflight`` field; both are items of ``notes``.
- The file's text is ``baseline.json_text``'s; writing it is ``cli.baseline``'s.

Explained in ``docs/cli.md`` ("What a recorded baseline holds").
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from miles_amd import variants
from miles_amd.baseline import refusals
from miles_amd.baseline.json_text import baseline_json_text
from miles_amd.baseline.model import BaselineError, parse_baseline
from miles_amd.baseline.refusals import RecordError
from miles_amd.baseline.shipped import evidence_digest
from miles_amd.evidence.types import EnvRecord, RunEvidence
from miles_amd.judge.environment import Environment, run_environment
from miles_amd.judge.gate import judge
from miles_amd.rules import bands
from miles_amd.rules.bands import BandParams
from miles_amd.rules.looks import run_looks
from miles_amd.rules.model import BOUNDARIES, Baseline, Rule
from miles_amd.rules.registry import KINDS, rule_boundaries

__all__ = ["NAME_PATTERN", "RecordError", "record_baseline"]

NAME_PATTERN = re.compile(r"^[a-z0-9_.-]+$")


@dataclass(frozen=True)
class _Recording:
    """What one recording is about: the run, its template, and the flags it was asked with."""

    evidence: RunEvidence
    template: Baseline
    variant: str
    rollouts: int
    run_id: str
    recorded_at: str


# ---------------------------------------------------------------------------- evidence


def _summary(metric: str, values: Sequence[float], rec: _Recording, source: str) -> dict:
    summary: dict[str, Any] = {
        "n": len(values),
        "min": min(values),
        "mean": math.fsum(values) / len(values),
        "max": max(values),
    }
    for rule in rec.template.rules:
        add = KINDS[rule.kind].summary
        if rule.metric == metric and add is not None:
            summary.update(add(rule, list(values)))
    summary["source"] = f"run {rec.run_id}: the {source} series, rollouts 0..{len(values) - 1}"
    return summary


def _carried_summary(summary: Mapping[str, Any], rec: _Recording) -> dict:
    carried = dict(summary)
    note = (
        f"carried over from the shipped {rec.template.name} baseline (run "
        f"{rec.template.run_id}): run {rec.run_id} did not log this metric"
    )
    carried["note"] = f"{carried['note']}; {note}" if carried.get("note") else note
    return carried


def _summaries(rec: _Recording, recorded: Mapping[str, tuple[float, ...]]):
    """(summaries, metrics carried over from the template)."""
    summaries: dict[str, Any] = {}
    carried: list[str] = []
    for metric in dict.fromkeys(r.metric for r in rec.template.rules if r.metric is not None):
        if metric in recorded:
            source = rec.evidence.sources.get(metric, "unknown")
            summaries[metric] = _summary(metric, recorded[metric], rec, source)
        elif metric in rec.template.summaries:
            summaries[metric] = _carried_summary(rec.template.summaries[metric], rec)
            carried.append(metric)
    return summaries, carried


# ---------------------------------------------------------------------------- provenance


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


def _duration(start: float | None, end: float | None) -> str | None:
    if start is None or end is None or end < start:
        return None
    total = round(end - start)
    hours, rest = divmod(total, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{seconds:02d}s" if hours else f"{minutes}m{seconds:02d}s"


def _aiter_text(env: EnvRecord | None, variant: str) -> str:
    if env is None or not env.ok:
        return f"{variants.describe(variant)}; declared by --variant, no passing preflight"
    text = f"{variants.describe(variant)}: {_fact_text(env, 'aiter')}"
    if env.aiter_variant is None:
        text += "; variant declared by --variant, preflight recorded none"
    return text


def _environment(env: EnvRecord | None, variant: str) -> dict[str, object]:
    """The identity to compare later runs with: none from a preflight that did not pass (its
    readings cannot vouch for hardware; the gate fails such an env.json)."""
    found = run_environment(env) if env is not None and env.ok else Environment()
    return replace(found, aiter_variant=variant).to_json()


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
    job, env = rec.evidence.job, rec.evidence.env
    assert job is not None
    provenance: dict[str, Any] = {
        "run_id": job.job_id,
        "aiter": _aiter_text(env, rec.variant),
        "environment": _environment(env, rec.variant),
        "hardware": _fact_text(env, "gpus"),
        "rocm": _fact_text(env, "rocm"),
        "image": _fact_text(env, "image"),
        "rollouts": rec.rollouts,
        "optimizer_steps": rec.rollouts * rec.template.run_shape.train_steps_per_rollout,
        "job_status": job.status,
    }
    duration = _duration(job.start_time, job.end_time)
    if duration is not None:
        provenance["duration"] = duration
    provenance["source"] = source
    provenance["notes"] = _notes(rec, recorded, carried, preflight)
    return provenance


# ---------------------------------------------------------------------------- rules


def _band_derivation(rule: Rule, draft: Baseline, rec: _Recording) -> str:
    """The derivation text of a band recomputed from the run's series."""
    assert rule.metric is not None
    derive = BandParams.of(rule).derive
    spread = bands.spread_of(draft, rule.metric)
    cover = "[" + ", ".join(f"{c:g}" for c in derive.cover) + "]"
    origin = (
        f"center {spread.mean:.6g}, per-rollout sd {spread.sd:.4g} (sample sd of the "
        f"{spread.n}-rollout series of run {rec.run_id}, recorded by miles-amd baseline "
        f"record; k and cover {cover} kept from the shipped {rec.template.name} baseline)"
    )
    return bands.derivation_text(
        derive.method, origin, spread.n, derive.k, cover, derive.run_sd, derive.rho
    )


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
        if kind.params is BandParams and rule.metric in draft.series:
            derivation = _band_derivation(rule, draft, rec)
    except (ArithmeticError, ValueError, KeyError) as exc:
        raise RecordError(
            f"--run-dir {rec.evidence.run_dir}: rule {rule.id} cannot be derived from its "
            f"{rule.metric or 'values'} ({' '.join(str(exc).split()) or type(exc).__name__}); "
            "fix: record a healthy run of the recipe (its values in their usual range)"
        ) from None
    return replace(rule, params=params, derivation=derivation)


# ---------------------------------------------------------------------------- the document


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


def _source(rec: _Recording, asked_rollouts: int | None, allow_no_preflight: bool) -> str:
    flags = f" --num-rollouts {asked_rollouts}" if asked_rollouts is not None else ""
    flags += " --allow-no-preflight" if allow_no_preflight else ""
    return (
        f"miles-amd baseline record --run-dir {rec.evidence.run_dir} --variant {rec.variant}{flags}"
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
    refusals.check_sources(evidence)
    run_id = refusals.check_job(evidence)
    preflight = refusals.check_preflight(evidence, variant, allow_no_preflight)
    refusals.check_sentinels(evidence)
    recorded = refusals.recorded_series(evidence, template, n)
    rec = _Recording(evidence, template, variant, n, run_id, recorded_at)

    summaries, carried = _summaries(rec, recorded)
    source = _source(rec, rollouts, allow_no_preflight)
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
    """The run must pass the document, and the loader must accept its file text.

    Judged first, so a broken run (a spike above a threshold, which the loader would also
    refuse as a threshold below the reference's max) is refused as what it is; a document
    one of whose rules cannot be evaluated at all (a zero logprob gap has no logarithm for
    ``step_rise``) is left to the loader, which names the value and the fix.
    """
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
