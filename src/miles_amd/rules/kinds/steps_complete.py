"""``steps_complete``: every step ``0..N-1`` exactly once.

``N`` = rollouts for ``rollout/*`` and ``perf/*``, times ``train_steps_per_rollout`` for
``train/*``. No tolerance. Judged at once (``KindSpec.looks``): at a look of ``k`` rollouts
the steps of those rollouts, each once (``RuleContext.expected_steps``). Pure: no file is
read.
"""

from __future__ import annotations

from collections import Counter

from miles_amd.evidence.types import Series
from miles_amd.rules.check import (
    Check,
    RuleContext,
    axis,
    listed,
    passed,
    rule_check,
    step_range,
    steps_text,
)
from miles_amd.rules.kind import KindSpec
from miles_amd.rules.model import Baseline, NoParams, Rule


def check(rule: Rule, series: Series, ctx: RuleContext) -> Check:
    assert rule.metric is not None
    wanted = ctx.expected_steps(rule.metric)
    counts = Counter(step for step, _ in series)
    missing = [s for s in wanted if s not in counts]
    duplicated = sorted(s for s, c in counts.items() if c > 1)
    unexpected = sorted(s for s in counts if s not in wanted)
    problems = []
    if missing:
        problems.append(f"missing {axis(rule.metric)} {steps_text(missing)}")
    if duplicated:
        problems.append(f"duplicated {listed([f'{s} ({counts[s]}x)' for s in duplicated])}")
    if unexpected:
        problems.append(f"unexpected {steps_text(unexpected)}")
    steps = sorted(counts)
    observed = f"{len(series)} points at {len(steps)} steps" + (
        f" ({steps[0]}..{steps[-1]})" if steps else ""
    )
    detail = "; ".join(problems) if problems else f"every {axis(rule.metric)} once"
    return rule_check(
        rule,
        passed(not problems),
        observed,
        expected(rule, ctx.baseline, ctx.rollouts),
        detail,
        failing_steps=tuple(duplicated + unexpected),
        numbers={"missing": len(missing), "duplicated": len(duplicated)},
    )


def expected(rule: Rule, baseline: Baseline, rollouts: int) -> str:
    assert rule.metric is not None
    steps = step_range(rule.metric, baseline, rollouts)
    return f"{axis(rule.metric)} 0..{steps[-1]}, each once"


SPEC = KindSpec(
    name="steps_complete", params=NoParams, check=check, expected=expected, looks="at_once"
)
