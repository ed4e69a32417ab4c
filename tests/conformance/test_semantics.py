"""After parsing: what miles' own code makes of the recipe's argv (``semantic_probe.py``).

One probe run on the default job gives what miles and SGLang compute from it; the tests
compare that with what the recipe means: world size, DP size, rollout engines and one
optimizer step per rollout; every function path loads; the math reward scores a right and a
wrong answer; the LoRA targets map to the experts' ``linear_fc1``/``linear_fc2`` (each name
``recipe.lora_targets`` accepts as its table says, ``gate_up_proj`` unmapped); the SGLang
server args keep every key and SGLang 0.5.16's ``ServerArgs`` accepts them
(docs/conformance.md).
"""

from __future__ import annotations

from typing import Any

import pytest

from miles_amd.recipe.lora_targets import LORA_TARGET_MODULES
from miles_amd.recipe.settings import Recipe, RecipeError

# one probe run for this module and test_ignored_flags (xdist --dist loadgroup)
pytestmark = [pytest.mark.conformance, pytest.mark.xdist_group("semantics")]


def test_the_derived_arithmetic_is_the_recipes(semantics: dict[str, Any]) -> None:
    derived, args, recipe = semantics["derived"], semantics["args"], Recipe()
    assert derived["world_size"] == recipe.num_gpus
    assert derived["data_parallel_size"] == recipe.num_gpus // recipe.tensor_model_parallel_size
    assert derived["rollout_num_gpus"] == recipe.num_gpus  # colocated: the same GPUs
    assert derived["rollout_engines"] == recipe.num_gpus // recipe.rollout_num_gpus_per_engine
    assert (
        args["global_batch_size"] % (derived["data_parallel_size"] * args["micro_batch_size"]) == 0
    )
    assert derived["optimizer_steps_per_rollout"] == 1


def test_every_function_path_loads_with_miles_loader(semantics: dict[str, Any]) -> None:
    paths = semantics["function_paths"]
    assert {"rollout_function_path", "eval_function_path", "data_source_path"} <= set(paths)
    assert {name: state for name, state in paths.items() if state != "ok"} == {}


def test_the_math_reward_scores_right_and_wrong(semantics: dict[str, Any]) -> None:
    assert semantics["args"]["rm_type"] == "math"
    assert semantics["rewards"] == {"right": 1, "wrong": 0}


def test_lora_targets_reach_the_experts_linear_layers(semantics: dict[str, Any]) -> None:
    lora = semantics["lora"]
    assert lora["lora_class"] == "LoRA"  # --lora-type default: standard LoRA
    assert lora["targets"] == ["linear_fc1", "linear_fc2"]


def test_the_recipes_target_table_is_miles_mapping(semantics: dict[str, Any]) -> None:
    each = semantics["lora"]["each"]
    assert {name: each[name] for name in LORA_TARGET_MODULES} == {
        name: [layer] for name, layer in LORA_TARGET_MODULES.items()
    }
    assert each["gate_up_proj"] == ["gate_up_proj"]  # passed through: matches no layer
    with pytest.raises(RecipeError, match="target_modules: LoRA target gate_up_proj"):
        Recipe(target_modules=("gate_up_proj",))


def test_miles_server_args_keep_every_key_and_the_lora_settings(semantics: dict[str, Any]) -> None:
    server, args = semantics["server_args"], semantics["args"]
    assert server["dropped"] == []
    kwargs = server["kwargs"]
    assert kwargs["max_lora_rank"] == args["lora_rank"] == Recipe().lora_rank
    assert kwargs["enable_weights_cpu_backup"] is True
    assert kwargs["enable_lora"] is True
    assert kwargs["lora_target_modules"] == ["gate_proj", "up_proj", "down_proj"]
    assert (kwargs["lora_backend"], kwargs["moe_runner_backend"], kwargs["attention_backend"]) == (
        "triton",
        "triton",
        "triton",
    )
    assert kwargs["tp_size"] == Recipe().rollout_num_gpus_per_engine


def test_sglang_server_args_accept_miles_result(semantics: dict[str, Any]) -> None:
    assert semantics["server_args"]["accepted"] == "ok"
