"""Every flag the recipe passes is either read on the bridge/LoRA path or stated as ignored.

The table is ``miles_amd.recipe.ignored_flags``. A flag's ``dest`` comes from miles' own
parser (``semantic_probe.py``: argparse's option table; ``--norm-epsilon`` is
``layernorm_epsilon``). A flag is *read on this path* when one of these holds:

- ``--sglang-*``: a unique value set on ``args`` reaches miles' own SGLang server args
  (``_compute_server_args``; the probe's ``sglang_flag_use``);
- its dest is a field of Megatron's ``OptimizerConfig``, which ``miles/backends/megatron_utils/
  model.py`` fills from ``args`` field by field;
- the source of the path reads ``args.<dest>`` (or ``getattr(args, "<dest>"``): miles'
  package and Megatron's ``megatron/core`` and ``megatron/training``, without the parts this
  path does not run (:data:`NOT_THIS_PATH`, each with its reason).

The table's own claims are checked too: each flag is one miles parses, each upstream file
exists in the checkout, a ``model`` entry is not read by the LoRA bridge builder
(``_setup_lora_model_via_bridge``), the ``overridden`` entry is replaced in the server args,
and the ``inactive`` entry's file reads it only next to ``use_dynamic_batch_size``, which the
recipe never sets.
"""

from __future__ import annotations

import ast
import re
from typing import Any

import pytest

from miles_amd.recipe.ignored_flags import BRIDGE_BUILDER, BY_FLAG, IGNORED_FLAGS
from miles_amd.recipe.settings import Recipe
from tests.conformance.checkout import MilesCheckout

# shares the one probe run with test_semantics (xdist --dist loadgroup)
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


def _sources(checkout: MilesCheckout) -> dict[str, str]:
    roots = [
        (checkout.miles, checkout.miles / "miles"),
        (checkout.megatron, checkout.megatron / "megatron" / "core"),
        (checkout.megatron, checkout.megatron / "megatron" / "training"),
    ]
    out = {}
    for base, root in roots:
        for path in root.rglob("*.py"):
            rel = path.relative_to(base).as_posix()
            if not rel.startswith(tuple(NOT_THIS_PATH)):
                out[rel] = path.read_text(errors="replace")
    return out


def _reads(dest: str, text: str) -> bool:
    pattern = rf"\bargs\.{dest}\b|getattr\(\s*\w*args\w*\s*,\s*['\"]{dest}['\"]"
    return re.search(pattern, text) is not None


def _optimizer_config_fields(checkout: MilesCheckout) -> set[str]:
    tree = ast.parse((checkout.megatron / OPTIMIZER_CONFIG).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "OptimizerConfig":
            return {
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
    raise AssertionError(f"no OptimizerConfig in {OPTIMIZER_CONFIG}")


def _bridge_builder_source(checkout: MilesCheckout) -> str:
    text = (checkout.miles / BRIDGE_BUILDER).read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == "_setup_lora_model_via_bridge":
            return ast.get_source_segment(text, node) or ""
    raise AssertionError(f"no _setup_lora_model_via_bridge in {BRIDGE_BUILDER}")


def _recipe_flags() -> list[str]:
    argv = Recipe(capture_metrics=True).argv()
    return sorted({token for token in argv if token.startswith("--")})


def test_every_recipe_flag_is_read_on_this_path_or_stated_ignored(
    checkout: MilesCheckout, semantics: dict[str, Any]
) -> None:
    dests, use = semantics["dests"], semantics["sglang_flag_use"]
    assert [f for f in _recipe_flags() if f not in dests] == []
    sources = _sources(checkout)
    optimizer_fields = _optimizer_config_fields(checkout)
    unexplained = []
    for flag in _recipe_flags():
        dest = dests[flag]
        if flag in BY_FLAG:
            continue
        if dest.startswith("sglang_"):
            read = use.get(dest) == "used"
        else:
            read = dest in optimizer_fields or any(_reads(dest, t) for t in sources.values())
        if not read:
            unexplained.append(f"{flag} (dest {dest})")
    assert unexplained == [], (
        "flags the recipe passes that nothing on the bridge/LoRA path reads: add each to "
        "miles_amd/recipe/ignored_flags.py with its upstream file and reason, or stop passing it"
    )


def test_the_table_names_miles_flags_and_existing_upstream_files(
    checkout: MilesCheckout, semantics: dict[str, Any]
) -> None:
    assert [e.flag for e in IGNORED_FLAGS if e.flag not in semantics["dests"]] == []
    missing = [
        e.upstream
        for e in IGNORED_FLAGS
        if not (checkout.miles / e.upstream).is_file()
        and not (checkout.megatron / e.upstream).is_file()
    ]
    assert missing == []
    assert len(BY_FLAG) == len(IGNORED_FLAGS)  # one entry per flag


def test_model_entries_never_reach_the_lora_bridge_builder(
    checkout: MilesCheckout, semantics: dict[str, Any]
) -> None:
    builder = _bridge_builder_source(checkout)
    assert _reads("tensor_model_parallel_size", builder)  # the reader sees what it copies
    model = [e for e in IGNORED_FLAGS if e.kind == "model"]
    read = [e.flag for e in model if _reads(semantics["dests"][e.flag], builder)]
    assert read == []


def test_the_overridden_and_inactive_entries_hold(
    checkout: MilesCheckout, semantics: dict[str, Any]
) -> None:
    dests = semantics["dests"]
    for entry in IGNORED_FLAGS:
        dest = dests[entry.flag]
        if entry.kind == "overridden":
            assert semantics["sglang_flag_use"][dest] == "overridden", entry.flag
        elif entry.kind == "inactive":
            text = (checkout.miles / entry.upstream).read_text()
            assert _reads(dest, text) and _reads("use_dynamic_batch_size", text), entry.flag
            assert semantics["args"]["use_dynamic_batch_size"] is False


def test_not_this_path_names_existing_source(checkout: MilesCheckout) -> None:
    gone = [
        rel
        for rel in NOT_THIS_PATH
        if not (checkout.miles / rel).exists() and not (checkout.megatron / rel).exists()
    ]
    assert gone == [], "an exclusion no longer matches the checkout: update NOT_THIS_PATH"


def test_only_the_max_lora_rank_of_the_sglang_flags_is_overridden(
    semantics: dict[str, Any],
) -> None:
    use = semantics["sglang_flag_use"]
    assert {dest for dest, how in use.items() if how == "overridden"} == {"sglang_max_lora_rank"}
    assert len(use) >= 8  # the recipe's --sglang-* flags were all probed
