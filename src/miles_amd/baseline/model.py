"""Baseline files: find, parse and validate them, each error one line ``<file>: <JSON path>:
<what is wrong>; fix: <what to do>``. Checked in order: strict JSON matching
``baseline.schema.json`` (its innermost best-matching error); unique rule ids, a ``finite`` and
a ``steps_complete`` rule per metric, a required ``steps_complete``; series and ``run_shape``
the recipe's, looks ending at ``rollouts``; each rule's tolerance (``rules.registry``); a file
named ``<name>.json``. Shipped ones: ``<shape>/<gpu>/<variant>.json`` under
``$MILES_AMD_BASELINES_DIR`` or the package data (``docs/cli.md``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from miles_amd import strict_json
from miles_amd.package_data import package_path
from miles_amd.rules.looks import looks_problem
from miles_amd.rules.model import Baseline
from miles_amd.rules.registry import validate_rule
from miles_amd.variants import AITER_VARIANTS, BASELINE_VARIANTS

RECIPE_DIR = "gpt_oss_20b_lora"
REFERENCE_DIR = "8gpu/mi355x"  # the published runs' shape and GPU: what stock/patched name
SHIPPED: tuple[str, ...] = BASELINE_VARIANTS  # one shipped baseline per variant, same name
BASELINES_DIR_ENV = "MILES_AMD_BASELINES_DIR"
SCHEMA_PATH = Path(__file__).resolve().parent / "baseline.schema.json"


class BaselineError(ValueError):
    """A baseline that cannot be used; ``str()`` is one line naming the file, field and fix."""


class UnknownBaselineError(BaselineError):
    """A baseline name or path that names no file; ``str()`` starts with the flag used."""


def baselines_root() -> Path:
    """``$MILES_AMD_BASELINES_DIR``, else the shipped package data."""
    override = os.environ.get(BASELINES_DIR_ENV)
    if not override:
        return package_path("miles_amd.baseline", "shipped-baselines")
    try:
        Path(override).resolve()  # a link loop raises (RuntimeError on CPython 3.11)
    except (OSError, RuntimeError) as exc:
        raise UnknownBaselineError(
            f"${BASELINES_DIR_ENV} {override}: cannot be followed ({exc}); fix: set it to the "
            "repo's baselines/ directory, or unset it for the shipped baselines"
        ) from None
    return Path(override)


def resolve_baseline_path(spec: str | os.PathLike[str], *, flag: str = "--baseline") -> Path:
    """``stock``/``patched`` -> the shipped file; anything else a path; errors name ``flag``."""
    text = os.fspath(spec)
    if text in SHIPPED:
        path = baselines_root() / RECIPE_DIR / REFERENCE_DIR / f"{text}.json"
        if not path.is_file():
            raise UnknownBaselineError(
                f"{flag} {text}: shipped baseline not found at {path}; fix: set "
                f"{BASELINES_DIR_ENV} to the repo's baselines/ directory, or pass {flag} PATH"
            )
        return path
    path = Path(text)
    if not path.is_file():
        prefix = f"{flag} " if flag.startswith("-") else ""
        choices = ", ".join(f"{prefix}{name}" for name in SHIPPED)
        raise UnknownBaselineError(
            f"{flag} {text}: no such baseline file{_name_hint(text, prefix)}; fix: use "
            f"{choices} or the path of a baseline JSON file"
        )
    return path


def _name_hint(text: str, prefix: str) -> str:
    """What a mistyped name meant: a shipped name's case, or a variant without a baseline."""
    if text.lower() in SHIPPED:
        return f" (baseline names are lower case: {prefix}{text.lower()})"
    if text.lower() in AITER_VARIANTS:
        return (
            f" ({text.lower()} has no baseline of its own: a run of it is gated with "
            f"{prefix}stock, whose baseline-free checks judge it)"
        )
    return ""


def load_baseline(spec: str | os.PathLike[str], *, flag: str = "--baseline") -> Baseline:
    """Load and validate ``stock``, ``patched`` or a baseline file path (module doc)."""
    path = resolve_baseline_path(spec, flag=flag)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{path}: cannot read ({exc}); fix: check the file") from exc
    baseline = parse_baseline(text, path=str(path))
    if path.stem != baseline.name:  # the gate, report and history show the name inside
        raise BaselineError(
            f"{path}: $.name: the file holds baseline {baseline.name!r} but is named "
            f"{path.name}; fix: rename the file {baseline.name}.json, or record it again "
            f"with --name {path.stem}"
        )
    return baseline


def parse_baseline(text: str, *, path: str) -> Baseline:
    """Validate baseline JSON ``text`` (``path`` only names it in errors)."""
    try:
        raw = strict_json.loads(text)
    except strict_json.StrictJsonError as exc:
        fix = "write a finite number" if "non-finite" in exc.reason else "correct the JSON there"
        raise BaselineError(f"{path}: {exc}; fix: {fix}") from None
    _check_schema(raw, path)
    baseline = Baseline.from_json(raw, path)
    problem = next(_problems(baseline), None)
    if problem is not None:
        where, what, fix = problem
        raise BaselineError(f"{path}: {where}: {what}; fix: {fix}")
    return baseline


@cache
def _validator():
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


_SCHEMA_FIXES = {
    "required": "add the missing field",
    "additionalProperties": "remove the field or correct its spelling",
    "type": "use the type the schema names",
    "enum": "use one of the allowed values",
    "const": "use the value the schema names",
    "pattern": "match the pattern the schema names",
    "minItems": "add values",
    "maxItems": "remove values",
    "minimum": "use a larger value",
    "maximum": "use a smaller value",
    "exclusiveMinimum": "use a larger value",
    "minLength": "write a non-empty value",
    "not": "remove the field (this kind takes none)",
    "dependentRequired": "add the field it depends on",
}


def _check_schema(raw: object, path: str) -> None:
    import jsonschema

    errors = list(_validator().iter_errors(raw))
    if not errors:
        return
    error = jsonschema.exceptions.best_match(errors)
    while error.context:  # into if/then branches: the message names the innermost field
        error = jsonschema.exceptions.best_match(error.context)
    fix = _SCHEMA_FIXES.get(str(error.validator), "see src/miles_amd/baseline/baseline.schema.json")
    message = " ".join(error.message.split())
    forbidden = error.validator_value.get("required") if error.validator == "not" else None
    if forbidden:
        message = f"this kind takes no {', '.join(repr(f) for f in forbidden)}"
    if len(message) > 200:
        message = message[:197] + "..."
    raise BaselineError(f"{path}: {error.json_path}: {message}; fix: {fix}")


_Problem = tuple[str, str, str]  # (JSON path, what is wrong, the fix)


def _problems(baseline: Baseline) -> Iterator[_Problem]:
    n = baseline.run_shape.rollouts
    for metric, values in baseline.series.items():
        if len(values) != n:
            yield (
                f"$.evidence.series['{metric}']",
                f"{len(values)} values for {n} rollouts",
                "give one value per rollout, rollout 0 first, or correct run_shape.rollouts",
            )
    seen: dict[str, int] = {}
    for index, rule in enumerate(baseline.rules):
        if rule.id in seen:
            yield (
                f"$.rules[{index}].id",
                f"duplicate id {rule.id!r} (also rules[{seen[rule.id]}])",
                "give every rule its own id",
            )
        seen[rule.id] = index
    if not any(r.kind == "steps_complete" and r.required for r in baseline.rules):
        yield (
            "$.rules",
            "no required steps_complete rule",
            "require at least one metric's steps, or the gate could pass without evidence",
        )
    yield from _missing_guards(baseline)
    for key, expected in recipe_shape().items():  # tolerances are derived from the shape
        found = getattr(baseline.run_shape, key)
        if found != expected:
            yield (
                f"$.run_shape.{key}",
                f"{found} is not the recipe's {expected} (miles_amd.recipe.settings.Recipe)",
                f"set it to {expected}; tolerances derived from it depend on it",
            )
    looks = looks_problem(baseline.run_shape)
    if looks is not None:
        yield looks
        return  # the boundaries below are derived at the looks
    for index, rule in enumerate(baseline.rules):
        problem = validate_rule(rule, baseline)
        if problem is not None:
            field, what, fix = problem
            yield f"$.rules[{index}]{field}", what, fix


def recipe_shape() -> dict[str, int]:
    from miles_amd.recipe.settings import Recipe

    recipe = Recipe()
    samples = recipe.rollout_batch_size * recipe.n_samples_per_prompt
    return {
        "train_steps_per_rollout": samples // recipe.global_batch_size,
        "samples_per_rollout": samples,
        "prompts_per_rollout": recipe.rollout_batch_size,
        "max_response_tokens": recipe.rollout_max_response_len,
    }


def _missing_guards(baseline: Baseline) -> Iterator[_Problem]:
    for metric in sorted({r.metric for r in baseline.rules if r.metric is not None}):
        on_metric = [r for r in baseline.rules if r.metric == metric]
        needs_required = any(r.required for r in on_metric)
        for kind in ("finite", "steps_complete"):
            guards = [r for r in on_metric if r.kind == kind]
            if not guards:
                yield (
                    "$.rules",
                    f"metric {metric} is gated but has no {kind} rule",
                    f'add {{"kind": "{kind}", "metric": "{metric}", ...}}',
                )
            elif needs_required and not any(r.required for r in guards):
                yield (
                    f"$.rules[{baseline.rules.index(guards[0])}].required",
                    f"{kind} rule of {metric} is optional while another rule on it is required",
                    "set required to true",
                )
