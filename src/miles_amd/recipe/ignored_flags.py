"""Flags the recipe passes that miles parses and then ignores on the bridge + LoRA path, each
with its kind (``model``: the bridge builds the model from ``config.json``; ``overridden``;
``inactive``), its upstream file and why. The conformance tier holds the table to upstream.
``docs/conformance.md`` ("Why those flags change nothing").
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Literal

BRIDGE_BUILDER = "miles/backends/megatron_utils/bridge_lora_helpers.py"
SGLANG_ENGINE = "miles/backends/sglang_utils/sglang_engine.py"
TRAINING_DATA = "miles/backends/training_utils/data.py"

# model: not read by the LoRA bridge builder (the conformance tier checks that it is not);
# overridden: read, but another value replaces it; inactive: read only under a switch the
# recipe leaves off.
Kind = Literal["model", "overridden", "inactive"]


@dataclass(frozen=True)
class IgnoredFlag:
    flag: str
    kind: Kind
    upstream: str  # path in the pinned miles or Megatron-LM tree
    reason: str


_FROM_CONFIG = "the bridge builds the model from config.json; this flag never reaches it"
_CROSS_CHECKED = f"{_FROM_CONFIG} (hf_validate_args compares it with config.json at parse time)"


_MODEL_FLAGS = """--num-layers --hidden-size --ffn-hidden-size --num-attention-heads
    --group-query-attention --num-query-groups --kv-channels --use-rotary-position-embeddings
    --rotary-percent --rotary-base --max-position-embeddings --normalization --norm-epsilon
    --swiglu --untie-embeddings-and-output-weights --vocab-size --softmax-type --window-size
    --window-attn-skip-freq --no-masked-softmax-fusion --no-rope-fusion --num-experts
    --moe-router-topk --moe-aux-loss-coeff --moe-token-dispatcher-type --moe-router-dtype
    --moe-grouped-gemm --attention-dropout --hidden-dropout"""
_CROSS_CHECKED_FLAGS = """--num-layers --hidden-size --ffn-hidden-size --num-attention-heads
    --rotary-base --norm-epsilon --untie-embeddings-and-output-weights"""
_MODEL_REASONS = {
    **dict.fromkeys(shlex.split(_CROSS_CHECKED_FLAGS), _CROSS_CHECKED),
    "--max-position-embeddings": f"{_FROM_CONFIG}; miles also overrides it with the sequence "
    "length",
    "--moe-aux-loss-coeff": f"{_FROM_CONFIG} (only the non-LoRA bridge path, model_provider.py, "
    "copies it)",
    "--moe-token-dispatcher-type": "the LoRA bridge builder sets moe_token_dispatcher_type = "
    "'alltoall' itself",
    "--moe-router-dtype": "miles #3263: the LoRA bridge builder does not copy it; the router GEMM "
    "runs in bf16 (config fidelity only, not fatal)",
    "--moe-grouped-gemm": f"{_FROM_CONFIG} (the provider sets grouped GEMM itself)",
}

IGNORED_FLAGS: tuple[IgnoredFlag, ...] = (
    *(
        IgnoredFlag(flag, "model", BRIDGE_BUILDER, _MODEL_REASONS.get(flag, _FROM_CONFIG))
        for flag in shlex.split(_MODEL_FLAGS)
    ),
    IgnoredFlag(
        "--sglang-max-lora-rank",
        "overridden",
        SGLANG_ENGINE,
        "_compute_server_args sets max_lora_rank from --lora-rank; --sglang-* values only "
        "fill server-arg keys not already set",
    ),
    IgnoredFlag(
        "--max-tokens-per-gpu",
        "inactive",
        TRAINING_DATA,
        "read only with --use-dynamic-batch-size, which the recipe never sets "
        "(--qkv-format bshd forbids it)",
    ),
)

BY_FLAG: dict[str, IgnoredFlag] = {entry.flag: entry for entry in IGNORED_FLAGS}
