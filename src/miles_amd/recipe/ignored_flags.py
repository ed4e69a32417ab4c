"""Flags the recipe passes that miles parses and then ignores on this path (bridge + LoRA).

A table for a reader of the argv and for the conformance tier; the argv itself comes from
``recipe.settings``.

Decides:

- which of the recipe's flags change nothing in the run (:data:`IGNORED_FLAGS`, by flag in
  :data:`BY_FLAG`);
- each one's kind: ``model`` (the bridge builds the model from ``config.json``),
  ``overridden`` (another value replaces it) or ``inactive`` (read only under a switch the
  recipe leaves off);
- each one's upstream file in the pinned miles or Megatron-LM tree, and the reason.

Caveat: the recipe still passes these flags, and several are cross-checked against
``config.json`` at parse time. ``tests/conformance/test_ignored_flags.py`` fails when a flag
the recipe passes is neither read on the bridge path nor listed, or an entry no longer holds.
``docs/conformance.md`` ("Why those flags change nothing (``recipe/ignored_flags.py``)").
"""

from __future__ import annotations

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


def _model(flag: str, reason: str = _FROM_CONFIG) -> IgnoredFlag:
    return IgnoredFlag(flag, "model", BRIDGE_BUILDER, reason)


IGNORED_FLAGS: tuple[IgnoredFlag, ...] = (
    _model("--num-layers", _CROSS_CHECKED),
    _model("--hidden-size", _CROSS_CHECKED),
    _model("--ffn-hidden-size", _CROSS_CHECKED),
    _model("--num-attention-heads", _CROSS_CHECKED),
    _model("--group-query-attention"),
    _model("--num-query-groups"),
    _model("--kv-channels"),
    _model("--use-rotary-position-embeddings"),
    _model("--rotary-percent"),
    _model("--rotary-base", _CROSS_CHECKED),
    _model(
        "--max-position-embeddings",
        f"{_FROM_CONFIG}; miles also overrides it with the sequence length",
    ),
    _model("--normalization"),
    _model("--norm-epsilon", _CROSS_CHECKED),
    _model("--swiglu"),
    _model("--untie-embeddings-and-output-weights", _CROSS_CHECKED),
    _model("--vocab-size"),
    _model("--softmax-type"),
    _model("--window-size"),
    _model("--window-attn-skip-freq"),
    _model("--no-masked-softmax-fusion"),
    _model("--no-rope-fusion"),
    _model("--num-experts"),
    _model("--moe-router-topk"),
    _model(
        "--moe-aux-loss-coeff",
        f"{_FROM_CONFIG} (only the non-LoRA bridge path, model_provider.py, copies it)",
    ),
    _model(
        "--moe-token-dispatcher-type",
        "the LoRA bridge builder sets moe_token_dispatcher_type = 'alltoall' itself",
    ),
    _model(
        "--moe-router-dtype",
        "miles #3263: the LoRA bridge builder does not copy it; the router GEMM runs in "
        "bf16 (config fidelity only, not fatal)",
    ),
    _model("--moe-grouped-gemm", f"{_FROM_CONFIG} (the provider sets grouped GEMM itself)"),
    _model("--attention-dropout"),
    _model("--hidden-dropout"),
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
