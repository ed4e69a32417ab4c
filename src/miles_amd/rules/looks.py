"""Sequential looks: the rollouts at which a run may be decided red, and each rule's boundaries.

Decides a run's looks (``run_shape.looks`` below ``N``, then ``N``; increasing, ending at
``run_shape.rollouts``), a ``spending`` rule's boundary at each look (the information fraction
from the reference alone, the z bound spending the kind's fixed-sample rate) and whether stored
``boundaries`` are the derived ones. ``docs/gate-and-statistics.md`` ("The looks and each rule's
boundaries").
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any

from miles_amd.rules import spending
from miles_amd.rules.bands import round_outward
from miles_amd.rules.check import Problem
from miles_amd.rules.kinds import KINDS
from miles_amd.rules.model import BOUNDARIES, Baseline, Rule, RunShape

DEFAULT_LOOKS = (5, 10, 15, 20)


@dataclass(frozen=True)
class Boundary:
    """A spending rule's bound at one look: what its statistic may reach there."""

    rollout: int  # the look: the first ``rollout`` rollouts are judged
    information: float  # the fraction of the whole run's information they carry
    z: float  # the bound on the normal scale (a side's, for a two-sided rule)
    alpha_spent: float  # the rule's false-alarm rate spent by this look

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def run_looks(shape: RunShape, rollouts: int) -> tuple[int, ...]:
    """The looks of a run of ``rollouts``: the declared ones below it, then ``rollouts``."""
    return (*(k for k in shape.looks if k < rollouts), rollouts)


def rule_boundaries(
    rule: Rule, baseline: Baseline, rollouts: int, looks: Sequence[int]
) -> tuple[Boundary, ...]:
    """A spending rule's boundaries at ``looks`` of a run of ``rollouts`` (other kinds: none):
    what ``baseline record`` writes and the loader re-derives. A look its kind cannot judge
    or that would spend nothing is left out; a run too short to judge at all has none."""
    spec = KINDS[rule.kind]
    if spec.information is None or spec.nominal is None:
        return ()
    final = spec.information(rule, baseline, rollouts, rollouts)
    if final is None or not final > 0:
        return ()
    rate, sides = spec.nominal(rule, baseline, rollouts)
    judged: list[tuple[int, float]] = []
    for k in looks:
        if k >= rollouts:
            break
        information = spec.information(rule, baseline, k, rollouts)
        if information is None or not information > 0:
            continue
        highest = 1.0 - 10**-spending.FRACTION_DIGITS
        t = spending.floor_fraction(min(information / final, highest))
        if t > 0 and (not judged or t > judged[-1][1]):
            judged.append((k, t))
    judged.append((rollouts, 1.0))
    zs = spending.boundaries(rate, tuple(t for _, t in judged))
    out = []
    for (k, t), z in zip(judged, zs, strict=True):
        if z is None:
            continue
        alpha = round_outward(sides * spending.spent(rate, t), up=True)
        out.append(Boundary(k, t, round_outward(z, up=True), alpha))
    return tuple(out)


# The last boundaries computed, by (baseline, rule, rollouts, looks); an entry keeps the
# baseline and rule it was computed for and is used only for those very objects, so a gate
# judging many looks of one run, or many runs against one baseline, derives them once.
_RECENT: OrderedDict[tuple[int, int, int, tuple[int, ...]], tuple[Baseline, Rule, Any]] = (
    OrderedDict()
)
_RECENT_SIZE = 64


def boundary_at(
    rule: Rule, baseline: Baseline, rollouts: int, looks: Sequence[int], look: int
) -> Boundary | None:
    """The rule's boundary at ``look`` (None: it judges nothing there)."""
    key = (id(baseline), id(rule), rollouts, tuple(looks))
    entry = _RECENT.get(key)
    if entry is not None and entry[0] is baseline and entry[1] is rule:
        found = entry[2]
    else:
        found = rule_boundaries(rule, baseline, rollouts, looks)
        _RECENT[key] = (baseline, rule, found)
        while len(_RECENT) > _RECENT_SIZE:
            _RECENT.popitem(last=False)
    return next((b for b in found if b.rollout == look), None)


def looks_problem(shape: RunShape) -> Problem | None:
    """``run_shape.looks`` must be increasing rollouts in 1..rollouts, the last ``rollouts``."""
    looks, n = shape.looks, shape.rollouts
    quarter = max(1, n // 4)  # quarters: DEFAULT_LOOKS for 20 rollouts (test_spending.py)
    fix = f"set it to increasing rollouts ending at {n}, e.g. {[*range(quarter, n, quarter), n]}"
    if not looks:
        return ("$.run_shape.looks", "no looks (the last must be run_shape.rollouts)", fix)
    if any(not a < b for a, b in pairwise(looks)):
        return ("$.run_shape.looks", f"looks {list(looks)} are not increasing", fix)
    if looks[0] < 1 or looks[-1] != n:
        return (
            "$.run_shape.looks",
            f"looks {list(looks)} must lie in 1..{n} and end at run_shape.rollouts {n}",
            fix,
        )
    return None


def boundaries_problem(rule: Rule, baseline: Baseline) -> Problem | None:
    """A spending rule's ``boundaries`` are the derived ones for ``run_shape``; other kinds
    carry none. ``(JSON path below the rule, what, fix)``."""
    written = rule.params.get(BOUNDARIES)
    if KINDS[rule.kind].looks != "spending":
        if written is None:
            return None
        return (f".{BOUNDARIES}", f"{rule.kind} is not judged at looks", f"remove {BOUNDARIES}")
    shape = baseline.run_shape
    try:
        derived = rule_boundaries(rule, baseline, shape.rollouts, shape.looks)
    except (KeyError, ValueError, ArithmeticError) as exc:
        return (
            ".metric",
            f"cannot derive the boundaries of {rule.id} at its looks: {exc}",
            "give the reference the series or summary its tolerance needs",
        )
    wanted = [b.to_json() for b in derived]
    if written is None or not _same(written, wanted):
        return (
            f".{BOUNDARIES}",
            "boundaries are not the ones spending the rule's rate over run_shape.looks gives"
            if written is not None
            else "no boundaries (a spending rule needs its bound at each look)",
            f"set it to {json.dumps(wanted)} (miles_amd.rules.looks; miles-amd baseline record "
            "writes them)",
        )
    return None


def _same(written: object, wanted: list[dict[str, Any]]) -> bool:
    """Whether the file's ``boundaries`` (untrusted JSON) are ``wanted``, to 1e-12."""
    if not isinstance(written, list) or len(written) != len(wanted):
        return False
    return all(
        isinstance(got, Mapping)
        and set(got) == set(want)
        and got["rollout"] == want["rollout"]
        and all(
            isinstance(got[key], (int, float)) and math.isclose(got[key], want[key], rel_tol=1e-12)
            for key in ("information", "z", "alpha_spent")
        )
        for got, want in zip(written, wanted, strict=True)
    )
