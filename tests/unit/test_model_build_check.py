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


ZERO = model_facts(NO_ADAPTER, ("gate_up_proj",))
# id: (env.json's facts (None: no env.json), require_env, status, observed, in the detail,
# not in it)
CASES = {
    "expert adapters on the node, the router note": (
        model_facts(NODE_EXPECTED), True, "pass", 48,
        [
            "48 expert linears LoRA-wrapped (48 grouped",
            "attention: window (127, 0) on 12 of 24 layers",
            "router bf16 (24 with moe_router_dtype=None)",
            "(radixark/miles#3263) (known, tracked: not a failure)",
        ],
        [],
    ),
    "a router that got fp32: no tracked note": (
        model_facts(reading(expert=48, grouped=48, window=[127, 0], router="fp32")), False,
        "pass", 48, ["router fp32 (24 with moe_router_dtype=fp32)"], ["tracked"],
    ),
    "no expert adapter, even without require_env": (
        ZERO, False, "fail", 0,
        ["no MoE expert linear has a LoRA adapter (targets gate_up_proj)"], [],
    ),
    # a run dir is untrusted: the count is judged, not only the preflight's verdict on it
    "a zero count whatever the fact status says": (
        [Fact(ZERO[0].name, "ok", ZERO[0].value), *ZERO[1:]], False, "fail", 0,
        ["0 expert linears"], [],
    ),
    "a bare targeted expert linear": (
        model_facts(reading(expert=24, grouped=24, window=[127, 0], bare={"linear_fc2": 24})),
        False, "fail", 24, ["got no adapter: 24 linear_fc2"], [],
    ),
    "windows unlike config.json": (
        model_facts(reading(expert=48, grouped=48, window=None)), False, "fail", 48,
        ["attention windows: window none on 0 of 24 layers"], [],
    ),
    **{
        f"{what}{', required' * strict}": (
            facts, strict, "fail" if strict else "not_measured", None, [said], []
        )
        for what, facts, said in (
            ("no count", model_facts(UNKNOWN), "lora_experts: unknown: build: ModuleNotFoundError"),
            ("no env.json", None, "no env.json"),
            ("a preflight before the deep probe", [Fact("gpus", "ok", "8x gfx950")],
             "no lora_experts fact"),
        )
        for strict in (False, True)
    },
}  # fmt: skip


@pytest.mark.parametrize(
    ("facts", "strict", "status", "observed", "said", "unsaid"), CASES.values(), ids=CASES.keys()
)
def test_the_lora_experts_check(tmp_path: Path, facts, strict, status, observed, said, unsaid):
    check = check_of(run_dir(tmp_path, facts), require_env=strict)
    assert (check.status, check.observed) == (status, observed), check.detail
    assert check.required == (strict or status == "fail")
    assert all(text in check.detail for text in said), check.detail
    assert not any(text in check.detail for text in unsaid), check.detail
