"""Values more than one test module needs, spelled once (constants only; a value one module
uses stays in that module)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "runs" / "jvvnhop9"  # the embedded run, as the driver left it
BASELINES = REPO / "baselines"
SHIPPED = BASELINES / "gpt_oss_20b_lora" / "8gpu" / "mi355x"  # stock.json, patched.json
SHIPPED_UNDER = SHIPPED.relative_to(BASELINES)  # where stock/patched lie in a baselines/ tree

LOGPROB = "train/train_rollout_logprob_abs_diff"
REWARD = "rollout/raw_reward"
CLIPFRAC = "train/pg_clipfrac"
KL = "train/train_rollout_kl"

# The seed pull request's numbers for jvvnhop9, typed in independently of the baseline files.
PUBLISHED_LOGPROB = [
    0.0208, 0.0185, 0.0164, 0.0172, 0.0153, 0.0166, 0.0160, 0.0180, 0.0186, 0.0153,
    0.0187, 0.0151, 0.0156, 0.0161, 0.0150, 0.0158, 0.0162, 0.0204, 0.0161, 0.0178,
]  # fmt: skip
PUBLISHED_REWARD = [
    0.5000, 0.5625, 0.7500, 0.5625, 0.6094, 0.6250, 0.5469, 0.3906, 0.4062, 0.4688,
    0.6719, 0.6094, 0.6094, 0.4688, 0.5781, 0.5156, 0.5938, 0.4688, 0.5156, 0.7656,
]  # fmt: skip

# A fatal GPU fault and a known-harmless warning, as a Ray actor prints them into job.log.
FATAL_LINE = (
    "(MegatronTrainRayActor pid=4243) Memory access fault by GPU node-9 (Agent handle: "
    "0x55d1c7a0) on address 0x7f1c00000000. Reason: Unknown.\n"
)
KNOWN_LINE = (
    "(MegatronTrainRayActor pid=4244) /root/Megatron-LM/megatron/core/transformer/"
    "transformer_config.py:1010: UserWarning: Using a large number of experts (e.g. >=32) "
    "without fp32 routing. Consider enabling moe_router_dtype for better numerical stability.\n"
)
