"""Census readings of ``node/bridge_census.py`` that more than one test module needs.

:data:`CPU_MEASURED`: the CPU harness's reading (PyPI megatron-bridge 0.3.1: experts as
``SequentialMLP``, window ``(128, 0)``). :data:`NODE_EXPECTED`: the shape a node should give,
read in radixark/Megatron-Bridge's gpt-oss provider (grouped GEMM, window ``sliding_window - 1``);
``docs/node.md`` ("The trainer's model").
"""

from __future__ import annotations

from typing import Any

from miles_amd.recipe.settings import Recipe
from miles_amd.records.env import Fact
from miles_amd.run.probes_miles import attention_window_fact, lora_experts_fact, router_dtype_fact
from tests.conformance.fake_inputs import GPT_OSS_20B_BF16_CONFIG

LAYERS = 24


def reading(
    *,
    expert: int,
    grouped: int,
    window: list[int] | None,
    router: str = "None",
    bare: dict[str, int] | None = None,
    other: int = 0,
    bridge: str = "megatron.bridge 0.3.1 at /venv/site-packages/megatron/bridge",
) -> dict[str, Any]:
    return {
        "ok": True,
        "lora": {
            "expert": expert,
            "expert_grouped": grouped,
            "expert_per_expert": expert - grouped,
            "expert_layers": LAYERS if expert else 0,
            "expert_adapters": {"ParallelLinearAdapter": expert} if expert else {},
            "other": other,
            "bare_expert": bare or {},
            "examples": [],
        },
        "router": {"moe_router_dtype": {router: LAYERS}, "params_dtype": "bf16"},
        "attention": {
            "window_size": window,
            "window_attn_skip_freq": 2,
            "layers": [window if i % 2 == 0 else None for i in range(LAYERS)],
        },
        "moe_grouped_gemm": grouped > 0,
        "num_moe_experts": 32,
        "bridge": bridge,
    }


CPU_MEASURED = reading(expert=LAYERS * 32 * 2, grouped=0, window=[128, 0])
NODE_EXPECTED = reading(
    expert=LAYERS * 2,
    grouped=LAYERS * 2,
    window=[127, 0],
    bridge="megatron.bridge 0.3.0 at /usr/local/lib/python3.12/dist-packages/megatron/bridge",
)
# the recipe's targets replaced by gpt-oss's own gate_up_proj: miles passes it through unmapped
NO_ADAPTER = reading(
    expert=0, grouped=0, window=[127, 0], bare={"linear_fc1": 24, "linear_fc2": 24}
)
UNKNOWN = {
    "ok": False,
    "stage": "build",
    "error": "ModuleNotFoundError: No module named 'megatron'",
}


def node_model_facts() -> list[Fact]:
    """The deep probe's three env.json facts of a node, by the preflight's fact functions."""
    recipe = Recipe()
    return [
        lora_experts_fact(NODE_EXPECTED, recipe.target_modules),
        router_dtype_fact(NODE_EXPECTED, recipe.argv()),
        attention_window_fact(NODE_EXPECTED, GPT_OSS_20B_BF16_CONFIG),
    ]
