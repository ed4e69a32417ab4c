"""The gate's ``model.lora_experts`` check on env.json's deep-probe facts.

env.json is written by the real writer (``run.preflight.write_env_json``) with facts made by
the real fact functions of ``run.probes_miles`` from census readings
(``tests.bridge_readings``), into copies of the embedded example; the check is read from the
verdict of :func:`miles_amd.judge.gate.judge` on what the real reader loads.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest

from miles_amd.baseline.model import load_baseline
from miles_amd.evidence.load import load_run
from miles_amd.judge.gate import Check, judge
from miles_amd.recipe.settings import Recipe
from miles_amd.run.preflight import Fact, write_env_json
from miles_amd.run.probes_miles import attention_window_fact, lora_experts_fact, router_dtype_fact
from tests.bridge_readings import NO_ADAPTER, NODE_EXPECTED, UNKNOWN, reading
from tests.conformance.fake_inputs import GPT_OSS_20B_BF16_CONFIG
from tests.constants import EXAMPLE

pytestmark = pytest.mark.unit


def model_facts(census: Mapping[str, object], targets: tuple[str, ...] | None = None) -> list[Fact]:
    recipe = Recipe()
    return [
        lora_experts_fact(census, targets or recipe.target_modules),
        router_dtype_fact(census, recipe.argv()),
        attention_window_fact(census, GPT_OSS_20B_BF16_CONFIG),
    ]


def run_dir(tmp_path: Path, facts: list[Fact] | None) -> Path:
    target = tmp_path / "run"
    shutil.copytree(EXAMPLE, target, ignore=shutil.ignore_patterns("report"))
    if facts is not None:
        write_env_json(facts, target, {})
    return target


def check_of(path: Path, *, require_env: bool = False) -> Check:
    verdict = judge(load_run(path), load_baseline("stock"), require_env=require_env)
    (check,) = [c for c in verdict.checks if c.name == "model.lora_experts"]
    return check


def test_expert_adapters_on_the_node_pass_with_the_router_note(tmp_path: Path) -> None:
    check = check_of(run_dir(tmp_path, model_facts(NODE_EXPECTED)), require_env=True)
    assert (check.status, check.observed) == ("pass", 48)
    assert check.detail.startswith("48 expert linears LoRA-wrapped (48 grouped")
    assert "attention: window (127, 0) on 12 of 24 layers" in check.detail
    assert "router bf16 (24 with moe_router_dtype=None)" in check.detail
    assert "(radixark/miles#3263) (known, tracked: not a failure)" in check.detail


def test_a_router_that_got_fp32_carries_no_tracked_note(tmp_path: Path) -> None:
    fixed = reading(expert=48, grouped=48, window=[127, 0], router="fp32")
    check = check_of(run_dir(tmp_path, model_facts(fixed)))
    assert check.status == "pass" and "router fp32 (24 with moe_router_dtype=fp32)" in check.detail
    assert "tracked" not in check.detail


def test_no_expert_adapter_fails_even_without_require_env(tmp_path: Path) -> None:
    facts = model_facts(NO_ADAPTER, ("gate_up_proj",))
    check = check_of(run_dir(tmp_path, facts))
    assert (check.status, check.observed, check.required) == ("fail", 0, True)
    assert "no MoE expert linear has a LoRA adapter (targets gate_up_proj)" in check.detail


def test_a_zero_count_fails_whatever_the_fact_status_says(tmp_path: Path) -> None:
    """A run dir is untrusted: the count is judged, not only the preflight's verdict on it."""
    (lora, router, window) = model_facts(NO_ADAPTER, ("gate_up_proj",))
    relabelled = Fact(lora.name, "ok", lora.value)
    check = check_of(run_dir(tmp_path, [relabelled, router, window]))
    assert check.status == "fail" and check.detail.startswith("0 expert linears")


def test_a_bare_targeted_expert_linear_fails(tmp_path: Path) -> None:
    half = reading(expert=24, grouped=24, window=[127, 0], bare={"linear_fc2": 24})
    check = check_of(run_dir(tmp_path, model_facts(half)))
    assert check.status == "fail" and "got no adapter: 24 linear_fc2" in check.detail


def test_windows_unlike_config_json_fail(tmp_path: Path) -> None:
    full = reading(expert=48, grouped=48, window=None)
    check = check_of(run_dir(tmp_path, model_facts(full)))
    assert check.status == "fail"
    assert check.detail.startswith("attention windows: window none on 0 of 24 layers")


@pytest.mark.parametrize("require_env", [False, True])
def test_no_count_is_not_measured_and_a_failure_with_require_env(
    tmp_path: Path, require_env: bool
) -> None:
    status = "fail" if require_env else "not_measured"
    unknown = check_of(run_dir(tmp_path / "u", model_facts(UNKNOWN)), require_env=require_env)
    assert unknown.status == status
    assert "lora_experts: unknown: build: ModuleNotFoundError" in unknown.detail
    absent = check_of(run_dir(tmp_path / "a", None), require_env=require_env)
    assert absent.status == status and "no env.json" in absent.detail
    old = check_of(
        run_dir(tmp_path / "o", [Fact("gpus", "ok", "8x gfx950")]), require_env=require_env
    )
    assert old.status == status and "no lora_experts fact" in old.detail
