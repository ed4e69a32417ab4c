"""Flags the recipe passes that miles parses and then ignores on this path (bridge + LoRA).

This module states, for a reader of the argv and for the conformance tier, which of the
recipe's flags change nothing in the run: the model is built from the checkpoint's
``config.json`` by Megatron-Bridge, SGLang's LoRA rank comes from ``--lora-rank``, and
token-budget batching is off. Each entry names the upstream file (in the pinned miles or
Megatron-LM tree, ``tests/conformance/upstream/``) where that can be read, and the reason.
The recipe still passes these flags: they keep the argv the same as miles' own gpt-oss
launcher and several are cross-checked against ``config.json`` at parse time.

It decides nothing about the argv (``recipe.settings``). The conformance tier
(``tests/conformance/test_ignored_flags.py``) reads the pinned sources and fails when a flag
the recipe passes is neither read on the bridge path nor listed here, or when an entry of
kind ``model`` is read by the LoRA bridge builder after all.

Read in the pinned sources (miles 31f1ca961, 2026-12-01):

- A LoRA actor in bridge mode is built by ``_setup_lora_model_via_bridge``
  (``miles/backends/megatron_utils/bridge_lora_helpers.py``, chosen in ``model.py``):
  ``AutoBridge.from_hf_pretrained(...).to_megatron_provider()`` takes the architecture from
  ``config.json``; the builder copies only parallelism, recompute and attention-backend
  flags onto the provider and sets the token dispatcher to ``alltoall`` itself.
- ``hf_validate_args`` (``miles/utils/arguments.py``) compares hidden size, heads, layers,
  FFN size, embedding tying, norm epsilon and rotary base with ``config.json`` and refuses a
  mismatch: those flags must be right although the model does not read them.
- ``--moe-router-use-torch-mm`` (named in miles #3263 with ``--moe-router-dtype``) is not a
  flag of the pinned miles or Megatron-LM at all; the recipe does not pass it, so it is not
  listed.

Explained for people in ``docs/conformance.md``.
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
