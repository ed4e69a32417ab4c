"""What one judged rule returns (:class:`Check`), what it reads (:class:`RuleContext`), and how
a check's detail writes numbers, steps and lists. It judges nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from miles_amd.evidence.types import RunEvidence
    from miles_amd.rules.model import Baseline, Rule

Status = Literal["pass", "fail", "not_measured", "error"]
Observed = float | int | str | None
# A refused baseline tolerance: (JSON path below the rule, what is wrong, the fix).
Problem = tuple[str, str, str]

LIST_LIMIT = 8  # steps/problems named in one detail line before "... (N more)"


@dataclass(frozen=True)
class Check:
    """The outcome of one rule on one run."""

    name: str
    kind: str
    metric: str | None
    required: bool
    status: Status
    observed: Observed
    expected: str
    detail: str
    rationale: str = ""
    failing_steps: tuple[int, ...] = ()  # steps to mark on the plot
    numbers: Mapping[str, float] = field(default_factory=dict)  # structured figures
    look: int | None = None  # a spending rule judged at this look: its first ``look`` rollouts

    @property
    def failed(self) -> bool:
        return self.status in ("fail", "error")


@dataclass(frozen=True)
class BuiltinCheck:
    """A check the gate runs on every run without a baseline rule (environment, all-reduce
    route): its name, kind and rationale fixed, the outcome given per call."""

    name: str
    kind: str
    rationale: str

    def __call__(
        self,
        status: Status,
        observed: Observed,
        expected: str,
        detail: str,
        required: bool,
    ) -> Check:
        return Check(
            self.name, self.kind, None, required, status, observed, expected, detail, self.rationale
        )

    def absent(self, observed: Observed, expected: str, detail: str, require_env: bool) -> Check:
        """Evidence the run lacks: ``not_measured``, a failure with ``require_env``."""
        return self(
            "fail" if require_env else "not_measured", observed, expected, detail, require_env
        )


@dataclass(frozen=True)
class RuleContext:
    """What a rule function needs besides its series: the evidence, baseline and rollout count,
    and whether the hardware path's evidence is required (``--require-env``)."""

    evidence: RunEvidence
    baseline: Baseline
    rollouts: int
    require_env: bool = False
    # Sequential looks (``miles_amd.rules.looks``): the run's looks (None: judged at the end
    # only, with each rule's fixed-sample tolerance); the look being judged (the first
    # ``look`` rollouts; None: the whole run); and the boundary a spending rule's statistic
    # may reach there (normal scale; None: the rule's own fixed-sample bound).
    looks: tuple[int, ...] | None = None
    look: int | None = None
    limit: float | None = None

    def where(self, metric: str, step: int) -> str:
        """Name a point by its rollout: ``rollout 3`` (and its train step when they differ)."""
        per_rollout = self.baseline.run_shape.train_steps_per_rollout
        if metric.startswith("train/") and per_rollout != 1:
            return f"rollout {step // per_rollout} (train/step {step})"
        return f"rollout {step}"


def axis(metric: str) -> str:
    """The step a metric is logged at: ``train/step`` for ``train/*``, else ``rollout/step``."""
    return "train/step" if metric.startswith("train/") else "rollout/step"


def step_range(metric: str, baseline: Baseline, rollouts: int) -> range:
    """Steps a complete run logs ``metric`` at: one a rollout, or ``train_steps_per_rollout``
    a rollout for ``train/*`` metrics."""
    if metric.startswith("train/"):
        return range(rollouts * baseline.run_shape.train_steps_per_rollout)
    return range(rollouts)


def fmt(value: float) -> str:
    """A value in a detail line: 4 significant digits, ``nan``/``inf``/``-inf`` spelled out."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return f"{value:.4g}"


def listed(items: Sequence[str]) -> str:
    shown = ", ".join(items[:LIST_LIMIT])
    if len(items) > LIST_LIMIT:
        shown += f", ... ({len(items) - LIST_LIMIT} more)"
    return shown


def steps_text(steps: Iterable[int]) -> str:
    return listed([str(s) for s in steps])


def grid(quantum: float) -> str:
    """``1/64`` for a unit fraction, else the number."""
    inverse = 1 / quantum
    return f"1/{round(inverse)}" if abs(inverse - round(inverse)) < 1e-9 else f"{quantum:g}"


def passed(ok: bool) -> Status:
    return "pass" if ok else "fail"


def rule_check(rule: Rule, status: Status, observed, expected: str, detail: str, **extra) -> Check:
    """A :class:`Check` named, kinded and explained by ``rule``."""
    return Check(
        rule.id, rule.kind, rule.metric, rule.required, status, observed, expected, detail,
        rule.rationale, **extra,
    )  # fmt: skip


def non_finite_failure(
    rule: Rule, points: Iterable[tuple[int, float]], expected: str, what: str
) -> Check | None:
    """The failing check of a rule whose statistic (``what``) is undefined because a value is
    NaN or infinite, naming the steps; ``None`` when every value is finite."""
    bad = tuple(s for s, v in points if not math.isfinite(v))
    if not bad:
        return None
    detail = f"{what} undefined: non-finite at {steps_text(bad)}"
    return rule_check(rule, "fail", math.nan, expected, detail, failing_steps=bad)
