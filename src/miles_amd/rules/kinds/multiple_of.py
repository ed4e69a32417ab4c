"""``multiple_of``: every value within ``atol`` of a multiple of ``quantum``.

``quantum`` is derived (``1 / run_shape.samples_per_rollout``: the reward is a fraction over
one rollout's samples) and re-derived by the loader; ``atol`` only absorbs float rounding,
at most 1/:data:`GRID_ATOL_DIVISOR` of the step. Judged at once: an off-grid value fails
the whole run (``KindSpec.looks``). Pure: no file is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from miles_amd.evidence.types import Series
from miles_amd.rules.check import (
    Check,
    Problem,
    RuleContext,
    fmt,
    grid,
    listed,
    passed,
    rule_check,
)
from miles_amd.rules.kind import KindSpec
from miles_amd.rules.model import Baseline, Params, Rule

GRID_ATOL_DIVISOR = 100.0  # a grid's atol is at most 1% of its step


@dataclass(frozen=True)
class GridParams(Params):
    quantum: float
    atol: float


def check(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None
    params = GridParams.of(rule)
    quantum, atol = params.quantum, params.atol

    def on_grid(value: float) -> bool:
        multiple = value / quantum
        if not math.isfinite(multiple):  # NaN, inf, or a finite value too large to divide
            return False
        return abs(value - round(multiple) * quantum) <= atol

    off = [(s, v) for s, v in series if not on_grid(v)]
    step = grid(quantum)
    if off:
        shown = [
            f"{ctx.where(rule.metric, s)}: {fmt(v)} = {fmt(v / quantum)}·{step}" for s, v in off
        ]
        detail = f"{len(off)} value(s) off the {step} grid: {listed(shown)}"
    else:
        detail = f"every value a multiple of {step} (±{atol:g})"
    return rule_check(
        rule,
        passed(not off),
        f"{len(series) - len(off)}/{len(series)} on grid",
        expected(rule, ctx.baseline, ctx.rollouts),
        detail,
        failing_steps=tuple(s for s, _ in off),
        numbers={"off_grid": len(off)},
    )


def expected(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    params = GridParams.of(rule)
    return f"multiples of {grid(params.quantum)} (±{params.atol:g})"


def validate(rule: Rule, baseline: Baseline) -> Problem | None:
    """``quantum`` is derived (1/samples_per_rollout); ``atol`` at most 1% of it."""
    params = GridParams.of(rule)
    samples = baseline.run_shape.samples_per_rollout
    if not math.isclose(params.quantum, 1.0 / samples, rel_tol=1e-12):
        return (
            ".quantum",
            (
                f"quantum {params.quantum:g} is not 1/{samples} (a fraction over "
                f"run_shape.samples_per_rollout = {samples} samples)"
            ),
            f"set it to {1.0 / samples!r}",
        )
    limit = params.quantum / GRID_ATOL_DIVISOR
    if params.atol > limit:
        return (
            ".atol",
            (
                f"atol {params.atol:g} exceeds 1/{GRID_ATOL_DIVISOR:g} of the grid step "
                f"({limit:.4g}); it only absorbs float rounding, and at half a step every "
                "value is on the grid"
            ),
            f"use an atol of at most {limit:.4g}",
        )
    return None


SPEC = KindSpec(
    name="multiple_of",
    params=GridParams,
    check=check,
    expected=expected,
    validate=validate,
    looks="at_once",
)
