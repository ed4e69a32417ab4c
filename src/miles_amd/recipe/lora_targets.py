"""Which LoRA target names reach a layer of gpt-oss in the pinned miles (31f1ca961,
``lora_utils.convert_target_modules_to_megatron``: any other name passes unmapped and trains no
adapter), and the refusal of the others. ``docs/cli.md`` ("The recipe's invariants and
settings").
"""

from __future__ import annotations

from collections.abc import Sequence

PINNED_MILES = "31f1ca961"  # the miles the table and the refusal hold for (module doc)

# name -> the Megatron layer of gpt-oss miles maps it to (standard LoRA)
LORA_TARGET_MODULES: dict[str, str] = {
    "q_proj": "linear_qkv",
    "k_proj": "linear_qkv",
    "v_proj": "linear_qkv",
    "o_proj": "linear_proj",
    "gate_proj": "linear_fc1",
    "up_proj": "linear_fc1",
    "down_proj": "linear_fc2",
    "linear_qkv": "linear_qkv",
    "linear_proj": "linear_proj",
    "linear_fc1": "linear_fc1",
    "linear_fc2": "linear_fc2",
}


def unmapped_targets_message(source: str, names: Sequence[str]) -> str | None:
    """The one-line refusal for the names miles would not map, or None when all map."""
    unknown = [name for name in names if name not in LORA_TARGET_MODULES]
    if not unknown:
        return None
    return (
        f"{source}: LoRA target {', '.join(unknown)} is not a name miles {PINNED_MILES} (the "
        "pinned miles) maps to a Megatron layer, so there it would match nothing and train no "
        f"adapter; use names from {', '.join(LORA_TARGET_MODULES)} (gpt-oss's gate_up_proj is "
        "gate_proj,up_proj); with a newer miles that maps it, pass it in --extra-args with "
        "--override-pinned and let the node's preflight (fact lora_experts) decide"
    )


def extra_target_modules(extra: Sequence[str]) -> list[str]:
    """The names of ``--target-modules`` in extra args (``X`` or ``=X`` form), else []."""
    names: list[str] = []
    for i, token in enumerate(extra):
        if token.startswith("--target-modules="):
            names += token.split("=", 1)[1].split(",")
        elif token == "--target-modules" and i + 1 < len(extra):
            names += extra[i + 1].split(",")
    return [name.strip() for name in names]
