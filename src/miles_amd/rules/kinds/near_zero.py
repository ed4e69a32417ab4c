"""``near_zero``: every ``|value| <= atol``.

``atol`` is derived and re-derived by the loader: half the smallest per-token rate one
token can make (``1 / (samples_per_rollout x max_response_tokens)``), rounded down to 4
significant digits. Judged at once: a value beyond it fails the whole run
(``KindSpec.looks``). Pure: no file is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from miles_amd.evidence.types import Series
from miles_amd.rules import bands
from miles_amd.rules.check import Check, Problem, RuleContext, fmt, listed, passed, rule_check
from miles_amd.rules.kind import KindSpec
from miles_amd.rules.model import Baseline, Params, Rule


@dataclass(frozen=True)
class AtolParams(Params):
    atol: float


def check(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None
    atol = AtolParams.of(rule).atol
    bad = [(s, v) for s, v in series if not abs(v) <= atol]
    magnitudes = [abs(v) for _, v in series]
    worst = math.nan if any(math.isnan(m) for m in magnitudes) else max(magnitudes)
    if bad:
        shown = [f"{ctx.where(rule.metric, s)} ({fmt(v)})" for s, v in bad]
        detail = f"{len(bad)} value(s) beyond ±{atol:g}: {listed(shown)}"
    else:
        detail = f"every |value| ≤ {atol:g}"
    return rule_check(
        rule,
        passed(not bad),
        worst,
        expected(rule, ctx.baseline, ctx.rollouts),
        detail,
        failing_steps=tuple(s for s, _ in bad),
        numbers={"max_abs": worst, "atol": atol},
    )


def expected(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    return f"|value| ≤ {AtolParams.of(rule).atol:g}"


def near_zero_atol(baseline: Baseline) -> float:
    """Half the smallest per-token rate one token makes, rounded down to 4 digits."""
    shape = baseline.run_shape
    one_token = bands.single_token_fraction(shape.samples_per_rollout, shape.max_response_tokens)
    return bands.round_outward(one_token / 2, up=False)


def validate(rule: Rule, baseline: Baseline) -> Problem | None:
    derived = near_zero_atol(baseline)
    atol = AtolParams.of(rule).atol
    if not math.isclose(atol, derived, rel_tol=1e-12):
        shape = baseline.run_shape
        return (
            ".atol",
            (
                f"atol {atol:g} is not the derived {derived:g} (half of 1/("
                f"{shape.samples_per_rollout} samples x {shape.max_response_tokens} tokens), "
                "rounded down to 4 significant digits)"
            ),
            f"set it to {derived!r}",
        )
    return None


SPEC = KindSpec(
    name="near_zero",
    params=AtolParams,
    check=check,
    expected=expected,
    validate=validate,
    looks="at_once",
)
