"""Record a baseline from a run: when a run may become one (else :class:`RecordError`, one line
naming the file or flag and the fix), and what the new file holds: the template's rules with
each band and spending boundary re-derived from the run, its series, summaries and provenance.
``--from-history``: the median of :data:`MIN_TRUSTED_RUNS` or more trusted runs of a key is the
reference, and every other must pass it. Explained in ``docs/cli.md``.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

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
_ALLOW = "or pass --allow-no-preflight to record anyway (noted in the provenance)"
_LOG_IT = "record a run that logs it (--use-tensorboard, MILES_CI_GATE_RECORD_DIR)"


class RecordError(ValueError):
    """A run that cannot become a baseline; ``str()`` is one line naming the file/flag and fix."""


def _refuse(where: object, what: str, fix: str) -> NoReturn:
    raise RecordError(f"{where}: {what}; fix: {fix}")


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


def _check_run(evidence: RunEvidence, variant: str, allow_no_preflight: bool) -> str:
    """Refuse a run whose sources, job, preflight or log cannot vouch for a reference; returns
    the preflight outcome for the provenance notes."""
    run, files = evidence.run_dir, RunDir(Path(evidence.run_dir))
    if evidence.problems:
        p = evidence.problems[0]
        what = f"unreadable evidence ({p.source}: {p.detail}; {len(evidence.problems)} problem(s)"
        _refuse(p.path, f"{what} in {run})", "record a run whose files are intact (a corrupt "
                "or truncated source cannot vouch for a reference)")  # fmt: skip
    if evidence.conflicts:
        c = evidence.conflicts[0]
        values = ", ".join(f"{src}={v!r}" for src, v in sorted(c.values.items()))
        _refuse(f"--run-dir {run}", f"its sources disagree on {c.metric} at step {c.step} "
                f"({values}; {len(evidence.conflicts)} conflict(s))",
                "record a run whose TensorBoard, CI history and job.log agree")  # fmt: skip
    job, env = evidence.job, evidence.env
    if job is None:
        _refuse(files.job_json, "missing, so the run's end state is unknown",
                "record a run the driver finished (miles-amd train writes job.json)")  # fmt: skip
    if job.status != "SUCCEEDED":
        why = f", stopped by {job.stopped_by}" if job.stopped_by else ""
        _refuse(files.job_json, f"the Ray job {job.job_id} ended {job.status}{why}, not "
                "SUCCEEDED", "record a run that finished all its rollouts")  # fmt: skip
    if env is None:
        if not allow_no_preflight:
            _refuse(files.env_json, "missing, so preflight did not run for this run",
                    f"run `miles-amd preflight --run-dir {run} --aiter-variant {variant}` "
                    f"before the run, {_ALLOW}")  # fmt: skip
        preflight = "not run (no env.json; recorded with --allow-no-preflight)"
    elif not env.ok:
        failing = [f"{fact.name} {fact.status}" for fact in env.failed]
        facts = ", ".join(failing) or "; ".join(env.problems) or '"ok" is not true'
        if not allow_no_preflight:
            _refuse(files.env_json, f"preflight did not pass ({facts})",
                    f"record a run whose preflight passed, {_ALLOW}")  # fmt: skip
        preflight = f"failed: {facts} (recorded with --allow-no-preflight)"
    elif env.aiter_variant is not None and env.aiter_variant != variant:
        _refuse(f"--variant {variant}", f"env.json records aiter_variant {env.aiter_variant!r} "
                "for this run", f"pass --variant {env.aiter_variant}")  # fmt: skip
    else:
        written = f" (env.json written_at {env.written_at})" if env.written_at else ""
        preflight = "passed" + written
    fatal = [hit for hit in evidence.sentinels if hit.severity == "fatal"]
    if fatal:
        _refuse(files.job_log, f"fatal log signature {fatal[0].name} ({fatal[0].count}x, first "
                f"at line {fatal[0].first_line})", "record a run whose log has no fatal "
                "signature")  # fmt: skip
    return preflight


def _recorded_series(
    evidence: RunEvidence, template: Baseline, rollouts: int
) -> dict[str, tuple[float, ...]]:
    """Every ruled metric the run logged, as a complete finite per-rollout series; an unlogged
    one only when no rule needs the run's values (optional, or a summary to carry over)."""
    run = f"--run-dir {evidence.run_dir}"
    recorded: dict[str, tuple[float, ...]] = {}
    for metric in dict.fromkeys(r.metric for r in template.rules if r.metric is not None):
        points = evidence.series.get(metric, ())
        if not points:
            rules = [r for r in template.rules if r.metric == metric]
            where = f"{run}: no {metric} in any source (TensorBoard, CI history, job.log)"
            if required := [r.id for r in rules if r.required]:
                rule = f"the {template.name} rule {required[0]}"
                raise RecordError(f"{where}, and {rule} requires it; fix: {_LOG_IT}")
            if uncarried := [
                r.id for r in rules if KINDS[r.kind].reference_series
                or (KINDS[r.kind].needs_spread and metric not in template.summaries)
            ]:  # fmt: skip
                raise RecordError(
                    f"{where}, and the {template.name} rule {uncarried[0]} needs the run's own "
                    f"series (the template has no summary to carry over); fix: {_LOG_IT}"
                )
            continue
        counts = Counter(step for step, _ in points)
        found = [
            f"{what} {_steps_text(steps)}"
            for what, steps in (
                ("missing steps", [s for s in range(rollouts) if s not in counts]),
                ("duplicated steps", [s for s, c in counts.items() if c > 1]),
                (f"steps outside 0..{rollouts - 1}:", [s for s in counts if not 0 <= s < rollouts]),
            )
            if steps
        ]
        if found:
            _refuse(run, f"{metric} is not one value at each step 0..{rollouts - 1} "
                    f"({'; '.join(found)}; the run logged {len(counts)} step(s))",
                    "record a run that finished all rollouts, or pass --num-rollouts with the "
                    "count the run was launched with")  # fmt: skip
        if bad := [(s, v) for s, v in points if not math.isfinite(v)]:
            _refuse(run, f"{metric} is {bad[0][1]!r} at step {bad[0][0]} ({len(bad)} non-finite "
                    "value(s))", "a run with non-finite values diverged and cannot be a "
                    "reference; record a healthy run")  # fmt: skip
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
    flat = (
        in_list
        and isinstance(value, Mapping)
        and value
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values())
    )
    if isinstance(value, Mapping) and value and not flat:
        items = [f"{pad}{json.dumps(k)}: {_dump(v, level + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    if isinstance(value, list) and any(isinstance(v, (Mapping, list)) for v in value):
        rows = (pad + _dump(v, level + 1, in_list=True) for v in value)
        return "[\n" + ",\n".join(rows) + "\n" + end + "]"
    return json.dumps(dict(value) if flat else value, ensure_ascii=False, allow_nan=False)


@dataclass(frozen=True)
class _Recording:
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
    return f"unrecorded (preflight {name}: {fact.status}{', ' + fact.value if fact.value else ''})"


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
    """The run's identity; an environment only from a preflight that passed."""
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
    """The template's rule with the params its kind re-derives from the recorded run."""
    kind = KINDS[rule.kind]
    params = dict(rule.params)
    try:
        if kind.rederive is not None:
            params.update(kind.rederive(rule, draft, rec.rollouts))
        looks = draft.run_shape.looks
        bounds = rule_boundaries(replace(rule, params=params), draft, rec.rollouts, looks)
        if bounds:
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
        _refuse(
            f"--run-dir {rec.evidence.run_dir}",
            f"rule {rule.id} cannot be derived from its {rule.metric or 'values'} "
            f"({' '.join(str(exc).split()) or type(exc).__name__})",
            "record a healthy run of the recipe (its values in their usual range)",
        )
    return replace(rule, params=params, derivation=derivation)


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
    """The baseline JSON object recorded from ``evidence`` with ``template``'s rules (the
    shipped baseline of ``variant``), or :class:`RecordError`; the run must pass the result
    and the loader accept it. ``schema_ref`` becomes ``$schema`` when given."""
    n = template.run_shape.rollouts if rollouts is None else rollouts
    if variant not in variants.BASELINE_VARIANTS:
        _refuse(f"--variant {variant}", "unknown",
                f"use one of {', '.join(variants.BASELINE_VARIANTS)}")  # fmt: skip
    if not NAME_PATTERN.match(name):
        _refuse(f"--name {name!r}", "a baseline name is lower case letters, digits, '_', '.', "
                "'-'", "pass --name with such a name (default: the variant)")  # fmt: skip
    if n < 2:
        _refuse(f"--num-rollouts {n}", "a spread needs 2 rollouts", "pass 2 or more")
    if (steps := template.run_shape.train_steps_per_rollout) != 1:
        _refuse(template.path, f"run_shape.train_steps_per_rollout is {steps}; recording "
                "supports one train step per rollout (the recipe's)",
                "use a template with one step per rollout")  # fmt: skip
    preflight = _check_run(evidence, variant, allow_no_preflight)
    assert evidence.job is not None
    run_id = evidence.job.job_id
    recorded = _recorded_series(evidence, template, n)
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
    # judged first (a broken run is refused as what it is); a rule the judge cannot evaluate
    # is left to the loader
    run = f"--run-dir {evidence.run_dir}"
    try:
        verdict = judge(evidence, document, expected_rollouts=n)
    except (KeyError, ValueError):
        verdict = None
    if verdict is not None and verdict.verdict != "pass":
        failed = [f"{c.name} ({c.detail})" for c in verdict.failures]
        more = f"; ... ({len(failed) - 3} more)" if len(failed) > 3 else ""
        _refuse(run, "the run fails the rules of its own recorded baseline: "
                f"{'; '.join(failed[:3])}{more}", f"record a run that passes the {name} rules "
                "(a spike, an off-grid reward or a clipped token is a broken run, not a "
                "reference)")  # fmt: skip
    try:
        parse_baseline(baseline_json_text(document.to_json()), path=f"<recorded {name}>")
    except BaselineError as exc:
        _refuse(run, f"the recorded baseline does not load ({exc})",
                "record a run the baseline's rules can be derived from")  # fmt: skip
    return document.to_json()


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
        fix = "gate more runs of this key with --baseline auto into the history"
        _refuse("--from-history", f"{len(candidates)} trusted run(s) of {key}{why}; a baseline "
                f"needs {MIN_TRUSTED_RUNS} (the median one is the reference, the others must "
                "pass it)", fix)  # fmt: skip
    ordered = sorted(candidates, key=lambda c: (_level(c), c.run_id))
    reference = ordered[(len(ordered) - 1) // 2]
    return reference, [c for c in ordered if c is not reference]


def check_window(recorded: Baseline, others: Sequence[Candidate], key: str) -> None:
    """Every other trusted run passes the recorded baseline, else ``RecordError``."""
    for other in others:
        verdict = judge(other.evidence, recorded, expected_rollouts=recorded.run_shape.rollouts)
        if verdict.verdict != "pass":
            failed = ", ".join(c.name for c in verdict.failures) or verdict.reason
            _refuse("--from-history", f"run {other.run_id} ({other.evidence.run_dir}), a trusted "
                    f"run of {key}, fails the baseline recorded from the median run: {failed}",
                    "mark it untrusted (miles-amd history mark-untrusted ID) if it is not a "
                    "healthy run, or wait for more runs")  # fmt: skip
