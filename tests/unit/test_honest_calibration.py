"""The rules issue 19 changed, by hand and on simulated runs through the real gate: healthy
runs pass, each rule fires on the regression it is for (small fixed-seed counts; the big ones
are ``benchmarks/bench_calibration.py``'s)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from miles_amd.baseline.model import load_baseline
from miles_amd.rules import bands
from miles_amd.rules import kinds as step_rules
from miles_amd.rules.bands import log_spread
from miles_amd.rules.kinds import hamed_rao_factor
from miles_amd.rules.model import Baseline
from tests.run_dirs import published_values
from tests.support import calibrate, honest
from tests.support.simulate import KL, LOGPROB, REWARD


@pytest.fixture(scope="module")
def baselines() -> tuple[Baseline, Baseline]:
    return load_baseline("patched"), load_baseline("stock")


@pytest.fixture(scope="module")
def model(baselines) -> honest.HonestModel:
    return honest.honest_model(*baselines)


def test_healthy_runs_pass_the_gate_against_a_recorded_simulated_reference(
    model, baselines
) -> None:
    tally = calibrate.run_cell(calibrate.Cell(model, baselines[0], 20, 5), 15, 2)
    assert tally.rate <= 0.03, tally.by_check


@pytest.mark.parametrize(
    ("fault", "check"),
    [
        (honest.Fault("late", late_reward_factor=0.5), "raw_reward.paired"),
        (honest.Fault("drop", reward_shift=-0.12), "raw_reward.paired"),
        (honest.Fault("step", step_from_mid=1.5), "logprob_abs_diff.step"),
        (honest.Fault("kl", kl_scale=3.0), "train_rollout_kl.mean"),
    ],
)
def test_each_changed_rule_fires_on_its_regression(model, baselines, fault, check) -> None:
    tally = calibrate.run_cell(calibrate.Cell(model, baselines[0], 20, 5, fault), 8, 9)
    assert tally.by_check.get(check, 0) / tally.runs >= 0.8, tally.by_check


def test_the_step_is_the_weighted_difference_of_means_at_rho_0_and_pooling_narrows_it() -> None:
    rng = np.random.default_rng(4)
    reference = bands.Spread(0.0, 0.1, 20, "by hand")
    run = [float(v) + (0.2 if i >= 10 else 0.0) for i, v in enumerate(rng.normal(0.0, 0.1, 20))]
    head, tail = math.fsum(run[:10]) / 10, math.fsum(run[10:]) / 10
    residual = math.fsum((v - head) ** 2 for v in run[:10]) + math.fsum(
        (v - tail) ** 2 for v in run[10:]
    )
    sd2 = (19 * 0.01 + residual) / 37
    v_ref, v_head = sd2 / 20 + 2 * 0.03**2, sd2 / 10
    a = (1 / v_head) / (1 / v_head + 1 / v_ref)
    by_hand = (tail - a * head) / math.sqrt(sd2 * (a * a + 1) / 10 + (1 - a) ** 2 * v_ref)
    z = step_rules.step_rise_z(run, reference, run_sd=0.03, rho=0.0)[0]
    assert z == pytest.approx(by_hand, rel=1e-12)
    # a pooled level of the same value (pool = e^(sd²/2): log-scale mean 0) is more precise
    same = math.exp(0.1**2 / 2)
    pooled = step_rules.step_rise_z(run, reference, run_sd=0.03, rho=0.0, pool=same)[0]
    assert pooled > z > 0
    assert step_rules.reference_level(reference, 0.01, run_sd=0.03, rho=0.0, pool=same) == (
        pytest.approx(0.0, abs=1e-15),
        pytest.approx(0.01 / 40 + 1.5 * 0.03**2),
    )
    # at rho 0.3 the GLS step of a clean step stays large, of a flat run near 0
    flat = [float(v) for v in rng.normal(0.0, 0.1, 20)]
    assert abs(step_rules.step_rise_z(flat, reference, run_sd=0.03, rho=0.3, pool=same)[0]) < 3
    step = [v + (0.5 if i >= 10 else 0.0) for i, v in enumerate(flat)]
    assert step_rules.step_rise_z(step, reference, run_sd=0.03, rho=0.3, pool=same)[0] > 5


@pytest.mark.parametrize(
    ("pool", "message"),
    [
        (0.0123, r"\.pool: pool 0\.0123 is no cover value"),
        (0.0, r"\.pool: pool 0 has no logarithm"),
    ],
)
def test_the_loader_refuses_a_step_pool_that_is_no_cover(baselines, pool, message) -> None:
    import json
    from pathlib import Path

    from miles_amd.baseline.model import BaselineError, parse_baseline

    raw = json.loads(Path(baselines[0].path).read_text())
    rule = next(r for r in raw["rules"] if r["id"] == "logprob_abs_diff.step")
    rule["pool"] = pool
    with pytest.raises(BaselineError, match=message):
        parse_baseline(json.dumps(raw), path="edited.json")


def test_the_statistics_by_hand() -> None:
    reference = bands.series_spread([1.0 + 0.1 * (-1) ** i for i in range(20)])
    flat = [1.0] * 10 + [2.0] * 10
    assert step_rules.step_rise_z(flat, reference, run_sd=0.0, rho=0.0)[0] > 10
    assert step_rules.step_rise_z(flat[::-1], reference, run_sd=0.0, rho=0.0)[0] < 0
    # a run level within the declared run effect (3%) barely moves it
    level = [1.03 + 0.1 * (-1) ** i for i in range(20)]
    assert abs(step_rules.step_rise_z(level, reference, run_sd=0.03, rho=0.0)[0]) < 1
    stock = load_baseline("stock")
    logs = log_spread(stock, LOGPROB)  # from the published min/mean/max
    assert logs.sd == pytest.approx(math.log(0.0202 / 0.014) / bands.expected_range(20))
    assert math.exp(logs.mean + logs.sd**2 / 2) == pytest.approx(0.0171)
    assert step_rules.threshold(0.0025, 20, 20) == pytest.approx(2.99, abs=0.02)  # t, 37 dof
    # Bartlett: 37 x 0.91/1.09 = 30.9 dof at rho 0.3
    assert step_rules.threshold(0.002, 20, 20, 0.3) == pytest.approx(3.11, abs=0.01)
    assert bands.mean_variance(10, 0.0) == pytest.approx(0.1)
    assert bands.mean_variance(10, 0.3) > 0.1 * 1.5
    assert hamed_rao_factor(20, 0.0) == 1.0
    assert 1.5 < hamed_rao_factor(20, 0.3) < (1.3 / 0.7)
    # the paired drop: the exact binomial SE, not the observed spread of the differences
    ref = [0.5, 0.6] * 10
    half = [v / 2 for v in ref[:14]] + ref[14:]
    drop = bands.paired_drop(half, ref, samples_per_rollout=64, groups=8, run_sd=0.0, pool=None)
    assert drop.z < -5
    assert drop.sd_observed is not None and drop.sd_observed > drop.sd_binomial_floor
    same = bands.paired_drop(ref, ref, samples_per_rollout=64, groups=8, run_sd=0.0, pool=None)
    assert same.mean_diff == 0.0
    pooled = bands.paired_drop(ref, ref, samples_per_rollout=64, groups=8, run_sd=0.0, pool=0.45)
    assert pooled.mean_diff == pytest.approx(0.05) and pooled.se < same.se
    # with rho and run_sd 0 the band is today's
    spread = bands.Spread(1.0, 0.1, 20, "")
    assert bands.mean_band(spread, 20, 4.0) == bands.mean_band(spread, 20, 4.0, (), 0.0, 0.0)
    wider, today = bands.mean_band(spread, 20, 4.0, (), 0.03, 0.3), bands.mean_band(spread, 20, 4.0)
    assert wider.high is not None and today.high is not None and wider.high > today.high


# ---------------------------------------------------------------------------- the gate on
# the published series: the regressions issue 19 found passing now fail, by the named rule


def _judge(values: dict[str, list[float]], baseline: Baseline):
    from miles_amd.judge.gate import judge
    from tests.support.simulate import evidence

    return judge(evidence({m: np.asarray([v]) for m, v in values.items()}, 0), baseline)


def _status(verdict, name: str) -> str:
    (check,) = [c for c in verdict.checks if c.name == name]
    return check.status


def test_a_late_reward_collapse_fails_the_paired_rule_and_a_rise_does_not(baselines) -> None:
    from dataclasses import replace

    patched = baselines[0]
    values = published_values()
    # the reward halves in the last 7 rollouts; elsewhere it differs by ±5/64 (sampling)
    noisy = [v + (5 / 64 if i % 2 else -5 / 64) for i, v in enumerate(values[REWARD])]
    values[REWARD] = noisy[:13] + [round(v * 32) / 64 for v in noisy[13:]]
    assert _status(_judge(values, patched), "raw_reward.paired") == "fail"
    assert _status(_judge(values, patched), "raw_reward.mean") == "pass"  # the blind spot
    # the two-sided test with the observed SE (before issue 19) let it through
    two_sided = {"z": 3.0}
    rules = tuple(
        replace(r, params=two_sided) if r.id == "raw_reward.paired" else r for r in patched.rules
    )
    assert _status(_judge(values, replace(patched, rules=rules)), "raw_reward.paired") == "pass"
    # a reward rise is no regression of the one-sided rule
    rise = published_values()
    rise[REWARD] = [min(1.0, v + 6 / 64) for v in rise[REWARD]]
    assert _status(_judge(rise, patched), "raw_reward.paired") == "pass"


def test_a_mid_run_step_fails_the_step_rule_inside_the_mean_band(baselines) -> None:
    for baseline in baselines:
        values = published_values()
        values[LOGPROB] = values[LOGPROB][:10] + [v * 1.3 for v in values[LOGPROB][10:]]
        verdict = _judge(values, baseline)
        assert _status(verdict, "logprob_abs_diff.step") == "fail", baseline.name
        assert _status(verdict, "logprob_abs_diff.mean") == "pass", baseline.name
        assert _status(_judge(published_values(), baseline), "logprob_abs_diff.step") == "pass"


def test_the_kl_level_on_logarithms_by_hand_with_the_run_spread_pooled() -> None:
    from miles_amd.rules.kinds import log_mean_z

    reference = bands.Spread(0.0, 0.2, 20, "by hand")
    logs = [0.1 * (-1) ** i + 0.05 for i in range(20)]  # mean 0.05, residual sd² = 0.01·20/19
    sd2 = (19 * 0.04 + 20 * 0.01) / 38
    se = math.sqrt(sd2 * (1 / 20 + 1 / 20) + 2 * 0.06**2)
    assert log_mean_z(logs, reference, run_sd=0.06, rho=0.0) == (
        pytest.approx(0.05 / se),
        pytest.approx(se),
    )
    # a run whose spread is wider widens its own SE: the same shift reads as fewer SE
    wide = [0.6 * (-1) ** i + 0.05 for i in range(20)]
    assert log_mean_z(wide, reference, run_sd=0.06, rho=0.0)[0] < 0.6 * 0.05 / se


def test_the_kl_rule_fails_a_doubled_kl_and_passes_a_skewed_healthy_one(baselines) -> None:
    patched = baselines[0]
    healthy = published_values()
    # the published shape: most values near the min, a few far up (min 6.95e-4, max 1.53e-3)
    healthy[KL] = [7.0e-4] * 12 + [7.6e-4, 8.0e-4, 8.6e-4, 9.5e-4, 1.05e-3, 1.2e-3, 1.4e-3, 1.53e-3]
    assert _status(_judge(healthy, patched), "train_rollout_kl.mean") == "pass"
    doubled = dict(healthy, **{KL: [2 * v for v in healthy[KL]]})
    verdict = _judge(doubled, patched)
    assert _status(verdict, "train_rollout_kl.mean") == "fail"
    (check,) = [c for c in verdict.checks if c.name == "train_rollout_kl.mean"]
    assert check.numbers["high"] < check.numbers["value"]  # the plot hint's band, below it
    broken = dict(healthy, **{KL: [0.0, *healthy[KL][1:]]})
    (check,) = [c for c in _judge(broken, patched).checks if c.name == "train_rollout_kl.mean"]
    assert check.status == "fail" and "no logarithm" in check.detail
