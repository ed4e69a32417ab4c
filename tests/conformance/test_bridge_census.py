"""The deep probe's build and census (``node/bridge_census.py``) on the real Megatron-Bridge,
miles and Megatron-LM on CPU (``child.py census``), read through the preflight's own fact
functions; ``--target-modules gate_up_proj`` is the negative control (docs/conformance.md,
"The trainer's model, built")."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from miles_amd.recipe.settings import Recipe
from miles_amd.run.probes_miles import (
    CENSUS,
    attention_window_fact,
    lora_experts_fact,
    router_dtype_fact,
)
from tests.conformance.fake_inputs import GPT_OSS_20B_BF16_CONFIG, make_fake_inputs
from tests.conformance.harness import CHILD, IMPORT_STUBS, given, run_child

pytestmark = [pytest.mark.conformance, pytest.mark.xdist_group("bridge-census")]

BRIDGE_PYTHON = "MILES_AMD_BRIDGE_PYTHON"
HOW = (
    f"the bridge census needs a python with megatron-bridge: build one as "
    f"requirements/bridge-cpu.txt says and set {BRIDGE_PYTHON}; and the conformance tier's "
    "miles and Megatron-LM checkouts (--miles-src/--megatron-src or .ci/conformance-env)"
)


@pytest.fixture(scope="module")
def censuses(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The recipe's census (key ``""``) and the ``gate_up_proj`` control's, in one child."""
    python, values = os.environ.get(BRIDGE_PYTHON), given(request.config)
    sources = [values.get("--miles-src"), values.get("--megatron-src")]
    if not python or not all(sources):
        pytest.skip(HOW)
    root = tmp_path_factory.mktemp("census")
    model_dir, data_dir = make_fake_inputs(root / "inputs")
    miles, megatron = (str(Path(s).resolve()) for s in sources if s)
    argv = Recipe(
        model_dir=str(model_dir), data_dir=str(data_dir), miles_dir=miles, megatron_dir=megatron
    ).argv()
    no_triton = subprocess.run([python, "-c", "import triton"], capture_output=True).returncode
    path = [miles, megatron] + ([str(IMPORT_STUBS)] if no_triton else [])
    result = root / "census.json"
    command = [python, str(CHILD), "census", str(CENSUS), str(result), "gate_up_proj", "--"]
    run_child([*command, *argv], {**os.environ, "PYTHONPATH": os.pathsep.join(path)}, 900.0)
    readings: dict[str, Any] = json.loads(result.read_text())
    return readings


@pytest.fixture(scope="module")
def recipe_census(censuses: dict[str, Any]) -> dict[str, Any]:
    return censuses[""]


def test_every_expert_linear_of_every_layer_gets_an_adapter(recipe_census) -> None:
    lora = recipe_census["lora"]
    assert (lora["expert"], lora["expert_per_expert"], lora["expert_layers"]) == (1536, 1536, 24)
    assert (lora["other"], lora["bare_expert"]) == (0, {})  # only the experts are targeted
    assert lora["expert_adapters"] == {"ParallelLinearAdapter": 1536}
    assert lora["examples"][0] == "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1"
    fact = lora_experts_fact(recipe_census, Recipe().target_modules)
    assert fact.status == "ok" and fact.value.startswith("1536 expert linears LoRA-wrapped")


def test_the_router_is_left_in_bf16_as_miles_3263_says(recipe_census) -> None:
    assert recipe_census["router"]["moe_router_dtype"] == {"None": 24}
    assert recipe_census["router"]["params_dtype"] == "bf16"
    fact = router_dtype_fact(recipe_census, recipe_census["argv"])
    assert fact.value.startswith("bf16 (24 with moe_router_dtype=None)")
    assert "--moe-router-dtype fp32 does not reach it" in fact.value


def test_windowed_layers_are_config_json_sliding_layers(recipe_census) -> None:
    attention = recipe_census["attention"]
    sliding = [t == "sliding_attention" for t in GPT_OSS_20B_BF16_CONFIG["layer_types"]]
    assert [bool(w) for w in attention["layers"]] == sliding
    assert attention["window_attn_skip_freq"] == 2
    assert all(w == attention["window_size"] for w in attention["layers"] if w)
    assert attention_window_fact(recipe_census, GPT_OSS_20B_BF16_CONFIG).status == "ok"


def test_gate_up_proj_builds_a_model_without_expert_adapters(censuses) -> None:
    gate_up = censuses["gate_up_proj"]
    lora = gate_up["lora"]
    assert (lora["expert"], lora["other"]) == (0, 0)
    assert lora["bare_expert"] == {"linear_fc1": 768, "linear_fc2": 768}
    fact = lora_experts_fact(gate_up, ("gate_up_proj",))
    assert fact.status == "wrong" and "no MoE expert linear has a LoRA adapter" in fact.message
