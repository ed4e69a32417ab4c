"""Baseline files: find, parse, validate and type them.

A baseline (``baselines/gpt_oss_20b_lora/<name>.json``) holds one reference run's published
evidence, its provenance and the acceptance rules the gate applies, each with its tolerance,
a one-line rationale and how the number was derived. This module decides what a valid
baseline is; it does not judge runs (``miles_amd.judge.gate``) and does not derive bands
(``miles_amd.baseline.bands``), it only checks that the bands in the file are the ones the method
gives.

A file is valid when, in order:

1. it is strict JSON (no ``NaN``/``Infinity``) and matches
   ``src/miles_amd/baseline/baseline.schema.json`` (Draft 2020-12);
2. rule ids are unique; every metric a rule names has a ``finite`` and a ``steps_complete``
   rule, required whenever any rule on that metric is required (so "every gated value
   finite, every step present" cannot be forgotten);
3. at least one required ``steps_complete`` rule exists (a gate that demands no complete
   series could pass without evidence);
4. every per-rollout series has ``run_shape.rollouts`` values; a ``paired_mean_diff`` rule's
   metric has a series; every ``mean_within``/``max_within`` rule's metric has a series or a
   summary its spread can be taken from;
5. the ``band`` written in each ``mean_within``/``max_within`` rule equals the band its
   ``derive`` block gives for ``run_shape.rollouts`` (bands come from data, not from taste).

Every error is one line: ``<file>: <JSON path>: <what is wrong>; fix: <what to do>``.

Where shipped baselines live: ``$MILES_AMD_BASELINES_DIR/gpt_oss_20b_lora/`` when that
variable is set (it names a ``baselines/`` root), else the package data
``miles_amd/baseline/shipped-baselines/gpt_oss_20b_lora/`` (``miles_amd.package_data``: in
the repo a link to the top-level ``baselines/``, in an installed wheel a copy of it).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

from miles_amd.baseline import bands
from miles_amd.baseline.bands import Band, Spread
from miles_amd.package_data import package_path

RECIPE_DIR = "gpt_oss_20b_lora"
SHIPPED = ("stock", "patched")
BASELINES_DIR_ENV = "MILES_AMD_BASELINES_DIR"
SCHEMA_PATH = package_path("miles_amd.baseline", "baseline.schema.json")

RuleKind = Literal[
    "job_status",
    "steps_complete",
    "finite",
    "all_below",
    "mean_within",
    "max_within",
    "multiple_of",
    "near_zero",
    "paired_mean_diff",
]


class BaselineError(ValueError):
    """A baseline that cannot be used; ``str()`` is one line naming the file, field and fix."""


@dataclass(frozen=True)
class Derive:
    """How a rule's band is computed from the baseline's evidence (``miles_amd.baseline.bands``)."""

    method: Literal["mean_band", "max_band"]
    k: float
    cover: tuple[float, ...] = ()


@dataclass(frozen=True)
class Rule:
    """One acceptance rule. Which optional fields are set depends on ``kind``."""

    id: str
    kind: RuleKind
    metric: str | None
    required: bool
    rationale: str
    derivation: str
    expected_status: str | None = None
    threshold: float | None = None
    band: Band | None = None
    derive: Derive | None = None
    quantum: float | None = None
    atol: float | None = None
    z: float | None = None


@dataclass(frozen=True)
class RunShape:
    rollouts: int  # default expected rollouts: rollout/step 0..rollouts-1
    train_steps_per_rollout: int
    samples_per_rollout: int
    prompts_per_rollout: int
    max_response_tokens: int


@dataclass(frozen=True)
class Baseline:
    """A validated baseline. ``series[m][i]`` is the reference value of ``m`` at rollout ``i``."""

    name: str
    path: str
    description: str
    provenance: Mapping[str, Any]
    run_shape: RunShape
    series: Mapping[str, tuple[float, ...]]
    summaries: Mapping[str, Mapping[str, Any]]
    rules: tuple[Rule, ...]

    @property
    def run_id(self) -> str:
        return str(self.provenance["run_id"])

    def spread(self, metric: str) -> Spread:
        """Per-rollout spread of ``metric`` in the reference run (see ``miles_amd.baseline.bands``).

        Series first; else a summary's stated ``sd``, its min/max, or its bounds.
        """
        if metric in self.series:
            return bands.series_spread(self.series[metric])
        summary = self.summaries.get(metric)
        if summary is None:
            raise KeyError(f"no series or summary for {metric}")
        mean, n = float(summary["mean"]), int(summary["n"])
        if "sd" in summary:
            return Spread(mean, float(summary["sd"]), n, str(summary["sd_source"]))
        if "min" in summary and "max" in summary:
            return bands.range_spread(mean, float(summary["min"]), float(summary["max"]), n)
        if "bounds" in summary:
            lower, upper = (float(b) for b in summary["bounds"])
            groups = self.run_shape.prompts_per_rollout
            return bands.bounded_spread(mean, lower, upper, groups=groups, n=n)
        raise KeyError(f"summary of {metric} has no sd, min/max or bounds")

    def band_for(self, rule: Rule, n_rollouts: int) -> Band:
        """The band of a ``mean_within``/``max_within`` rule for a run of ``n_rollouts``.

        For ``n_rollouts == run_shape.rollouts`` this is the band written in the file (the
        loader checked they agree); other counts rescale it with the same method.
        """
        if rule.derive is None or rule.metric is None:
            raise ValueError(f"rule {rule.id} has no derive block")
        spread = self.spread(rule.metric)
        if rule.derive.method == "mean_band":
            return bands.mean_band(spread, n_rollouts, rule.derive.k, rule.derive.cover)
        return bands.max_band(spread, n_rollouts, rule.derive.k, rule.derive.cover)


def baselines_root() -> Path:
    """The ``baselines/`` root: ``$MILES_AMD_BASELINES_DIR``, else the shipped package data."""
    override = os.environ.get(BASELINES_DIR_ENV)
    if override:
        return Path(override)
    return package_path("miles_amd.baseline", "shipped-baselines")


def resolve_baseline_path(spec: str | os.PathLike[str]) -> Path:
    """``stock``/``patched`` -> the shipped file; anything else is a path to a baseline file."""
    text = os.fspath(spec)
    if text in SHIPPED:
        path = baselines_root() / RECIPE_DIR / f"{text}.json"
        if not path.is_file():
            raise BaselineError(
                f"{path}: shipped baseline {text!r} not found; fix: set {BASELINES_DIR_ENV} "
                "to the repo's baselines/ directory, or pass --baseline PATH"
            )
        return path
    path = Path(text)
    if not path.is_file():
        raise BaselineError(
            f"{path}: no such baseline file; fix: use --baseline stock, --baseline patched "
            "or the path of a baseline JSON file"
        )
    return path


def load_baseline(spec: str | os.PathLike[str]) -> Baseline:
    """Load and validate ``stock``, ``patched`` or a baseline file path; see the module doc."""
    path = resolve_baseline_path(spec)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{path}: cannot read ({exc}); fix: check the file") from exc
    return parse_baseline(text, path=str(path))


def parse_baseline(text: str, *, path: str) -> Baseline:
    """Validate baseline JSON ``text`` (``path`` only names it in errors)."""
    try:
        raw = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise BaselineError(
            f"{path}: line {exc.lineno} column {exc.colno}: invalid JSON ({exc.msg}); "
            "fix: correct the JSON syntax there"
        ) from exc
    except ValueError as exc:
        raise BaselineError(f"{path}: {exc}; fix: write a finite number") from exc
    _validate_schema(raw, path)
    baseline = _build(raw, path)
    _check_consistency(baseline, path)
    return baseline


def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name} in the file")


@cache
def _validator():
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


_FIXES = {
    "required": "add the missing field",
    "additionalProperties": "remove the field or correct its spelling",
    "type": "use the type the schema names",
    "enum": "use one of the allowed values",
    "const": "use the value the schema names",
    "pattern": "match the pattern the schema names",
    "minItems": "add values",
    "maxItems": "remove values",
    "minimum": "use a larger value",
    "exclusiveMinimum": "use a larger value",
    "minLength": "write a non-empty value",
    "not": "remove the field (this kind takes none)",
    "dependentRequired": "add the field it depends on",
}


def _validate_schema(raw: object, path: str) -> None:
    import jsonschema

    errors = list(_validator().iter_errors(raw))
    if not errors:
        return
    error = jsonschema.exceptions.best_match(errors)
    # Descend into if/then branches so the message names the innermost field.
    while error.context:
        error = jsonschema.exceptions.best_match(error.context)
    fix = _FIXES.get(str(error.validator), "see src/miles_amd/baseline/baseline.schema.json")
    message = " ".join(error.message.split())
    forbidden = error.validator_value.get("required") if error.validator == "not" else None
    if forbidden:
        message = f"this kind takes no {', '.join(repr(f) for f in forbidden)}"
    if len(message) > 200:
        message = message[:197] + "..."
    raise BaselineError(f"{path}: {error.json_path}: {message}; fix: {fix}")


def _build(raw: Mapping[str, Any], path: str) -> Baseline:
    shape = raw["run_shape"]
    rules = []
    for entry in raw["rules"]:
        band = entry.get("band")
        derive = entry.get("derive")
        rules.append(
            Rule(
                id=entry["id"],
                kind=entry["kind"],
                metric=entry.get("metric"),
                required=entry["required"],
                rationale=entry["rationale"],
                derivation=entry["derivation"],
                expected_status=entry.get("expected_status"),
                threshold=entry.get("threshold"),
                band=None if band is None else Band(band["low"], band["high"]),
                derive=None
                if derive is None
                else Derive(derive["method"], derive["k"], tuple(derive.get("cover", ()))),
                quantum=entry.get("quantum"),
                atol=entry.get("atol"),
                z=entry.get("z"),
            )
        )
    return Baseline(
        name=raw["name"],
        path=path,
        description=raw["description"],
        provenance=dict(raw["provenance"]),
        run_shape=RunShape(
            rollouts=shape["rollouts"],
            train_steps_per_rollout=shape["train_steps_per_rollout"],
            samples_per_rollout=shape["samples_per_rollout"],
            prompts_per_rollout=shape["prompts_per_rollout"],
            max_response_tokens=shape["max_response_tokens"],
        ),
        series={m: tuple(float(v) for v in vs) for m, vs in raw["evidence"]["series"].items()},
        summaries={m: dict(s) for m, s in raw["evidence"]["summaries"].items()},
        rules=tuple(rules),
    )


def _check_consistency(baseline: Baseline, path: str) -> None:
    def fail(where: str, what: str, fix: str) -> BaselineError:
        return BaselineError(f"{path}: {where}: {what}; fix: {fix}")

    n = baseline.run_shape.rollouts
    for metric, values in baseline.series.items():
        if len(values) != n:
            raise fail(
                f"$.evidence.series['{metric}']",
                f"{len(values)} values for {n} rollouts",
                "give one value per rollout, rollout 0 first, or correct run_shape.rollouts",
            )
    seen: dict[str, int] = {}
    for index, rule in enumerate(baseline.rules):
        if rule.id in seen:
            raise fail(
                f"$.rules[{index}].id",
                f"duplicate id {rule.id!r} (also rules[{seen[rule.id]}])",
                "give every rule its own id",
            )
        seen[rule.id] = index
    if not any(r.kind == "steps_complete" and r.required for r in baseline.rules):
        raise fail(
            "$.rules",
            "no required steps_complete rule",
            "require at least one metric's steps, or the gate could pass without evidence",
        )
    for metric in sorted({r.metric for r in baseline.rules if r.metric is not None}):
        on_metric = [r for r in baseline.rules if r.metric == metric]
        needs_required = any(r.required for r in on_metric)
        for kind in ("finite", "steps_complete"):
            guards = [r for r in on_metric if r.kind == kind]
            if not guards:
                raise fail(
                    "$.rules",
                    f"metric {metric} is gated but has no {kind} rule",
                    f'add {{"kind": "{kind}", "metric": "{metric}", ...}}',
                )
            if needs_required and not any(r.required for r in guards):
                raise fail(
                    f"$.rules[{baseline.rules.index(guards[0])}].required",
                    f"{kind} rule of {metric} is optional while another rule on it is required",
                    "set required to true",
                )
    for index, rule in enumerate(baseline.rules):
        if rule.kind == "paired_mean_diff" and rule.metric not in baseline.series:
            raise fail(
                f"$.rules[{index}].metric",
                f"paired comparison needs a per-rollout series of {rule.metric}",
                "add it to evidence.series or drop the rule",
            )
    for index, rule in enumerate(baseline.rules):
        if rule.kind in ("mean_within", "max_within"):
            _check_band(baseline, rule, f"$.rules[{index}]", fail)


def _check_band(baseline: Baseline, rule: Rule, where: str, fail) -> None:
    assert rule.derive is not None and rule.band is not None and rule.metric is not None
    expected_method = "mean_band" if rule.kind == "mean_within" else "max_band"
    if rule.derive.method != expected_method:
        raise fail(
            f"{where}.derive.method",
            f"{rule.kind} takes method {expected_method}, not {rule.derive.method}",
            f"set it to {expected_method}",
        )
    try:
        derived = baseline.band_for(rule, baseline.run_shape.rollouts)
    except (KeyError, ValueError) as exc:
        raise fail(
            f"{where}.metric",
            f"cannot derive the band of {rule.metric}: {exc}",
            "add a series, or a summary with sd, min/max or bounds",
        ) from exc
    if not _same(derived.low, rule.band.low) or not _same(derived.high, rule.band.high):
        raise fail(
            f"{where}.band",
            f"band {{low: {rule.band.low}, high: {rule.band.high}}} is not the derived one",
            f"set it to {{low: {derived.low}, high: {derived.high}}} (miles_amd.baseline.bands) "
            "or change derive",
        )


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
