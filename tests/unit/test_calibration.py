"""The whole gate passes healthy simulated runs; ``no_rising_trend`` fires on a steady drift
and ``sd_at_least`` on a constant reward (fixed seeds, small counts; the big ones are
benchmarks/bench_calibration.py's)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from miles_amd.baseline.model import BaselineError, load_baseline, parse_baseline
from miles_amd.rules import bands
from miles_amd.rules.kinds import mann_kendall_z, theil_sen
from miles_amd.rules.model import Baseline
from tests.support import simulate
from tests.support.simulate import Regression


@pytest.fixture(scope="module")
def patched() -> Baseline:
    return load_baseline("patched")


@pytest.fixture(scope="module")
def model(patched: Baseline) -> simulate.NoiseModel:
    return simulate.fit(patched)


def test_healthy_runs_pass_the_whole_gate(model: simulate.NoiseModel, patched: Baseline) -> None:
    out = simulate.gate_outcome(model, patched, runs=150, rollouts=20, seed=11)
    assert out.rate <= 0.01, out.by_check
    assert not {"logprob_abs_diff.trend", "raw_reward.spread"} & set(out.by_check)


@pytest.mark.parametrize(
    ("regression", "rule", "at_least"),
    [(Regression("constant", constant_reward=True), "raw_reward.spread", 1.0)],
)
def test_each_new_rule_fires_on_its_regression_class(
    model: simulate.NoiseModel, patched: Baseline, regression: Regression, rule: str, at_least
) -> None:
    out = simulate.gate_outcome(
        model, patched, runs=100, rollouts=20, seed=13, regression=regression
    )
    assert out.by_check.get(rule, 0) / out.runs >= at_least, out.by_check


def test_a_steady_drift_inside_every_band_fails_only_the_shape_rules(
    model: simulate.NoiseModel, patched: Baseline
) -> None:
    """A ±2 sd ramp fails nothing but the trend and the second-half step (which a ramp also
    lifts); with the trend's variance inflated for lag-1 0.3 (Hamed-Rao) the trend alone
    catches it less often than the 90% of independent rollouts (baselines/README.md)."""
    drift = Regression("drift", drift_sd=2.0)
    out = simulate.gate_outcome(model, patched, runs=100, rollouts=20, seed=13, regression=drift)
    shape = {"logprob_abs_diff.trend", "logprob_abs_diff.step"}
    others = {name: n for name, n in out.by_check.items() if name not in shape}
    assert sum(others.values()) <= 3, others
    assert out.rate >= 0.45, out.by_check
    assert out.by_check.get("logprob_abs_diff.trend", 0) / out.runs >= 0.4, out.by_check


def test_mann_kendall_and_theil_sen_by_hand() -> None:
    # S = 3 - 0 for 1,2,3 ; var = 3·2·11/18 = 11/3 ; Z = (3-1)/sqrt(11/3)
    assert mann_kendall_z([1.0, 2.0, 3.0]) == pytest.approx(2 / math.sqrt(11 / 3))
    assert mann_kendall_z([3.0, 2.0, 1.0]) == pytest.approx(-2 / math.sqrt(11 / 3))
    assert mann_kendall_z([1.0, 1.0, 1.0, 1.0]) == 0.0  # all ties: no trend
    assert mann_kendall_z([0.0, 10.0, 0.0, 10.0]) == pytest.approx(0.0, abs=0.6)
    assert theil_sen([0, 1, 2, 3, 4, 5], [1.0, 3.0, 5.0, 7.0, 9.0, 100.0]) == (2.0, 1.0)


def test_chi_square_quantile_is_close_to_the_exact_one() -> None:
    # exact 0.1% quantiles: chi2(10) 1.479, chi2(30) 11.588 (z = 3.0902)
    exact_10 = math.sqrt(0.25 / 64 * 1.479 / 10)
    exact_30 = math.sqrt(0.25 / 64 * 11.588 / 30)
    assert bands.binomial_sd_floor(0.5, 64, 11, 3.0902) == pytest.approx(exact_10, rel=0.04)
    assert bands.binomial_sd_floor(0.5, 64, 31, 3.0902) == pytest.approx(exact_30, rel=0.01)
    assert bands.binomial_sd_floor(0.5, 64, 1, 3.0) == 0.0
    assert 0 < bands.binomial_sd_floor(0.5, 64, 5, 3.0) < bands.binomial_sd_floor(0.5, 64, 40, 3.0)
    assert bands.binomial_sd_floor(0.5, 64, 10**6, 3.0) < math.sqrt(0.25 / 64)


def test_the_loader_re_derives_the_sd_floor(patched: Baseline, tmp_path: Path) -> None:
    raw = json.loads(Path(patched.path).read_text())
    rule = next(r for r in raw["rules"] if r["id"] == "raw_reward.spread")
    rule["floor"] = 0.09
    with pytest.raises(BaselineError, match=r"\$\.rules\[\d+\]\.floor: floor 0\.09 is not the"):
        parse_baseline(json.dumps(raw), path="edited.json")


def test_the_benchmark_refuses_looks_that_do_not_end_at_20(monkeypatch, capsys) -> None:
    """``--looks`` (choosing looks on a tuning seed set): bad looks are exit 2 naming the flag."""
    from benchmarks.bench_calibration import main

    monkeypatch.setattr("sys.argv", ["bench_calibration.py", "--looks", "6,12,10,20"])
    with pytest.raises(SystemExit) as exited:
        main()
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert "argument --looks: '6,12,10,20': give increasing rollouts ending at 20" in err
    assert out == ""
