"""What a shipped baseline must carry (:data:`REQUIRED_RULES`, required) and the digests that
tie it to its published run: :func:`evidence_digest` (sha256 of the evidence as canonical JSON)
must equal ``provenance.evidence_sha256`` and, for a seed run, :data:`PUBLISHED_EVIDENCE`.
Changing a list or a pinned digest is a reviewed change (``docs/ci.md``). CI copies this file
by path (.github/workflows/amd-pr.yml).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from miles_amd.baseline.model import RECIPE_DIR, SHIPPED, BaselineError, baselines_root
from miles_amd.rules.model import Baseline

_LOGPROB = "train/train_rollout_logprob_abs_diff"
_REWARD = "rollout/raw_reward"
_CLIPFRAC = "train/pg_clipfrac"

_GUARDS = ("steps_complete", "finite")
_COMMON = frozenset(
    [(kind, _LOGPROB) for kind in (*_GUARDS, "all_below", "mean_within", "max_within")]
    + [(kind, _LOGPROB) for kind in ("no_rising_trend", "step_rise")]
    + [(kind, _REWARD) for kind in (*_GUARDS, "mean_within", "sd_at_least", "multiple_of")]
)
REQUIRED_RULES: Mapping[str, frozenset[tuple[str, str]]] = {
    "stock": _COMMON,
    "patched": _COMMON
    | {("paired_mean_diff", _REWARD)}
    | {(kind, _CLIPFRAC) for kind in (*_GUARDS, "near_zero")},
}

# sha256 of the reference evidence of each published run (evidence_digest); jvvnhop9's series
# are RECIPE.md's "Per-rollout series of jvvnhop9", 4it2x89i has only its validation-table row.
PUBLISHED_EVIDENCE: Mapping[str, str] = {
    "jvvnhop9": "809b9c63d9fe0b38443f950748fdbf84628b9c50e7ef357a9a473d51d6bba879",
    "4it2x89i": "4687c047c8ec7e9e93aba370f4f9d29ae461510c91afea628431e99da8418e78",
}

_DIGEST_FIELD = "evidence_sha256"


def _sha256(document: Any) -> str:
    text = json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def evidence_digest(baseline: Baseline) -> str:
    return _sha256(baseline.to_json()["evidence"])


def baseline_digest(baseline: Baseline) -> str:
    """sha256 of the whole baseline, ``$schema`` aside."""
    document = baseline.to_json()
    document.pop("$schema", None)
    return _sha256(document)


def check_shipped(spec: str | os.PathLike[str], baseline: Baseline) -> None:
    """The first :func:`shipped_problems` as ``BaselineError`` when ``spec`` is shipped."""
    shipped_dir = (baselines_root() / RECIPE_DIR).resolve()
    if os.fspath(spec) not in SHIPPED and not Path(baseline.path).resolve().is_relative_to(
        shipped_dir
    ):
        return
    problem = next(shipped_problems(baseline), None)
    if problem is not None:
        where, what, fix = problem
        raise BaselineError(f"{baseline.path}: {where}: {what}; fix: {fix}")


def shipped_problems(baseline: Baseline) -> Iterator[tuple[str, str, str]]:
    """Why ``baseline`` cannot be a shipped one: its required rules, then its evidence."""
    required = REQUIRED_RULES.get(baseline.name)
    if required is None:
        yield (
            "$.name",
            f"{baseline.name!r} is not a shipped baseline ({', '.join(REQUIRED_RULES)})",
            "ship it under a shipped name, or pass it as --baseline PATH",
        )
        return
    for kind, metric in sorted(required):
        rules = [r for r in baseline.rules if r.kind == kind and r.metric == metric]
        if not rules:
            yield (
                "$.rules",
                f"the recipe requires a {kind} rule on {metric} and this shipped baseline has "
                "none (miles_amd.baseline.shipped.REQUIRED_RULES)",
                f"restore the rule from the base branch's baselines/{baseline.name}.json",
            )
        elif not any(r.required for r in rules):
            index = baseline.rules.index(rules[0])
            yield (
                f"$.rules[{index}].required",
                f"the recipe requires the {kind} rule on {metric} and it is optional",
                "set required to true",
            )
    found = evidence_digest(baseline)
    carried = baseline.provenance.get(_DIGEST_FIELD)
    where = f"$.provenance.{_DIGEST_FIELD}"
    if carried is None:
        yield where, "missing", f'set it to "{found}" once the evidence is the published one'
        return
    if carried != found:
        yield (
            where,
            f"{carried} is not the digest of the file's evidence ({found}): its reference "
            "series or summaries were changed",
            "restore the published evidence from the base branch's baselines/",
        )
        return
    run_id = baseline.run_id
    published = PUBLISHED_EVIDENCE.get(run_id)
    if published is not None and published != found:
        yield (
            "$.evidence",
            f"digest {found} is not the published evidence of run {run_id} ({published})",
            f"restore run {run_id}'s published series from the base branch's baselines/",
        )
