"""miles_amd.baseline.model and rules.bands: the shipped files, their bands, every bad file."""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
import statistics
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from miles_amd.baseline.model import (
    BASELINES_DIR_ENV,
    BaselineError,
    baselines_root,
    load_baseline,
    parse_baseline,
)
from miles_amd.rules import bands
from miles_amd.rules.bands import BandParams, band_for, log_spread
from miles_amd.rules.model import Baseline, Rule
from tests.constants import LOGPROB, PUBLISHED_LOGPROB, PUBLISHED_REWARD, REWARD, SHIPPED


def shipped_raw(name: str) -> dict:
    return json.loads((SHIPPED / f"{name}.json").read_text())


def rule(raw: dict, rule_id: str) -> dict:
    (found,) = [r for r in raw["rules"] if r["id"] == rule_id]
    return found


def load_text(raw: dict, tmp_path: Path, name: str = "bad.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return path


# ---------------------------------------------------------------------------- shipped files


@pytest.mark.parametrize(
    ("name", "run_id", "aiter"), [("stock", "4it2x89i", "stock"), ("patched", "jvvnhop9", "5694")]
)
def test_shipped_baseline_loads_with_its_provenance_and_writes_back_its_file(
    name: str, run_id: str, aiter: str
) -> None:
    baseline = load_baseline(name)
    assert (baseline.name, baseline.run_id) == (name, run_id)
    # The package's copy (a link in the repo, a file in a wheel) of the repo's baseline.
    text = (SHIPPED / f"{name}.json").read_text(encoding="utf-8")
    assert Path(baseline.path).read_text(encoding="utf-8") == text
    provenance = baseline.provenance
    assert aiter in provenance["aiter"] and "MI355X" in provenance["hardware"]
    assert (provenance["rocm"], provenance["rollouts"], provenance["job_status"]) == (
        "7.2", 20, "SUCCEEDED"
    )  # fmt: skip
    assert provenance["image"] == "rocm/sgl-dev:miles-rocm720-mi35x"
    assert provenance["environment"] == {
        "gpu_arch": "gfx950", "gpu_model": "MI355X", "gpu_count": 8, "rocm": "7.2",
        "aiter_variant": name, "aiter_version": None,  # the seed pull request published none
    }  # fmt: skip
    assert (baseline.run_shape.rollouts, baseline.run_shape.samples_per_rollout) == (20, 64)
    assert all(r.rationale and "\n" not in r.rationale and r.derivation for r in baseline.rules)
    # no rule demands a reward trend (learning); a rising logprob gap is a regression
    assert not any("trend" in r.kind and r.metric == REWARD for r in baseline.rules)
    # the stored shape is spelled once: the loaded object writes back the file, in its order
    written = baseline.to_json()
    assert list(written.items()) == list(json.loads(text).items())
    assert Baseline.from_json(json.loads(json.dumps(written)), baseline.path) == baseline
    assert parse_baseline(text, path="x") == replace(baseline, path="x")


def test_the_shipped_evidence_is_the_published_one() -> None:
    patched, stock = load_baseline("patched"), load_baseline("stock")
    assert patched.series[LOGPROB] == tuple(PUBLISHED_LOGPROB)
    assert patched.series[REWARD] == tuple(PUBLISHED_REWARD)
    summary = patched.summaries[LOGPROB]
    assert (summary["min"], summary["mean"], summary["max"]) == (0.0150, 0.0170, 0.0208)
    assert summary["above_spike_threshold"] == 0
    kl = patched.summaries["train/train_rollout_kl"]
    assert (kl["min"], kl["mean"], kl["max"]) == (6.95e-4, 8.79e-4, 1.53e-3)
    assert patched.summaries["rollout/response_len/mean"]["mean"] == 2920
    assert patched.summaries["rollout/truncated_ratio"]["mean"] == 0.410
    assert patched.summaries[REWARD]["mean"] == 0.56
    assert stock.series == {}
    summary = stock.summaries[LOGPROB]
    assert (summary["min"], summary["mean"], summary["max"]) == (0.0140, 0.0171, 0.0202)
    assert stock.summaries[REWARD]["mean"] == 0.57
    # the stock run's reward spread is borrowed from the patched series on the same prompts
    assert stock.summaries[REWARD]["sd"] == pytest.approx(statistics.stdev(PUBLISHED_REWARD))
    assert not any(r.kind == "paired_mean_diff" for r in stock.rules)


def test_a_rule_keeps_its_kinds_fields_in_file_order_between_the_common_ones() -> None:
    entry = {
        "id": "x", "kind": "sd_at_least", "metric": REWARD, "required": True, "z": 3,
        "floor": 0.05, "rationale": "r", "derivation": "d",
    }  # fmt: skip
    rule = Rule.from_json(entry)
    assert rule.params == {"z": 3, "floor": 0.05}
    assert list(rule.to_json().items()) == list(entry.items())
    no_metric = {k: v for k, v in entry.items() if k != "metric"}
    assert Rule.from_json(no_metric).to_json() == no_metric


def test_patched_bands_recomputed_from_the_shipped_series_match_the_file() -> None:
    """Independent arithmetic (statistics module, the formulas of the derivation text)."""
    raw = shipped_raw("patched")
    n = 20

    def ar1_mean_variance(rho: float) -> float:  # (1/n²) Σ_ij rho^|i-j|, by brute force
        return sum(rho ** abs(i - j) for i in range(n) for j in range(n)) / n**2

    for metric, short, cover_mean, cover_max, run_sd, rho in (
        (LOGPROB, "logprob_abs_diff", 0.0171, 0.0202, 0.03, 0.3),
        (REWARD, "raw_reward", 0.57, None, 0.0, 0.0),
    ):
        values = raw["evidence"]["series"][metric]
        mean, sd = statistics.fmean(values), statistics.stdev(values)
        var = sd**2 * 2 * ar1_mean_variance(rho) + 2 * (run_sd * mean) ** 2
        half = max(4 * math.sqrt(var), abs(cover_mean - mean))
        band = rule(raw, f"{short}.mean")["band"]
        assert band["low"] == pytest.approx(mean - half, rel=1e-3)
        assert band["high"] == pytest.approx(mean + half, rel=1e-3)
        assert band["low"] <= mean - half and band["high"] >= mean + half  # rounded outward
        if cover_max is not None:
            level = 4 * math.sqrt(2) * run_sd * mean
            high = max(mean + (bands.expected_max(n) + 4) * sd + level, cover_max)
            max_band = rule(raw, f"{short}.max")["band"]
            assert max_band["low"] is None
            assert max_band["high"] == pytest.approx(high, rel=1e-3)
            assert max_band["high"] >= high
    # the summaries-only metrics, by the same method
    kl_sd = (1.53e-3 - 6.95e-4) / bands.expected_range(20)
    # the KL on the logarithms (log_mean_within): the log-scale spread from the same range
    kl_rule = next(r for r in load_baseline("patched").rules if r.id == "train_rollout_kl.mean")
    params = {k: v for k, v in kl_rule.params.items() if k != "boundaries"}
    assert params == {"z": 3.25, "rho": 0.3, "run_sd": 0.06}
    kl_logs = log_spread(load_baseline("patched"), "train/train_rollout_kl")
    assert kl_logs.sd == pytest.approx(math.log(1.53e-3 / 6.95e-4) / bands.expected_range(20))
    assert kl_logs.mean == pytest.approx(math.log(8.79e-4) - kl_logs.sd**2 / 2)
    assert kl_logs.sd < kl_sd / 8.79e-4  # the long right tail: log range < relative sd
    truncation_sd = math.sqrt(0.41 * 0.59 / 8)
    truncation = rule(raw, "truncated_ratio.mean")["band"]
    assert truncation["high"] == pytest.approx(0.41 + 4 * truncation_sd * math.sqrt(0.1), rel=1e-3)
    # and through the module a future `baseline record` uses: exactly the file's numbers
    patched = load_baseline("patched")
    for r in patched.rules:
        if r.kind in ("mean_within", "max_within"):
            assert band_for(r, patched, 20) == BandParams.of(r).band


def test_the_published_runs_lie_inside_each_others_bands() -> None:
    stock, patched = load_baseline("stock"), load_baseline("patched")
    stock_mean = BandParams.of(next(r for r in stock.rules if r.id == "logprob_abs_diff.mean")).band
    patched_mean = BandParams.of(
        next(r for r in patched.rules if r.id == "logprob_abs_diff.mean")
    ).band
    assert stock_mean.contains(0.0170) and patched_mean.contains(0.0171)
    assert stock_mean.contains(statistics.fmean(PUBLISHED_LOGPROB))


def test_fixed_tolerances_follow_from_the_run_shape() -> None:
    patched = load_baseline("patched")
    fingerprint = next(r for r in patched.rules if r.kind == "multiple_of")
    assert fingerprint.params["quantum"] == 1 / 64
    for value in PUBLISHED_REWARD:  # the published rounding is within 5e-5 of k/64
        assert abs(value * 64 - round(value * 64)) / 64 <= 5e-5
    clip = next(r for r in patched.rules if r.kind == "near_zero")
    one_token = bands.single_token_fraction(64, 4096)
    assert clip.params["atol"] == pytest.approx(one_token / 2, rel=1e-3)
    assert clip.params["atol"] < one_token


# ---------------------------------------------------------------------------- location


def test_shipped_baselines_are_found_from_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BASELINES_DIR_ENV, raising=False)
    shipped = baselines_root() / "gpt_oss_20b_lora" / "8gpu" / "mi355x"
    for name in ("stock.json", "patched.json"):
        assert (shipped / name).read_bytes() == (SHIPPED / name).read_bytes()


def test_env_var_overrides_the_shipped_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "gpt_oss_20b_lora" / "8gpu" / "mi355x"
    target.mkdir(parents=True)
    raw = shipped_raw("stock")
    raw["description"] = "a copy under test"
    (target / "stock.json").write_text(json.dumps(raw))
    monkeypatch.setenv(BASELINES_DIR_ENV, str(tmp_path))
    assert load_baseline("stock").description == "a copy under test"
    with pytest.raises(BaselineError, match=r"--baseline patched: shipped baseline not found at"):
        load_baseline("patched")


@pytest.mark.parametrize("baseline", ["patched", "MINE"])
def test_a_symlink_loop_in_the_env_var_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, baseline: str
) -> None:
    """A looping $MILES_AMD_BASELINES_DIR ended in a RuntimeError traceback when the gate
    asked whether a baseline file lies in the shipped dir; now one line naming it."""
    from miles_amd.app import AppError
    from miles_amd.app.baselines import load

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    mine = tmp_path / "mine" / "patched.json"
    mine.parent.mkdir()
    shutil.copy(SHIPPED / "patched.json", mine)
    monkeypatch.setenv(BASELINES_DIR_ENV, str(tmp_path / "a"))
    with pytest.raises(AppError) as error:
        load(str(mine) if baseline == "MINE" else baseline, "--baseline")
    assert f"${BASELINES_DIR_ENV} {tmp_path / 'a'}: cannot be followed" in str(error.value)
    assert "\n" not in str(error.value)


def test_a_file_not_named_after_its_baseline_is_refused_with_the_fix(tmp_path: Path) -> None:
    # docs/cli.md's old update flow renamed patched.new.json (name "patched.new") to
    # patched.json, and the gate then said "against baseline patched.new"
    path = tmp_path / "patched.new.json"
    shutil.copy(SHIPPED / "patched.json", path)
    with pytest.raises(BaselineError) as error:
        load_baseline(path)
    assert str(error.value) == (
        f"{path}: $.name: the file holds baseline 'patched' but is named patched.new.json; "
        "fix: rename the file patched.json, or record it again with --name patched.new"
    )


# ---------------------------------------------------------------------------- bad files


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ('"name": "stock"', '"name": oops', r"line 4 column 11: invalid JSON"),
        ('"threshold": 0.15', '"threshold": NaN', r"\$\.rules\[3\]\.threshold: non-finite"),
        ('"threshold": 0.15', '"threshold": 1e999', r"\$\.rules\[3\]\.threshold: non-finite"),
        ('"min": 0.014,', '"min": -1e999,',
         r"\$\.evidence\.summaries\['train/train_rollout_logprob_abs_diff'\]\.min: non-finite"),
        ('"cover": [0.017]', '"cover": [0.017, 2e308]', r"\.derive\.cover\[1\]: non-finite"),
    ],
)  # fmt: skip
def test_invalid_json_or_a_non_finite_number_is_one_line_naming_where(
    tmp_path: Path, old: str, new: str, expected: str
) -> None:
    """``1e999`` and ``2e308`` parse as infinity with Python's json: refused like ``NaN``."""
    text = (SHIPPED / "stock.json").read_text()
    assert old in text
    path = tmp_path / "nan.json"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(BaselineError) as error:
        load_baseline(path)
    message = str(error.value)
    assert message.startswith(f"{path}: ") and "\n" not in message, message
    assert re.search(expected, message), message
    fix = "write a finite number" if "non-finite" in expected else "correct the JSON there"
    assert message.endswith(f"; fix: {fix}"), message


DELETE = object()


def edit(path: str, value: object) -> Callable[[dict], None]:
    """Set (or DELETE) the field at ``path``: space-separated keys, a rule named by its id or
    its index in ``rules``."""

    def apply(raw: dict) -> None:
        *parents, last = path.split(" ")
        node: Any = raw
        for key in parents:
            if isinstance(node, list):
                node = node[int(key)] if key.isdigit() else rule(raw, key)
            else:
                node = node[key]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value

    return apply


def _rederive(raw: dict, rule_id: str) -> None:
    """Rewrite a band rule's band to the one its (edited) derive block gives: self-consistent."""
    target = rule(raw, rule_id)
    spread = bands.series_spread(raw["evidence"]["series"][target["metric"]])
    method = getattr(bands, target["derive"]["method"])
    band = method(spread, 20, target["derive"]["k"], target["derive"]["cover"])
    target["band"] = {"low": band.low, "high": band.high}


def rederived(path: str, value: object) -> Callable[[dict], None]:
    def apply(raw: dict) -> None:
        edit(path, value)(raw)
        _rederive(raw, path.split(" ")[1])

    return apply


def without(rule_id: str) -> Callable[[dict], None]:
    def apply(raw: dict) -> None:
        raw["rules"] = [r for r in raw["rules"] if r["id"] != rule_id]

    return apply


def none_required(raw: dict) -> None:
    for r in raw["rules"]:
        r["required"] = False


def paired_on_kl(raw: dict) -> None:
    edit("rules raw_reward.paired metric", "train/train_rollout_kl")(raw)
    edit("rules raw_reward.paired required", False)(raw)


def duplicate_id(raw: dict) -> None:
    raw["rules"][2]["id"] = raw["rules"][1]["id"]


def tiny_quantum(raw: dict) -> None:
    edit("rules raw_reward.batch_fingerprint quantum", 1e-9)(raw)
    edit("rules raw_reward.batch_fingerprint atol", 1e-12)(raw)


# (base file, mutation, the error: each is one line "<file>: $<path>: ...; fix: ...")
BAD_FILES = [
    # the schema (stock)
    ("stock", edit("rules 3 rationale", DELETE),
     r"\$\.rules\[3\]: 'rationale' is a required property; fix: add"),
    ("stock", edit("rules 3 kind", "reward_trend"),
     r"\$\.rules\[3\]\.kind: 'reward_trend' is not one of .*fix: use one of"),
    ("stock", edit("provenance colour", "blue"),
     r"\$\.provenance: Additional properties .*'colour'.*fix: remove the field"),
    ("stock", edit("rules 1 required", "yes"),
     r"\$\.rules\[1\]\.required: 'yes' is not of type 'boolean'"),
    ("stock", edit("rules 3 threshold", DELETE),
     r"\$\.rules\[3\]: 'threshold' is a required property"),
    ("stock", edit("rules 3 rationale", "first\nsecond"),
     r"\$\.rules\[3\]\.rationale: .* does not match"),
    ("stock", edit("rules 0 metric", "train/x"),
     r"\$\.rules\[0\]: this kind takes no 'metric'; fix: remove the field"),
    ("stock", edit("run_shape rollouts", 0),
     r"\$\.run_shape\.rollouts: 0 is less than the minimum of 1"),
    # consistency (patched)
    ("patched", duplicate_id, r"\$\.rules\[2\]\.id: duplicate id 'logprob_abs_diff\.steps'"),
    ("patched", without("raw_reward.finite"),
     r"\$\.rules: metric rollout/raw_reward is gated but has no finite rule"),
    ("patched", edit("rules raw_reward.steps required", False),
     r"steps_complete rule of rollout/raw_reward is optional.*set required"),
    ("patched", none_required, r"\$\.rules: no required steps_complete rule"),
    ("patched", edit(f"evidence series {REWARD}", PUBLISHED_REWARD[:19]),
     r"\$\.evidence\.series\['rollout/raw_reward'\]: 19 values for 20 rollouts"),
    ("patched", paired_on_kl, r"paired comparison needs a per-rollout series"),
    ("patched", edit("rules logprob_abs_diff.mean band low", 0.01),
     r"\$\.rules\[\d+\]\.band: band .* is not the derived one; fix: set it to"),
    ("patched", edit("rules raw_reward.mean derive k", 2.0),
     r"\$\.rules\[\d+\]\.band: band .* is not the derived one"),
    ("patched", edit("rules logprob_abs_diff.max derive method", "mean_band"),
     r"\.derive\.method: max_within takes method max_band"),
    ("patched", edit("evidence summaries train/train_rollout_kl min", DELETE),
     r"cannot take the reference's log-scale spread of train/train_rollout_kl"),
    # absurd but self-consistent tolerances (patched)
    ("patched", edit("rules logprob_abs_diff.spikes threshold", 1e9),
     r"\.threshold: threshold 1e\+09 outside its sane range"),
    ("patched", tiny_quantum, r"\.quantum: quantum 1e-09 is not 1/64"),
    ("patched", edit("rules raw_reward.batch_fingerprint atol", 1 / 128),
     r"\.atol: atol 0\.0078125 exceeds 1/100 of the grid step"),
    ("patched", edit("rules pg_clipfrac.near_zero atol", 1e9),
     r"\.atol: atol 1e\+09 is not the derived 1\.907e-06"),
    ("patched", edit("rules raw_reward.paired z", 1e6),
     r"\.z: 1000000\.0 is greater than the maximum of 6; fix: use a smaller"),
    ("patched", rederived("rules raw_reward.mean derive k", 1000.0),
     r"\.derive\.k: 1000\.0 is greater than the maximum of 6"),
    ("patched", rederived("rules logprob_abs_diff.mean derive cover", [1e9]),
     r"\.derive\.cover: cover 1e\+09 is .* beyond 2x the derived reach"),
    ("patched", edit("rules job.status expected_status", "FAILED"),
     r"\.expected_status: 'SUCCEEDED' was expected"),
]  # fmt: skip


@pytest.mark.parametrize(("base", "mutate", "expected"), BAD_FILES)
def test_a_bad_file_is_one_line_naming_file_json_path_and_fix(
    tmp_path: Path, base: str, mutate, expected: str
) -> None:
    raw = copy.deepcopy(shipped_raw(base))
    mutate(raw)
    path = load_text(raw, tmp_path)
    with pytest.raises(BaselineError) as error:
        load_baseline(path)
    message = str(error.value)
    assert message.startswith(f"{path}: $") and "; fix: " in message and "\n" not in message
    assert re.search(expected, message), message


# ---------------------------------------------------------------------------- bands


def test_order_statistics_match_the_tables() -> None:
    # Tippett's d2 and the expected normal maximum, as tabulated in quality-control texts
    assert bands.expected_range(2) == pytest.approx(2 / math.sqrt(math.pi), abs=1e-6)
    assert bands.expected_range(20) == pytest.approx(3.735, abs=5e-4)
    assert bands.expected_max(1) == 0.0
    assert bands.expected_max(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-6)
    assert bands.expected_max(20) == pytest.approx(1.8675, abs=1e-4)
    assert bands.expected_max(1000) == pytest.approx(3.2414, abs=1e-3)


def test_round_outward_never_tightens() -> None:
    assert bands.round_outward(0.0148123, up=False) == 0.01481
    assert bands.round_outward(0.0148123, up=True) == 0.01482
    assert bands.round_outward(2091.3, up=False) == 2091.0
    assert bands.round_outward(-0.123456, up=False) == -0.1235
    assert bands.round_outward(0.5, up=True) == 0.5


def test_mean_band_widens_for_fewer_rollouts_and_covers() -> None:
    spread = bands.Spread(mean=1.0, sd=0.1, n=20, how="test")
    b20, b3 = bands.mean_band(spread, 20, 4), bands.mean_band(spread, 3, 4)
    assert b20.low == pytest.approx(1 - 4 * 0.1 * math.sqrt(0.1), rel=1e-3)
    assert b3.low < b20.low and b3.high > b20.high
    covered = bands.mean_band(spread, 20, 4, cover=[2.0])
    assert covered.high >= 2.0 and covered.low <= 0.0


def test_max_band_grows_with_the_rollout_count() -> None:
    spread = bands.Spread(mean=1.0, sd=0.1, n=20, how="test")
    assert bands.max_band(spread, 1000, 4).high > bands.max_band(spread, 20, 4).high
    assert bands.max_band(spread, 20, 4, cover=[5.0]).high == 5.0
    assert bands.max_band(spread, 20, 4).low is None


def test_spreads() -> None:
    spread = bands.series_spread([1.0, 2.0, 3.0])
    assert (spread.mean, spread.sd, spread.n) == (2.0, 1.0, 3)
    ranged = bands.range_spread(0.5, 0.0, 1.0, 2)
    assert ranged.sd == pytest.approx(math.sqrt(math.pi) / 2, rel=1e-6)
    bounded = bands.bounded_spread(0.5, 0.0, 1.0, groups=4, n=20)
    assert bounded.sd == pytest.approx(0.25)
    with pytest.raises(ValueError):
        bands.series_spread([1.0, math.nan])
    with pytest.raises(ValueError):
        bands.range_spread(2.0, 0.0, 1.0, 20)


def test_paired_effect_uses_the_larger_of_observed_and_binomial_variance() -> None:
    reference = [0.5] * 4
    identical = bands.paired_effect(reference, reference, samples_per_rollout=64)
    assert identical.mean_diff == 0 and identical.sd_observed == 0
    assert identical.se == pytest.approx(math.sqrt(2 * 0.25 / 64 / 4))  # the binomial floor
    noisy = bands.paired_effect([0.0, 1.0, 0.0, 1.0], reference, samples_per_rollout=64)
    assert noisy.sd_observed == pytest.approx(statistics.stdev([-0.5, 0.5, -0.5, 0.5]))
    assert noisy.se == pytest.approx(noisy.sd_observed / 2)
    shifted = bands.paired_effect([0.4] * 20, [0.5] * 20, samples_per_rollout=64)
    assert shifted.mean_diff == pytest.approx(-0.1)
    assert shifted.se == pytest.approx(math.sqrt((0.24 + 0.25) / 64 / 20))
    assert shifted.z < -3


def test_band_contains_rejects_nan() -> None:
    band = bands.Band(0.0, 1.0)
    assert band.contains(0.5) and band.contains(0.0) and band.contains(1.0)
    assert not band.contains(math.nan) and not band.contains(1.5) and not band.contains(-0.1)
    assert bands.Band(None, 1.0).contains(-1e9)
    assert not bands.Band(None, 1.0).contains(math.inf)


@pytest.mark.parametrize("flag", ["--baseline", "--gate"])
def test_an_unknown_baseline_names_the_flag_it_came_from(flag: str) -> None:
    with pytest.raises(BaselineError) as error:
        load_baseline("bogus", flag=flag)
    message = str(error.value)
    assert message.startswith(f"{flag} bogus: no such baseline file; fix: use {flag} stock, ")
    assert "\n" not in message


@pytest.mark.parametrize(
    ("key", "value"),
    [("samples_per_rollout", 1_000_000_000), ("max_response_tokens", 1)],
)
def test_a_run_shape_other_than_the_recipes_is_refused(
    tmp_path: Path, key: str, value: int
) -> None:
    """The grid quantum and the one-token atol derive from run_shape: it must be the recipe's."""
    raw = copy.deepcopy(shipped_raw("stock"))
    raw["run_shape"][key] = value
    for r in raw["rules"]:  # keep the derived tolerances self-consistent with the new shape
        if r["kind"] == "multiple_of" and key == "samples_per_rollout":
            r["quantum"], r["atol"] = 1 / value, 1e-12
        if r["kind"] == "near_zero":
            shape = {**raw["run_shape"]}
            one = bands.single_token_fraction(
                shape["samples_per_rollout"], shape["max_response_tokens"]
            )
            r["atol"] = bands.round_outward(one / 2, up=False)
    path = load_text(raw, tmp_path)
    with pytest.raises(BaselineError, match=rf"\$\.run_shape\.{key}: {value} is not the recipe's"):
        load_baseline(path)
