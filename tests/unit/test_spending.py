"""Alpha spending over looks (issue 27): the boundaries, and the looks a baseline carries.

The boundary solver against the textbook and a simulated canonical process; the looks and
boundaries a baseline must carry, refused with their JSON path (exit 2 for any refused
baseline: ``test_untrusted_input.py``); every shipped spending rule carries its derived ones.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from miles_amd.baseline.model import BaselineError, parse_baseline, resolve_baseline_path
from miles_amd.rules import spending
from miles_amd.rules.looks import DEFAULT_LOOKS, run_looks
from miles_amd.rules.model import BOUNDARIES, Baseline
from miles_amd.rules.registry import KINDS, rule_boundaries

KL_RULE = "train_rollout_kl.mean"
SHIPPED_LOOKS = (6, 8, 10, 12, 14, 16, 20)  # baselines/README.md, "Sequential looks"


def obf(alpha: float, t: float) -> float:
    """Lan-DeMets' O'Brien-Fleming-like spending, for the textbook boundaries."""
    return 2 * spending.upper_tail(spending.upper_quantile(alpha / 2) / math.sqrt(t))


def test_the_solver_gives_the_textbook_obrien_fleming_boundaries() -> None:
    """Jennison & Turnbull's table for four equal looks at one-sided 2.5%."""
    fractions = (0.25, 0.5, 0.75, 1.0)
    found = spending.spend_boundaries(tuple(obf(0.025, t) for t in fractions), fractions)
    assert found == pytest.approx((4.333, 2.963, 2.359, 2.014), abs=2e-3)


# Boundaries of the hand-written Newton solver this module used before scipy's brentq
# (fd7f085): the solver may change, these may not (to 1e-9; the old one stopped at 1e-10).
PINNED = [
    (1e-9, (0.3, 0.65, 1.0), (6.6486615740640245, 6.248778523706905, 6.035206804426305)),
    (
        1e-6,
        (0.25, 0.5, 0.75, 1.0),
        (5.654555615019155, 5.238279321613732, 4.997398890143201, 4.821447620004135),
    ),
    (
        3.2e-5,
        (0.2, 0.4, 0.6, 0.8, 1.0),
        (
            5.17413163461327,
            4.717807857490787,
            4.447830841508277,
            4.247407589067078,
            4.084098374212167,
        ),
    ),
    (
        0.00135,
        (0.25, 0.5, 0.75, 1.0),
        (4.252987346544019, 3.692107664172826, 3.338914386279759, 3.064319629624423),
    ),
    (0.025, (0.5, 1.0), (2.846561629362375, 1.9741350889864286)),
]


@pytest.mark.parametrize(("alpha", "fractions", "pinned"), PINNED)
def test_the_boundaries_keep_their_values_down_to_a_billionth(
    alpha: float, fractions: tuple[float, ...], pinned: tuple[float, ...]
) -> None:
    assert spending.boundaries(alpha, fractions) == pytest.approx(pinned, abs=1e-9, rel=0)


def test_the_boundaries_spend_what_the_function_says_on_a_simulated_process() -> None:
    """Brownian motion in information time: the first crossings at each look are the
    spending function's increments, and over all looks exactly alpha."""
    alpha, fractions = 0.02, (0.3, 0.55, 0.8, 1.0)
    bounds = spending.boundaries(alpha, fractions)
    assert all(b is not None for b in bounds)
    rng = np.random.default_rng(11)
    steps = np.diff(np.concatenate([[0.0], fractions]))
    score = np.cumsum(rng.standard_normal((400_000, 4)) * np.sqrt(steps), axis=1)
    z = score / np.sqrt(fractions)
    crossed = z >= np.asarray(bounds, dtype=float)
    first = np.where(crossed.any(axis=1), crossed.argmax(axis=1), -1)
    spent = [spending.spent(alpha, t) for t in fractions]
    wanted = np.diff(np.concatenate([[0.0], spent]))
    for look, share in enumerate(wanted):
        rate = float((first == look).mean())
        se = math.sqrt(share / 400_000)
        assert abs(rate - share) < 4 * se, (look, rate, share)
    assert spending.spent(alpha, 1.0) == alpha
    assert spending.spent(alpha, 0.5) == pytest.approx(alpha * 0.5**spending.RHO)


def test_a_look_that_would_spend_nothing_judges_nothing() -> None:
    bounds = spending.boundaries(1e-4, (1e-5, 0.5, 1.0))
    assert bounds[0] is None and bounds[1] is not None and bounds[2] is not None
    with pytest.raises(ValueError, match="increase to 1"):
        spending.boundaries(0.01, (0.5, 0.4, 1.0))


def test_a_runs_looks_are_the_declared_ones_below_it_then_its_end(patched: Baseline) -> None:
    assert patched.run_shape.looks == SHIPPED_LOOKS
    assert run_looks(patched.run_shape, 20) == SHIPPED_LOOKS
    assert run_looks(patched.run_shape, 11) == (6, 8, 10, 11)
    assert run_looks(patched.run_shape, 3) == (3,)
    assert run_looks(patched.run_shape, 1000) == (*SHIPPED_LOOKS, 1000)


def shipped_text() -> str:
    return resolve_baseline_path("patched").read_text(encoding="utf-8")


def rule_index(raw: dict, rule_id: str) -> int:
    return next(i for i, r in enumerate(raw["rules"]) if r["id"] == rule_id)


@pytest.mark.parametrize(
    ("looks", "message"),
    [
        ([5, 10, 15], r"\$\.run_shape\.looks: looks \[5, 10, 15\] must lie in 1\.\.20 and end"),
        ([5, 5, 20], r"\$\.run_shape\.looks: looks \[5, 5, 20\] are not increasing"),
        ([0, 20], r"\$\.run_shape\.looks\[0\]: 0 is less than the minimum of 1"),
        ([], r"\$\.run_shape\.looks"),
        # the fix suggests quarters of the run: DEFAULT_LOOKS for 20 rollouts
        ([12, 20, 8], rf"not increasing; fix: .*e\.g\. \{list(DEFAULT_LOOKS)}"),
    ],
)
def test_bad_looks_are_refused_naming_the_json_path(looks: list[int], message: str) -> None:
    raw = json.loads(shipped_text())
    raw["run_shape"]["looks"] = looks
    with pytest.raises(BaselineError, match=message):
        parse_baseline(json.dumps(raw), path="edited.json")


def test_boundaries_are_derived_not_chosen() -> None:
    raw = json.loads(shipped_text())
    index = rule_index(raw, KL_RULE)
    tampered = json.loads(json.dumps(raw))
    tampered["rules"][index][BOUNDARIES][1]["z"] = 9.0  # a bound nobody could cross
    fix = json.dumps(raw["rules"][index][BOUNDARIES])
    with pytest.raises(BaselineError) as refused:
        parse_baseline(json.dumps(tampered), path="edited.json")
    line = str(refused.value)
    assert f"edited.json: $.rules[{index}].boundaries: boundaries are not the ones" in line
    assert f"fix: set it to {fix}" in line
    missing = json.loads(json.dumps(raw))
    del missing["rules"][index][BOUNDARIES]
    with pytest.raises(BaselineError, match=rf"\$\.rules\[{index}\]: 'boundaries' is a required"):
        parse_baseline(json.dumps(missing), path="edited.json")
    spikes = rule_index(raw, "logprob_abs_diff.spikes")
    extra = json.loads(json.dumps(raw))
    extra["rules"][spikes][BOUNDARIES] = raw["rules"][index][BOUNDARIES]
    with pytest.raises(BaselineError, match=r"all_below takes threshold, not boundaries"):
        parse_baseline(json.dumps(extra), path="edited.json")


def test_every_spending_rule_carries_its_derived_boundaries(patched: Baseline) -> None:
    spending_rules = [r for r in patched.rules if KINDS[r.kind].looks == "spending"]
    assert {r.kind for r in spending_rules} == {
        "mean_within", "log_mean_within", "paired_mean_diff", "no_rising_trend", "step_rise",
    }  # fmt: skip
    for rule in spending_rules:
        derived = rule_boundaries(rule, patched, 20, patched.run_shape.looks)
        assert rule.params[BOUNDARIES] == [b.to_json() for b in derived]
        assert derived[-1].rollout == 20 and derived[-1].information == 1.0
        fractions = [b.information for b in derived]
        assert fractions == sorted(fractions)
    step = next(r for r in spending_rules if r.kind == "step_rise")
    # the step from mid-run is first judged at 12: rollouts 10 and 11 after the split
    assert [b["rollout"] for b in step.params[BOUNDARIES]] == [12, 14, 16, 20]
    assert step.params[BOUNDARIES][-1]["alpha_spent"] == pytest.approx(step.params["alpha"])
