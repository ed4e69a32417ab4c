"""The deep probe's build and census on the real Megatron-Bridge, miles and Megatron-LM, on CPU.

``bridge_harness.py`` runs ``node/bridge_census.py``'s :func:`build_meta_model` (miles' own
``_setup_lora_model_via_bridge``, the model on the meta device) and :func:`census` for the
recipe's argv and the gpt-oss-20b config.json, in a python with PyPI megatron-bridge
(``requirements/bridge-cpu.txt``; ``MILES_AMD_BRIDGE_PYTHON``), the pinned miles and Megatron-LM
of the conformance tier, and stand-ins only for what has no CPU build (the harness's doc).
The readings then go through the preflight's real fact functions.

What differs from a node, by the stand-ins: experts are ``SequentialMLP`` (one linear per
expert: 24 x 32 x 2 = 1536 wrapped), where the node's TE grouped GEMM has one grouped linear
per projection per layer (48); PyPI 0.3.1's window is ``(128, 0)``, the image's Megatron-Bridge
may have ``(127, 0)`` (NVIDIA-NeMo/Megatron-Bridge#2656). Only a node proves its own numbers.

Negative control: ``--target-modules gate_up_proj`` (gpt-oss's own name, which miles passes
through unmapped) builds a model with no expert adapter, and the fact says ``wrong``.
"""

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
from tests.conformance.checkout import IMPORT_STUBS, OPTIONS, _given
from tests.conformance.fake_inputs import GPT_OSS_20B_BF16_CONFIG, make_fake_inputs

pytestmark = [pytest.mark.conformance, pytest.mark.xdist_group("bridge-census")]

HARNESS = Path(__file__).resolve().parent / "bridge_harness.py"
BRIDGE_PYTHON = "MILES_AMD_BRIDGE_PYTHON"
HOW = (
    f"the bridge census needs a python with megatron-bridge: build one as "
    f"requirements/bridge-cpu.txt says and set {BRIDGE_PYTHON}; and the conformance tier's "
    "miles and Megatron-LM checkouts (--miles-src/--megatron-src or .ci/conformance-env)"
)
TIMEOUT_S = 600.0


def _census(config: pytest.Config, root: Path, targets: str | None = None) -> dict[str, Any]:
    python = os.environ.get(BRIDGE_PYTHON)
    given = _given(config)
    sources = [given.get(flag) for flag, *_ in OPTIONS[:2]]
    if not python or not all(sources):
        pytest.skip(HOW)
    model_dir, data_dir = make_fake_inputs(root / "inputs")
    miles, megatron = (str(Path(s).resolve()) for s in sources if s)
    recipe = Recipe(
        model_dir=str(model_dir), data_dir=str(data_dir), miles_dir=miles, megatron_dir=megatron
    )
    argv = recipe.argv()
    if targets is not None:
        argv[argv.index("--target-modules") + 1] = targets
    has_triton = subprocess.run([python, "-c", "import triton"], capture_output=True).returncode
    path = [miles, megatron] + ([str(IMPORT_STUBS)] if has_triton else [])
    result = root / "census.json"
    done = subprocess.run(
        [python, str(HARNESS), "--census", str(CENSUS), "--result", str(result), "--", *argv],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {"argv": argv, **json.loads(result.read_text())}


@pytest.fixture(scope="module")
def recipe_census(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    return _census(request.config, tmp_path_factory.mktemp("recipe"))


@pytest.fixture(scope="module")
def gate_up_census(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    return _census(request.config, tmp_path_factory.mktemp("gate_up"), targets="gate_up_proj")


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
    layers = recipe_census["attention"]["layers"]
    sliding = [t == "sliding_attention" for t in GPT_OSS_20B_BF16_CONFIG["layer_types"]]
    assert [bool(w) for w in layers] == sliding
    assert recipe_census["attention"]["window_attn_skip_freq"] == 2
    window = recipe_census["attention"]["window_size"]
    assert all(w == window for w in layers if w)
    fact = attention_window_fact(recipe_census, GPT_OSS_20B_BF16_CONFIG)
    assert fact.status == "ok"


def test_gate_up_proj_builds_a_model_without_expert_adapters(gate_up_census) -> None:
    lora = gate_up_census["lora"]
    assert (lora["expert"], lora["other"]) == (0, 0)
    assert lora["bare_expert"] == {"linear_fc1": 768, "linear_fc2": 768}
    fact = lora_experts_fact(gate_up_census, ("gate_up_proj",))
    assert fact.status == "wrong" and "no MoE expert linear has a LoRA adapter" in fact.message
