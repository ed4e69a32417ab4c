"""Honest error rates of the gate: record a simulated reference, judge simulated runs with it.

Benchmark support (``benchmarks/bench_calibration.py``). Per replicate of ``tests.support
.honest`` it records the variant's simulated reference with the real ``record_baseline`` (the
shipped template with each ``cover`` and ``pool`` the simulated other run's), then judges ``k``
simulated runs with the real gate at the baseline's looks and at the end only, keeping each
red run's rollout to red. A reference ``record`` refuses is counted and its replicate skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from miles_amd.rules.model import Baseline, Rule
from tests.support.honest import HEALTHY, Fault, HonestModel
from tests.support.simulate import evidence

REFERENCE_ROLLOUTS = 20


@dataclass
class Tally:
    """Outcomes of one cell: failures per recorded reference, and per check."""

    per_reference: int
    failures: list[int] = field(default_factory=list)  # per reference, judged at the looks
    by_check: dict[str, int] = field(default_factory=dict)
    refused: int = 0
    fixed: list[int] = field(default_factory=list)  # the same runs judged at the end only
    decided: list[int] = field(default_factory=list)  # each red run's rollout to red (looks)

    @property
    def runs(self) -> int:
        return len(self.failures) * self.per_reference

    @property
    def rate(self) -> float:
        return sum(self.failures) / self.runs if self.runs else math.nan

    @property
    def fixed_rate(self) -> float:
        return sum(self.fixed) / self.runs if self.runs else math.nan

    def merge(self, other: Tally) -> Tally:
        return Tally(
            self.per_reference,
            self.failures + other.failures,
            _add(self.by_check, other.by_check),
            self.refused + other.refused,
            self.fixed + other.fixed,
            self.decided + other.decided,
        )


def _add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    out = dict(a)
    for name, count in b.items():
        out[name] = out.get(name, 0) + count
    return out


def _covered(template: Baseline, other: dict[str, np.ndarray]) -> Baseline:
    """The template with every cover value (and every ``pool``: the paired reward's, the
    step rule's; each a cover of the mean band) replaced by the other run's mean (or max)."""
    rules: list[Rule] = []
    for rule in template.rules:
        params = dict(rule.params)
        values = other.get(rule.metric) if rule.metric is not None else None
        if values is not None and params.get("derive", {}).get("cover"):
            value = float(values.mean() if rule.kind == "mean_within" else values.max())
            params["derive"] = {**params["derive"], "cover": [value]}
        if values is not None and params.get("pool") is not None:
            params["pool"] = float(values.mean())
        rules.append(replace(rule, params=params))
    return replace(template, rules=tuple(rules))


def record(template: Baseline, run: dict[str, np.ndarray], other: dict[str, np.ndarray]):
    """The baseline ``baseline record`` makes of ``run`` (None when it refuses)."""
    from miles_amd.baseline.record import RecordError, record_baseline

    values = {m: v[None, :] for m, v in run.items()}
    try:
        doc = record_baseline(
            evidence(values, 0, name="reference"),
            _covered(template, other),
            variant=template.name,
            name=template.name,
            recorded_at="simulated",
            allow_no_preflight=True,
        )
    except RecordError:
        return None
    return Baseline.from_json(doc, f"<simulated {template.name}>")


@dataclass(frozen=True)
class Cell:
    """One measurement: a model, a variant's template, the run length, the fault."""

    model: HonestModel
    template: Baseline
    rollouts: int
    per_reference: int
    fault: Fault = HEALTHY


def run_cell(cell: Cell, references: int, seed: int) -> Tally:
    """Judge ``references`` x ``per_reference`` simulated runs; fixed ``seed``."""
    from miles_amd.judge.gate import judge

    rng = np.random.default_rng(seed)
    variant = cell.template.name
    other_variant = "stock" if variant == "patched" else "patched"
    tally = Tally(cell.per_reference)
    length = max(REFERENCE_ROLLOUTS, cell.rollouts)
    for _ in range(references):
        prompts = cell.model.prompts(rng, length)
        head = prompts[:REFERENCE_ROLLOUTS]
        ref = cell.model.runs(head, 1, variant, rng)
        other = cell.model.runs(head, 1, other_variant, rng)
        baseline = record(
            cell.template, {m: v[0] for m, v in ref.items()}, {m: v[0] for m, v in other.items()}
        )
        if baseline is None:
            tally.refused += 1
            continue
        runs = cell.model.runs(
            prompts[: cell.rollouts], cell.per_reference, variant, rng, cell.fault
        )
        failed = fixed = 0
        for index in range(cell.per_reference):
            run = evidence(runs, index)
            verdict = judge(run, baseline, expected_rollouts=cell.rollouts)
            failed += verdict.verdict != "pass"
            if verdict.decision is not None:
                tally.decided.append(verdict.decision.rollout)
            for check in verdict.failures:
                tally.by_check[check.name] = tally.by_check.get(check.name, 0) + 1
            at_end = judge(run, baseline, expected_rollouts=cell.rollouts, looks=False)
            fixed += at_end.verdict != "pass"
        tally.failures.append(failed)
        tally.fixed.append(fixed)
    return tally
