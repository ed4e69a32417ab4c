"""Record a baseline from a finished run, and diff two baselines for review.

Decides whether a run may become a reference, what the recorded baseline file holds, and
what a reviewer sees when two baselines are compared. Pure: :func:`record_baseline` takes a
run's :class:`~miles_amd.evidence.types.RunEvidence` (read by ``metrics.run_dir.load_run``) and the
shipped baseline of the same aiter variant as template, and returns the new file's JSON
object; :func:`diff_baselines` compares two loaded baselines. Writing the file (atomically)
and printing are ``miles_amd.cli.baseline``'s job; deriving bands is ``miles_amd.baseline.bands``'s.

A run is refused (:class:`RecordError`, one line naming the file or flag and the fix) when:

1. any source could not be read (a :class:`~miles_amd.evidence.types.SourceProblem`: a corrupt
   event file, bad JSON, an unreadable job.json or env.json) or two sources disagree (a
   :class:`~miles_amd.evidence.types.Conflict`);
2. ``job.json`` is missing, or the Ray job did not end ``SUCCEEDED``;
3. ``env.json`` is missing or its ``ok`` is not ``true`` (preflight did not run, or did not
   pass) -- unless ``allow_no_preflight`` (``--allow-no-preflight``: the embedded example and
   a CPU rehearsal have no GPUs to pass a preflight); the provenance then says so, never
   silently; ``env.json``'s ``aiter_variant``, when recorded, must equal the variant asked for;
4. ``job.log`` holds a ``fatal`` sentinel;
5. a metric a required rule names is absent, or any metric a rule names is present but not
   exactly steps ``0..N-1`` once each (``N`` = the rollouts asked for, default the template's
   ``run_shape.rollouts``, 20; one train step per rollout), or holds a NaN or infinity;
6. the run does not pass its own recorded baseline (``gate.judge``): a spike, an off-grid
   reward or a clipped token makes a broken run, not a reference.

The method (the file the gate later reads must be one the loader accepts unchanged):

- **Rules** are the template's: the same ids, kinds, required flags, rationales, thresholds,
  quanta, ``atol``, ``z`` and ``derive`` blocks (``k``, ``cover``), so only the reviewed rules
  gate runs. ``run_shape`` is the template's with ``rollouts = N``.
- **Evidence**: every metric a rule names that the run logged becomes ``evidence.series``
  (rollout 0 first) with a summary (``n``, ``min``, ``mean``, ``max``, and the count above the
  spike threshold where an ``all_below`` rule applies). Values are stored exactly as read
  (TensorBoard's are float32 roundings, e.g. ``0.020800000056624413``), so the recorded band
  centre is the run's own mean to the last bit. An optional metric the run did not log keeps
  the template's summary, marked in its ``note`` and in ``provenance.notes``.
- **Bands**: every ``mean_within``/``max_within`` band is derived for ``N`` rollouts by
  ``Baseline.band_for`` -- the very code the loader checks written bands with -- from the
  spread ``Baseline.spread`` takes (sample sd of the series; else the carried summary's),
  and its ``derivation`` text is rewritten with the new centre and sd. Other rules keep their
  derivation text (their tolerances do not depend on the reference run's values).
- **Provenance**: run id (job.json ``job_id``), job status and duration, hardware (the
  ``gpus`` fact), ROCm (``rocm``), image (an ``image`` fact, if preflight recorded one) and
  aiter (``aiter`` fact with the variant) from env.json, ``rollouts``/``optimizer_steps``,
  ``source`` (the recording command) and ``notes`` (``recorded_at``, the preflight outcome,
  where each series came from, what was carried over, known log signatures). The schema has
  no dedicated ``recorded_at``/``preflight`` field, so both are items of ``notes``.

The diff names, per rule, its tolerance (band with ``k`` and ``cover``, threshold, quantum,
``z``, expected steps) and the reference it is derived from (the spread of a band rule's
metric, the series of a paired rule) before and after, and which of kind, required flag,
tolerance and reference changed; plus rules added or removed and every ``name``,
``provenance`` and ``run_shape`` field before and after. Rows compare as printed: numbers
to 6 significant digits (band edges are 4-digit numbers, so shown exactly).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from miles_amd.baseline.bands import Band, expected_max
from miles_amd.baseline.model import (
    SHIPPED,
    Baseline,
    BaselineError,
    Rule,
    RunShape,
    parse_baseline,
)
from miles_amd.evidence.types import RunEvidence
from miles_amd.judge.gate import judge

NAME_PATTERN = re.compile(r"^[a-z0-9_.-]+$")
BAND_KINDS = ("mean_within", "max_within")
VARIANT_TEXT = {
    "stock": "stock (as shipped in the image, without ROCm/aiter#5694)",
    "patched": "patched (with the kernel fix ROCm/aiter#5694)",
}
_LIST_LIMIT = 8


class RecordError(ValueError):
    """A run that cannot become a baseline; ``str()`` is one line naming the file/flag and fix."""


# ---------------------------------------------------------------------------- refusals


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


def _check_sources(evidence: RunEvidence) -> None:
    run = evidence.run_dir
    if evidence.problems:
        first = evidence.problems[0]
        raise RecordError(
            f"{first.path}: unreadable evidence ({first.source}: {first.detail}; "
            f"{len(evidence.problems)} problem(s) in {run}); fix: record a run whose files are "
            "intact (a corrupt or truncated source cannot vouch for a reference)"
        )
    if evidence.conflicts:
        first = evidence.conflicts[0]
        values = ", ".join(f"{src}={v!r}" for src, v in sorted(first.values.items()))
        raise RecordError(
            f"--run-dir {run}: its sources disagree on {first.metric} at step {first.step} "
            f"({values}; {len(evidence.conflicts)} conflict(s)); fix: record a run whose "
            "TensorBoard, CI history and job.log agree"
        )


def _check_job(evidence: RunEvidence) -> str:
    """The run id; refuses a missing job.json or a job that did not succeed."""
    where = f"{evidence.run_dir}/job.json"
    job = evidence.job
    if job is None:
        raise RecordError(
            f"{where}: missing, so the run's end state is unknown; fix: record a run "
            "the driver finished (miles-amd train writes job.json)"
        )
    if job.status != "SUCCEEDED":
        stopped = job.extra.get("stopped_by")
        why = f", stopped by {stopped}" if stopped else ""
        raise RecordError(
            f"{where}: the Ray job {job.job_id} ended {job.status}{why}, not SUCCEEDED; "
            "fix: record a run that finished all its rollouts"
        )
    return job.job_id


def _facts(env: Mapping[str, object]) -> dict[str, Mapping[str, object]]:
    facts = env.get("facts")
    if not isinstance(facts, list):
        return {}
    return {str(f["name"]): f for f in facts if isinstance(f, Mapping) and "name" in f}


def _check_preflight(evidence: RunEvidence, variant: str, allow_no_preflight: bool) -> str:
    """The preflight outcome for ``provenance.notes``; refuses what the flags do not allow."""
    where = f"{evidence.run_dir}/env.json"
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
    if env.get("ok") is not True:
        failing = [
            f"{name} {fact.get('status')}"
            for name, fact in _facts(env).items()
            if fact.get("status") != "ok"
        ]
        facts = ", ".join(failing) or f'"ok" is {env.get("ok")!r}'
        if not allow_no_preflight:
            raise RecordError(
                f"{where}: preflight did not pass ({facts}); fix: record a run whose "
                f"preflight passed, {allow}"
            )
        return f"failed: {facts} (recorded with --allow-no-preflight)"
    recorded = env.get("aiter_variant")
    if recorded is not None and recorded != variant:
        raise RecordError(
            f"--variant {variant}: env.json records aiter_variant {recorded!r} for this run; "
            f"fix: pass --variant {recorded}"
        )
    written = env.get("written_at")
    return "passed" + (f" (env.json written_at {written})" if written else "")


def _check_sentinels(evidence: RunEvidence) -> None:
    fatal = [hit for hit in evidence.sentinels if hit.severity == "fatal"]
    if fatal:
        hit = fatal[0]
        raise RecordError(
            f"{evidence.run_dir}/job.log: fatal log signature {hit.name} ({hit.count}x, first "
            f"at line {hit.first_line}); fix: record a run whose log has no fatal signature"
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
        if r.kind == "paired_mean_diff"
        or (r.kind in BAND_KINDS and metric not in template.summaries)
    ]
    if uncarried:
        raise RecordError(
            f"{where}, and the {template.name} rule {uncarried[0]} needs the run's own series "
            f"(the template has no summary to carry over); {fix}"
        )


def _recorded_series(
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


# ---------------------------------------------------------------------------- the document


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _summary(
    metric: str, values: Sequence[float], template: Baseline, run_id: str, source: str
) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "n": len(values),
        "min": min(values),
        "mean": _mean(values),
        "max": max(values),
    }
    thresholds = [
        r.threshold
        for r in template.rules
        if r.metric == metric and r.kind == "all_below" and r.threshold is not None
    ]
    if thresholds:
        summary["above_spike_threshold"] = sum(v > min(thresholds) for v in values)
    summary["source"] = f"run {run_id}: the {source} series, rollouts 0..{len(values) - 1}"
    return summary


def _carried_summary(summary: Mapping[str, Any], template: Baseline, run_id: str) -> dict:
    carried = dict(summary)
    note = (
        f"carried over from the shipped {template.name} baseline (run {template.run_id}): "
        f"run {run_id} did not log this metric"
    )
    carried["note"] = f"{carried['note']}; {note}" if carried.get("note") else note
    return carried


def _fact_text(env: Mapping[str, object] | None, name: str) -> str:
    if env is None:
        return "unrecorded (no env.json)"
    fact = _facts(env).get(name)
    if fact is None:
        return f"unrecorded (env.json has no {name} fact)"
    value = str(fact.get("value") or "")
    if fact.get("status") == "ok" and value:
        return value
    return f"unrecorded (preflight {name}: {fact.get('status')}{', ' + value if value else ''})"


def _duration(start: float | None, end: float | None) -> str | None:
    if start is None or end is None or end < start:
        return None
    total = round(end - start)
    hours, rest = divmod(total, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{seconds:02d}s" if hours else f"{minutes}m{seconds:02d}s"


def _provenance(
    evidence: RunEvidence,
    template: Baseline,
    *,
    variant: str,
    rollouts: int,
    recorded: Mapping[str, tuple[float, ...]],
    carried: Sequence[str],
    preflight: str,
    source: str,
    recorded_at: str,
) -> dict[str, Any]:
    assert evidence.job is not None
    env = evidence.env
    if env is None or env.get("ok") is not True:
        aiter = f"{VARIANT_TEXT[variant]}; declared by --variant, no passing preflight"
    else:
        aiter = f"{VARIANT_TEXT[variant]}: {_fact_text(env, 'aiter')}"
        if env.get("aiter_variant") is None:
            aiter += "; variant declared by --variant, preflight recorded none"
    by_source: dict[str, list[str]] = {}
    for metric in recorded:
        by_source.setdefault(evidence.sources.get(metric, "unknown"), []).append(metric)
    notes = [
        f"recorded_at {recorded_at}",
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
    known = [f"{h.name} x{h.count}" for h in evidence.sentinels if h.severity == "known"]
    if known:
        notes.append(f"known log signatures: {', '.join(known)}")
    provenance: dict[str, Any] = {
        "run_id": evidence.job.job_id,
        "aiter": aiter,
        "hardware": _fact_text(env, "gpus"),
        "rocm": _fact_text(env, "rocm"),
        "image": _fact_text(env, "image"),
        "rollouts": rollouts,
        "optimizer_steps": rollouts * template.run_shape.train_steps_per_rollout,
        "job_status": evidence.job.status,
    }
    duration = _duration(evidence.job.start_time, evidence.job.end_time)
    if duration is not None:
        provenance["duration"] = duration
    provenance["source"] = source
    provenance["notes"] = "; ".join(notes)
    return provenance


def _band_derivation(rule: Rule, draft: Baseline, run_id: str, template: Baseline) -> str:
    """The derivation text of a band recomputed from the run's series."""
    assert rule.derive is not None and rule.metric is not None
    spread = draft.spread(rule.metric)
    n, derive = spread.n, rule.derive
    cover = "[" + ", ".join(f"{c:g}" for c in derive.cover) + "]"
    origin = (
        f"center {spread.mean:.6g}, per-rollout sd {spread.sd:.4g} (sample sd of the "
        f"{n}-rollout series of run {run_id}, recorded by miles-amd baseline record; k and "
        f"cover {cover} kept from the shipped {template.name} baseline)"
    )
    if derive.method == "mean_band":
        return (
            f"{origin}; band = center ± k·sd·sqrt(1/N + 1/{n}) with k = {derive.k:g}, "
            f"widened to cover {cover}; edges rounded outward to 4 significant digits; "
            "rescaled for N rollouts by miles_amd.baseline.bands.mean_band"
        )
    return (
        f"{origin}; upper bound = center + (E[max of N standard normals] + k)·sd with "
        f"k = {derive.k:g} (E = {expected_max(n):.4f} for N = {n}), raised to cover {cover}; "
        "no lower bound; rounded up to 4 significant digits; rescaled for N rollouts by "
        "miles_amd.baseline.bands.max_band"
    )


def _rule_entry(rule: Rule, band: Band | None, derivation: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": rule.id, "kind": rule.kind}
    if rule.metric is not None:
        entry["metric"] = rule.metric
    entry["required"] = rule.required
    for key in ("expected_status", "threshold", "quantum", "atol", "z"):
        value = getattr(rule, key)
        if value is not None:
            entry[key] = value
    if band is not None:
        entry["band"] = {"low": band.low, "high": band.high}
    if rule.derive is not None:
        entry["derive"] = {
            "method": rule.derive.method,
            "k": rule.derive.k,
            "cover": list(rule.derive.cover),
        }
    entry["rationale"] = rule.rationale
    entry["derivation"] = derivation
    return entry


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
    if variant not in SHIPPED:
        raise RecordError(f"--variant {variant}: unknown; fix: use one of {', '.join(SHIPPED)}")
    if not NAME_PATTERN.match(name):
        raise RecordError(
            f"--name {name!r}: a baseline name is lower case letters, digits, '_', '.', '-'; "
            "fix: pass --name with such a name (default: the --out file's stem)"
        )
    n = template.run_shape.rollouts if rollouts is None else rollouts
    if n < 2:
        raise RecordError(f"--num-rollouts {n}: a spread needs 2 rollouts; fix: pass 2 or more")
    if template.run_shape.train_steps_per_rollout != 1:
        raise RecordError(
            f"{template.path}: run_shape.train_steps_per_rollout is "
            f"{template.run_shape.train_steps_per_rollout}; recording supports one train step "
            "per rollout (the recipe's); fix: use a template with one step per rollout"
        )
    _check_sources(evidence)
    run_id = _check_job(evidence)
    preflight = _check_preflight(evidence, variant, allow_no_preflight)
    _check_sentinels(evidence)
    recorded = _recorded_series(evidence, template, n)

    summaries: dict[str, Any] = {}
    carried: list[str] = []
    for metric in dict.fromkeys(r.metric for r in template.rules if r.metric is not None):
        if metric in recorded:
            source = evidence.sources.get(metric, "unknown")
            summaries[metric] = _summary(metric, recorded[metric], template, run_id, source)
        elif metric in template.summaries:
            summaries[metric] = _carried_summary(template.summaries[metric], template, run_id)
            carried.append(metric)
    flags = f" --num-rollouts {rollouts}" if rollouts is not None else ""
    flags += " --allow-no-preflight" if allow_no_preflight else ""
    source = f"miles-amd baseline record --run-dir {evidence.run_dir} --variant {variant}{flags}"
    provenance = _provenance(
        evidence,
        template,
        variant=variant,
        rollouts=n,
        recorded=recorded,
        carried=carried,
        preflight=preflight,
        source=source,
        recorded_at=recorded_at,
    )
    shape = template.run_shape
    run_shape = RunShape(
        n,
        shape.train_steps_per_rollout,
        shape.samples_per_rollout,
        shape.prompts_per_rollout,
        shape.max_response_tokens,
    )
    description = (
        f"Run {run_id} of the gpt-oss-20b MoE LoRA GRPO recipe, aiter {variant}, {n} rollouts; "
        f"recorded by miles-amd baseline record with the rules of the shipped {variant} baseline."
    )
    draft = Baseline(
        name=name,
        path=f"<recorded from {evidence.run_dir}>",
        description=description,
        provenance=provenance,
        run_shape=run_shape,
        series=recorded,
        summaries=summaries,
        rules=(),
    )
    rules = []
    for rule in template.rules:
        band, derivation = None, rule.derivation
        if rule.kind in BAND_KINDS:
            band = draft.band_for(rule, n)
            if rule.metric in recorded:
                derivation = _band_derivation(rule, draft, run_id, template)
        rules.append(_rule_entry(rule, band, derivation))

    doc: dict[str, Any] = {} if schema_ref is None else {"$schema": schema_ref}
    doc.update(
        {
            "schema_version": 1,
            "name": name,
            "description": description,
            "provenance": provenance,
            "run_shape": {
                "rollouts": run_shape.rollouts,
                "train_steps_per_rollout": run_shape.train_steps_per_rollout,
                "samples_per_rollout": run_shape.samples_per_rollout,
                "prompts_per_rollout": run_shape.prompts_per_rollout,
                "max_response_tokens": run_shape.max_response_tokens,
            },
            "evidence": {
                "series": {m: list(vs) for m, vs in recorded.items()},
                "summaries": summaries,
            },
            "rules": rules,
        }
    )
    _check_round_trip(doc, evidence, n)
    return doc


def _check_round_trip(doc: Mapping[str, Any], evidence: RunEvidence, rollouts: int) -> None:
    """The loader must accept the document, and the run must pass it."""
    try:
        recorded = parse_baseline(baseline_json_text(doc), path=f"<recorded {doc['name']}>")
    except BaselineError as exc:
        raise RecordError(
            f"--run-dir {evidence.run_dir}: the recorded baseline does not load ({exc}); "
            "fix: report this as a miles_amd bug"
        ) from exc
    verdict = judge(evidence, recorded, expected_rollouts=rollouts)
    if verdict.verdict != "pass":
        failed = [f"{c.name} ({c.detail})" for c in verdict.failures]
        shown = "; ".join(failed[:3]) + (
            f"; ... ({len(failed) - 3} more)" if len(failed) > 3 else ""
        )
        raise RecordError(
            f"--run-dir {evidence.run_dir}: the run fails the rules of its own recorded baseline: "
            f"{shown}; fix: record a run that passes the {doc['name']} rules (a spike, an "
            "off-grid reward or a clipped token is a broken run, not a reference)"
        )


def baseline_json_text(doc: Mapping[str, Any]) -> str:
    """The document as a baseline file: 2-space indent, number lists on one line, UTF-8."""
    return _dump(doc, 0) + "\n"


def _dump(value: Any, level: int) -> str:
    pad, end = "  " * (level + 1), "  " * level
    if isinstance(value, Mapping) and value:
        items = [f"{pad}{json.dumps(k)}: {_dump(v, level + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    if isinstance(value, list) and any(isinstance(v, (Mapping, list)) for v in value):
        items = [f"{pad}{_dump(v, level + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + "\n" + end + "]"
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


# ---------------------------------------------------------------------------- the diff

Aspect = Literal["kind", "required", "tolerance", "reference"]
RowChange = Literal["same", "changed", "added", "removed"]


@dataclass(frozen=True)
class RuleView:
    """One rule as a reviewer reads it."""

    kind: str
    metric: str | None
    required: bool
    tolerance: str  # the band (with k and cover), threshold, grid, ... it judges with
    reference: str  # the reference data the tolerance is derived from, "-" when none


@dataclass(frozen=True)
class RuleRow:
    rule_id: str
    before: RuleView | None
    after: RuleView | None

    @property
    def metric(self) -> str | None:
        view = self.after or self.before
        assert view is not None
        return view.metric

    @property
    def aspects(self) -> tuple[Aspect, ...]:
        """What changed between before and after (empty for added/removed/same rows)."""
        if self.before is None or self.after is None:
            return ()
        names: tuple[Aspect, ...] = ("kind", "required", "tolerance", "reference")
        return tuple(a for a in names if getattr(self.before, a) != getattr(self.after, a))

    @property
    def change(self) -> RowChange:
        if self.before is None:
            return "added"
        if self.after is None:
            return "removed"
        return "changed" if self.aspects else "same"


@dataclass(frozen=True)
class FieldRow:
    field: str
    before: str | None  # None: absent on that side
    after: str | None

    @property
    def changed(self) -> bool:
        return self.before != self.after


@dataclass(frozen=True)
class BaselineDiff:
    old: str  # "name (path, run id)"
    new: str
    rules: tuple[RuleRow, ...]
    fields: tuple[FieldRow, ...]

    def rows(self, change: RowChange) -> tuple[RuleRow, ...]:
        return tuple(r for r in self.rules if r.change == change)


def _num(value: float | None) -> str:
    return "none" if value is None else f"{value:.6g}"


def _tolerance(rule: Rule, baseline: Baseline) -> str:
    n = baseline.run_shape.rollouts
    if rule.kind == "job_status":
        return f"status {rule.expected_status}"
    if rule.kind == "steps_complete":
        return f"steps 0..{n - 1} each once"
    if rule.kind == "finite":
        return "every value finite"
    if rule.kind == "all_below":
        return f"no value above {_num(rule.threshold)}"
    if rule.kind in BAND_KINDS:
        assert rule.band is not None and rule.derive is not None
        cover = ", ".join(_num(c) for c in rule.derive.cover)
        return (
            f"band [{_num(rule.band.low)}, {_num(rule.band.high)}] for {n} rollouts "
            f"(k {_num(rule.derive.k)}, cover [{cover}])"
        )
    if rule.kind == "multiple_of":
        return f"multiples of {_num(rule.quantum)} ± {_num(rule.atol)}"
    if rule.kind == "near_zero":
        return f"|value| ≤ {_num(rule.atol)}"
    return f"|mean paired difference| ≤ {_num(rule.z)} SE"


def _reference(rule: Rule, baseline: Baseline) -> str:
    metric = rule.metric
    if metric is None:
        return "-"
    if rule.kind in BAND_KINDS:
        spread = baseline.spread(metric)
        text = f"mean {_num(spread.mean)}, sd {_num(spread.sd)}, n {spread.n} ({spread.how})"
        if rule.kind == "max_within":
            values = baseline.series.get(metric)
            top = max(values) if values else baseline.summaries.get(metric, {}).get("max")
            text += f", max {_num(top)}" if top is not None else ""
        return text
    if rule.kind == "paired_mean_diff":
        values = baseline.series[metric]
        return f"series of {len(values)} rollouts, mean {_num(_mean(values))}"
    return "-"


def _view(rule: Rule, baseline: Baseline) -> RuleView:
    return RuleView(
        rule.kind,
        rule.metric,
        rule.required,
        _tolerance(rule, baseline),
        _reference(rule, baseline),
    )


def _field_values(baseline: Baseline) -> dict[str, str]:
    values = {"name": baseline.name}
    values.update({f"provenance.{k}": str(v) for k, v in baseline.provenance.items()})
    shape = baseline.run_shape
    for key in (
        "rollouts",
        "train_steps_per_rollout",
        "samples_per_rollout",
        "prompts_per_rollout",
        "max_response_tokens",
    ):
        values[f"run_shape.{key}"] = str(getattr(shape, key))
    return values


def _label(baseline: Baseline) -> str:
    return f"{baseline.name} ({baseline.path}, run {baseline.run_id})"


def diff_baselines(old: Baseline, new: Baseline) -> BaselineDiff:
    """Rule by rule and field by field, ``old`` against ``new`` (old's order, added last)."""
    old_rules = {r.id: r for r in old.rules}
    new_rules = {r.id: r for r in new.rules}
    rows = []
    for rule_id in dict.fromkeys([*old_rules, *new_rules]):
        before = old_rules.get(rule_id)
        after = new_rules.get(rule_id)
        rows.append(
            RuleRow(
                rule_id,
                None if before is None else _view(before, old),
                None if after is None else _view(after, new),
            )
        )
    old_fields, new_fields = _field_values(old), _field_values(new)
    fields = tuple(
        FieldRow(key, old_fields.get(key), new_fields.get(key))
        for key in dict.fromkeys([*old_fields, *new_fields])
    )
    return BaselineDiff(_label(old), _label(new), tuple(rows), fields)


def _counts(diff: BaselineDiff) -> str:
    tolerance = sum("tolerance" in r.aspects for r in diff.rules)
    return (
        f"{sum(r.before is not None for r in diff.rules)} rules before, "
        f"{sum(r.after is not None for r in diff.rules)} after: {tolerance} tolerance(s) "
        f"changed, {len(diff.rows('changed'))} row(s) changed, {len(diff.rows('added'))} "
        f"added, {len(diff.rows('removed'))} removed"
    )


def _aspect(view: RuleView, aspect: Aspect) -> str:
    if aspect == "required":
        return "required" if view.required else "optional"
    return str(getattr(view, aspect))


def _pair(before: str | None, after: str | None) -> str:
    if before == after:
        return f"{before} (unchanged)"
    return f"{before if before is not None else '(absent)'} -> {after or '(absent)'}"


def render_text(diff: BaselineDiff) -> str:
    """The diff for a terminal: '*' marks a changed, added or removed rule or field.

    An unchanged rule is one line; a changed one shows each changed aspect before -> after.
    """
    lines = [
        f"baseline diff: {diff.old} -> {diff.new}",
        _counts(diff) + " ('*' marks a change)",
        "",
        "rules:",
    ]
    for row in diff.rules:
        view = row.after or row.before
        assert view is not None
        head = f"{row.rule_id} [{view.kind}, {'required' if view.required else 'optional'}]"
        head += f" {view.metric}" if view.metric else ""
        if row.change == "same":
            lines.append(f"  {head}: {view.tolerance} (unchanged)")
            continue
        if row.change in ("added", "removed"):
            lines.append(f"* {head} RULE {row.change.upper()}")
            lines.append(f"    tolerance: {view.tolerance}")
            lines.append(f"    reference: {view.reference}")
            continue
        assert row.before is not None and row.after is not None
        lines.append(f"* {head} CHANGED: {', '.join(row.aspects)}")
        for aspect in ("kind", "required"):
            if aspect in row.aspects:
                before, after = _aspect(row.before, aspect), _aspect(row.after, aspect)
                lines.append(f"    {aspect}: {before} -> {after}")
        lines.append(f"    tolerance: {_pair(row.before.tolerance, row.after.tolerance)}")
        lines.append(f"    reference: {_pair(row.before.reference, row.after.reference)}")
    lines += ["", "provenance and run shape:"]
    for field_row in diff.fields:
        mark = "*" if field_row.changed else " "
        lines.append(f"{mark} {field_row.field}: {_pair(field_row.before, field_row.after)}")
    return "\n".join(lines) + "\n"


def _cell(text: str | None) -> str:
    if text is None:
        return "_(absent)_"
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(diff: BaselineDiff) -> str:
    """The diff as a PR comment: one table of rules, one of provenance and run shape."""
    lines = [
        f"### Baseline diff: `{diff.old}` → `{diff.new}`",
        "",
        _counts(diff) + ".",
        "",
        "| | rule | metric | change | tolerance before | tolerance after "
        "| reference before | reference after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in diff.rules:
        mark = "" if row.change == "same" else "**\\***"
        before, after = row.before, row.after
        change = {"same": "", "added": "**added**", "removed": "**removed**"}.get(row.change, "")
        if before is not None and after is not None and row.aspects:
            change = "**changed**: " + ", ".join(
                f"{a} ({_aspect(before, a)} → {_aspect(after, a)})"
                if a in ("kind", "required")
                else a
                for a in row.aspects
            )
        lines.append(
            f"| {mark} | `{row.rule_id}` | `{row.metric or '-'}` | {change} "
            f"| {_cell(before.tolerance if before else None)} "
            f"| {_cell(after.tolerance if after else None)} "
            f"| {_cell(before.reference if before else None)} "
            f"| {_cell(after.reference if after else None)} |"
        )
    lines += ["", "| | field | before | after |", "|---|---|---|---|"]
    for field_row in diff.fields:
        mark = "**\\***" if field_row.changed else ""
        lines.append(
            f"| {mark} | `{field_row.field}` | {_cell(field_row.before)} "
            f"| {_cell(field_row.after)} |"
        )
    return "\n".join(lines) + "\n"


def render_diff(diff: BaselineDiff, fmt: str) -> str:
    """``text`` or ``markdown``."""
    return render_markdown(diff) if fmt == "markdown" else render_text(diff)


def changed_bands(diff: BaselineDiff) -> tuple[str, ...]:
    """Ids of band rules whose band (tolerance) changed between the two baselines."""
    return tuple(
        r.rule_id
        for r in diff.rules
        if "tolerance" in r.aspects and r.after is not None and r.after.kind in BAND_KINDS
    )
