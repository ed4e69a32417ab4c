"""After parsing, from one ``child.py semantics`` run on the default job: what miles' and
SGLang's own code make of the recipe's argv, and every flag the recipe passes either read on
the bridge/LoRA path or in ``recipe.ignored_flags`` with a claim that still holds
(docs/conformance.md, "Flags parsed and ignored")."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest

from miles_amd.recipe.ignored_flags import BRIDGE_BUILDER, BY_FLAG, IGNORED_FLAGS
from miles_amd.recipe.settings import LORA_TARGET_MODULES, Recipe, RecipeError
from tests.conformance.harness import CHILD, Job, MilesCheckout, run_child

pytestmark = [pytest.mark.conformance, pytest.mark.xdist_group("semantics")]

# Source this path does not run, relative to the miles or Megatron-LM checkout.
NOT_THIS_PATH = {
    "miles/utils/arguments.py": "defines and validates the flags (the parser tests cover it)",
    "miles/backends/fsdp_utils/": "--train-backend fsdp only; the recipe trains with megatron",
    "miles/backends/megatron_utils/model_provider.py": (
        "the model builders for full fine-tuning; model.py builds a LoRA actor in bridge mode "
        "with bridge_lora_helpers._setup_lora_model_via_bridge"
    ),
    "miles/backends/megatron_utils/megatron_to_hf/": "--megatron-to-hf-mode raw converters",
    "megatron/training/arguments.py": (
        "Megatron's parser, validate_args and core_transformer_config_from_args, which bridge "
        "mode skips"
    ),
    "megatron/training/yaml_arguments.py": "Megatron's YAML config path, not used by miles",
}
OPTIMIZER_CONFIG = "megatron/core/optimizer/optimizer_config.py"


@pytest.fixture(scope="module")
def semantics(
    checkout: MilesCheckout,
    jobs: dict[str, Job],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """``child.py semantics`` on the default job: what miles' own code makes of its argv."""
    job = jobs["variant:default"]
    result = tmp_path_factory.mktemp("semantics") / "result.json"
    flags = sorted({token for token in job.train_argv if token.startswith("--")} | set(BY_FLAG))
    lora_names = ",".join((*LORA_TARGET_MODULES, "gate_up_proj"))  # gpt-oss's own expert name
    command = [str(checkout.python), str(CHILD), "semantics", str(result), lora_names]
    run_child([*command, ",".join(flags), "--", *job.train_argv], job.env, 600)
    probed: dict[str, Any] = json.loads(result.read_text())
    return probed


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


def test_function_paths_load_and_the_math_reward_scores(semantics: dict[str, Any]) -> None:
    paths = semantics["function_paths"]
    assert {"rollout_function_path", "eval_function_path", "data_source_path"} <= set(paths)
    assert {name: state for name, state in paths.items() if state != "ok"} == {}
    assert semantics["args"]["rm_type"] == "math"
    assert semantics["rewards"] == {"right": 1, "wrong": 0}


def test_lora_targets_are_miles_mapping_to_the_experts(semantics: dict[str, Any]) -> None:
    lora = semantics["lora"]
    assert lora["lora_class"] == "LoRA"  # --lora-type default: standard LoRA
    assert lora["targets"] == ["linear_fc1", "linear_fc2"]
    each = lora["each"]
    assert {name: each[name] for name in LORA_TARGET_MODULES} == {
        name: [layer] for name, layer in LORA_TARGET_MODULES.items()
    }
    assert each["gate_up_proj"] == ["gate_up_proj"]  # passed through: matches no layer
    with pytest.raises(RecipeError, match="target_modules: LoRA target gate_up_proj"):
        Recipe(target_modules=("gate_up_proj",))


def test_sglang_accepts_miles_server_args_with_the_lora_settings(semantics: dict[str, Any]) -> None:
    server, args = semantics["server_args"], semantics["args"]
    assert (server["dropped"], server["accepted"]) == ([], "ok")
    kwargs = server["kwargs"]
    assert kwargs["max_lora_rank"] == args["lora_rank"] == Recipe().lora_rank
    assert kwargs["enable_weights_cpu_backup"] is True and kwargs["enable_lora"] is True
    assert kwargs["lora_target_modules"] == ["gate_proj", "up_proj", "down_proj"]
    backends = ("lora_backend", "moe_runner_backend", "attention_backend")
    assert [kwargs[name] for name in backends] == ["triton"] * 3
    assert kwargs["tp_size"] == Recipe().rollout_num_gpus_per_engine


# ---- flags parsed and ignored ----------------------------------------------------------------


def _reads(dest: str, text: str) -> bool:
    pattern = rf"\bargs\.{dest}\b|getattr\(\s*\w*args\w*\s*,\s*['\"]{dest}['\"]"
    return re.search(pattern, text) is not None


def _definition(path: Path, name: str) -> tuple[Any, str]:
    """The class or function ``name`` defined in ``path``: its node and its source."""
    text = path.read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name:
            return node, ast.get_source_segment(text, node) or ""
    raise AssertionError(f"no {name} in {path}")


def test_every_recipe_flag_is_read_on_this_path_or_stated_ignored(
    checkout: MilesCheckout, semantics: dict[str, Any]
) -> None:
    """Read: an ``--sglang-*`` value reaches the server args, a dest is an ``OptimizerConfig``
    field (model.py fills it from args), or the path's source reads ``args.<dest>``."""
    dests, use = semantics["dests"], semantics["sglang_flag_use"]
    flags = sorted({t for t in Recipe(capture_metrics=True).argv() if t.startswith("--")})
    assert [f for f in flags if f not in dests] == []
    sources = [
        path.read_text(errors="replace")
        for base, root in (
            (checkout.miles, "miles"),
            (checkout.megatron, "megatron/core"),
            (checkout.megatron, "megatron/training"),
        )
        for path in (base / root).rglob("*.py")
        if not path.relative_to(base).as_posix().startswith(tuple(NOT_THIS_PATH))
    ]
    config, _ = _definition(checkout.megatron / OPTIMIZER_CONFIG, "OptimizerConfig")
    optimizer_fields = {
        s.target.id
        for s in config.body
        if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    }
    unexplained = [
        f"{flag} (dest {dests[flag]})"
        for flag in flags
        if flag not in BY_FLAG
        and not (
            use.get(dests[flag]) == "used"
            if dests[flag].startswith("sglang_")
            else dests[flag] in optimizer_fields or any(_reads(dests[flag], t) for t in sources)
        )
    ]
    assert unexplained == [], (
        "flags the recipe passes that nothing on the bridge/LoRA path reads: add each to "
        "miles_amd/recipe/ignored_flags.py with its upstream file and reason, or stop passing it"
    )
    gone = [
        r
        for r in NOT_THIS_PATH
        if not (checkout.miles / r).exists() and not (checkout.megatron / r).exists()
    ]
    assert gone == [], "an exclusion no longer matches the checkout: update NOT_THIS_PATH"


def test_each_table_entry_holds(checkout: MilesCheckout, semantics: dict[str, Any]) -> None:
    """A miles flag, an existing upstream file, one entry per flag; a ``model`` entry is not
    read by the LoRA bridge builder; ``overridden`` is replaced in the server args (and only
    ``--sglang-max-lora-rank`` is); ``inactive`` is read only beside use_dynamic_batch_size."""
    dests, use = semantics["dests"], semantics["sglang_flag_use"]
    assert [e.flag for e in IGNORED_FLAGS if e.flag not in dests] == []
    assert len(BY_FLAG) == len(IGNORED_FLAGS)
    _, builder = _definition(checkout.miles / BRIDGE_BUILDER, "_setup_lora_model_via_bridge")
    assert _reads("tensor_model_parallel_size", builder)  # the reader sees what it copies
    for entry in IGNORED_FLAGS:
        dest = dests[entry.flag]
        assert (checkout.miles / entry.upstream).is_file() or (
            checkout.megatron / entry.upstream
        ).is_file(), entry
        if entry.kind == "model":
            assert not _reads(dest, builder), entry.flag
        elif entry.kind == "overridden":
            assert use[dest] == "overridden", entry.flag
        elif entry.kind == "inactive":
            text = (checkout.miles / entry.upstream).read_text()
            assert _reads(dest, text) and _reads("use_dynamic_batch_size", text), entry.flag
            assert semantics["args"]["use_dynamic_batch_size"] is False
    assert {dest for dest, how in use.items() if how == "overridden"} == {"sglang_max_lora_rank"}
    assert len(use) >= 8  # the recipe's --sglang-* flags were all probed
