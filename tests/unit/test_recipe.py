"""The recipe's settings and invariants; its argv itself is RECIPE.md's (below, held by
``test_cli_plan``) and the dry-run snapshots' (default, W&B, extra-args, override)."""

from __future__ import annotations

import shlex
from dataclasses import fields

import pytest

from miles_amd.recipe.settings import (
    NOT_IDENTITY,
    SETTINGS,
    Hardware,
    Recipe,
    RecipeError,
    parse_hardware,
    secret_flags_in,
)

# Transcribed from RECIPE.md ("Model arguments" and "Train arguments of the default recipe"); the
# dry-run holds the argv to it (tests/unit/test_cli_plan.py), the snapshots to every case.
RECIPE_MD_MODEL_ARGS = """
--num-layers 24 --hidden-size 2880 --ffn-hidden-size 2880 --num-attention-heads 64
--group-query-attention --num-query-groups 8 --kv-channels 64
--use-rotary-position-embeddings --rotary-percent 1.0 --rotary-base 150000
--max-position-embeddings 131072 --normalization RMSNorm --norm-epsilon 1e-5 --swiglu
--untie-embeddings-and-output-weights --vocab-size 201088 --softmax-type learnable
--window-size 128,0 --window-attn-skip-freq 2 --no-masked-softmax-fusion --no-rope-fusion
--num-experts 32 --moe-router-topk 4 --moe-aux-loss-coeff 0.0
--moe-token-dispatcher-type alltoall --moe-router-dtype fp32 --moe-grouped-gemm
"""
RECIPE_MD_TRAIN_ARGS = """
--hf-checkpoint /root/models/gpt-oss-20b-bf16 --megatron-to-hf-mode bridge
--lora-rank 32 --lora-alpha 32 --lora-dropout 0.0
--target-modules gate_proj,up_proj,down_proj --no-sglang-lora-use-virtual-experts
--lora-base-cpu-backup
--prompt-data /root/datasets/dapo-math-17k/dapo-math-17k.jsonl --input-key prompt
--label-key label --apply-chat-template --rollout-shuffle --balance-data --rm-type math
--num-rollout 20 --rollout-batch-size 8 --n-samples-per-prompt 8
--rollout-max-response-len 4096 --rollout-temperature 1 --global-batch-size 64
--optimizer adam --lr 1e-05 --lr-decay-style constant --weight-decay 0.1
--adam-beta1 0.9 --adam-beta2 0.98
--advantage-estimator grpo --entropy-coef 0.00 --eps-clip 0.2 --eps-clip-high 0.28
--tensor-model-parallel-size 4 --sequence-parallel
--pipeline-model-parallel-size 1 --context-parallel-size 1
--expert-model-parallel-size 1 --expert-tensor-parallel-size 1
--recompute-granularity full --recompute-method uniform --recompute-num-layers 1
--micro-batch-size 1 --max-tokens-per-gpu 4096
--rollout-num-gpus-per-engine 4 --sglang-mem-fraction-static 0.2
--sglang-dtype bfloat16 --sglang-decode-log-interval 1000 --sglang-max-lora-rank 32
--sglang-lora-backend triton --sglang-moe-runner-backend triton
--sglang-attention-backend triton
--train-backend megatron --attention-dropout 0.0 --hidden-dropout 0.0
--qkv-format bshd --attention-backend unfused --actor-num-nodes 1
--actor-num-gpus-per-node 8 --num-gpus-per-node 8 --colocate
"""


@pytest.mark.parametrize(
    ("kwargs", "tail"),
    [
        ({"extra_args": "--note 'two words'"}, ["--note", "two words"]),
        # --override-pinned drops the pinned flag and its value, the extra arg goes last;
        # a newer miles may map gate_up_proj: overridden, the node's preflight decides
        *(
            ({"extra_args": extra, "override_pinned": True}, shlex.split(extra))
            for extra in (
                "--lr=3e-6 --colocate",
                "--target-modules gate_up_proj",
                "--target-modules=gate_proj,up_proj",
            )
        ),
        ({"target_modules": ("linear_fc1", "linear_fc2")}, ["--colocate"]),
        ({"use_dynamic_batch_size": True, "qkv_format": "thd"}, ["--colocate"]),
    ],
)
def test_extra_args_are_shell_split_and_last(kwargs: dict, tail: list[str]) -> None:
    argv = Recipe(**kwargs).train_argv()
    assert argv[-len(tail) :] == tail
    if "--lr=3e-6" in kwargs.get("extra_args", ""):
        assert "1e-05" not in argv and argv.count("--colocate") == 1
    if kwargs.get("use_dynamic_batch_size"):
        assert "--use-dynamic-batch-size" in argv


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"global_batch_size": 32}, "batch shape"),
        ({"num_gpus": 6}, "--num-gpus 6: not divisible by tensor_model_parallel_size"),
        ({"num_gpus": 4, "rollout_num_gpus_per_engine": 8}, "rollout_num_gpus_per_engine"),
        ({"num_gpus": 16}, "one MI355X node has 8 GPUs"),
        ({"lora_rank": 16}, "lora_rank 16 != sglang_max_lora_rank 32"),
        ({"target_modules": ("gate_up_proj",)}, "target_modules: LoRA target gate_up_proj"),
        ({"target_modules": ("down_proj", "experts")}, "LoRA target experts is not a name"),
        (
            {"extra_args": "--target-modules gate_up_proj,down_proj"},
            "--extra-args --target-modules: LoRA target gate_up_proj is not a name miles "
            "31f1ca961 (the pinned miles) maps",
        ),
        ({"extra_args": "--target-modules=gate_up_proj"}, "let the node's preflight"),
        ({"use_dynamic_batch_size": True}, "use_dynamic_batch_size with qkv_format bshd"),
        ({"hardware": "H100"}, "--hardware H100"),
        ({"extra_args": "--lr 2e-5"}, "--extra-args repeats flags the recipe pins: --lr"),
        ({"extra_args": "--num-rollout=3"}, "--num-rollout"),
        ({"extra_args": "--note 'unterminated"}, "--extra-args"),
        ({"num_rollout": 0}, "--num-rollouts must be >= 1"),
        ({"rollout_batch_size": 0}, "rollout_batch_size must be >= 1"),  # no flag sets it
        ({"sglang_mem_fraction_static": 1.5}, "sglang_mem_fraction_static"),
        # the recipe's own targets are the pinned miles' even with --override-pinned
        ({"target_modules": ("gate_up_proj",), "override_pinned": True}, "miles 31f1ca961"),
    ],
)
def test_invariant_errors_name_what_broke(kwargs: dict, needle: str) -> None:
    with pytest.raises(RecipeError) as err:
        Recipe(**kwargs)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_hardware_parsing() -> None:
    assert parse_hardware("mi350x") is Hardware.MI350X
    assert Recipe(hardware="MI350X").hardware is Hardware.MI350X  # type: ignore[arg-type]
    with pytest.raises(RecipeError, match="unknown hardware"):
        parse_hardware("MI300X")


SECRET = "hf_0123456789abcdefSECRET"


@pytest.mark.parametrize(  # argparse's spellings: tests/unit/test_untrusted_input.py
    "extra", [f"--my-service-token {SECRET}", f"--db-password {SECRET}", f"--note '{SECRET}"]
)
def test_extra_args_with_a_credential_are_refused_without_the_value(extra: str) -> None:
    with pytest.raises(RecipeError) as err:
        Recipe(extra_args=extra)
    assert "--extra-args" in str(err.value) and SECRET not in str(err.value)


def test_secret_flags_are_told_from_keys_and_vocabulary_tokens() -> None:
    argv = [
        "--input-key", "prompt", "--label-key", "label", "--max-tokens-per-gpu", "1",
        "--fim-pad-token", "x", "--rollout-stop-token-ids", "1", "--wandb-key=v",
        "--HF-TOKEN", "v", "--x-api-key", "v",
    ]  # fmt: skip
    assert secret_flags_in(argv) == ["--HF-TOKEN", "--wandb-key", "--x-api-key"]


def test_each_field_declares_its_setting_whose_flags_carry_its_value() -> None:
    """A new field says its flags and identity on purpose, not by a default; each flag belongs
    to one field and reaches the argv."""
    assert list(SETTINGS) == [f.name for f in fields(Recipe) if f.init]
    assert all("setting" in f.metadata for f in fields(Recipe) if f.init)
    switched_on = (
        Recipe(),
        Recipe(use_wandb=True, capture_metrics=True, sglang_lora_use_virtual_experts=True),
        Recipe(use_dynamic_batch_size=True, qkv_format="thd"),
    )
    in_argv = {token for r in switched_on for token in r.train_argv() if token.startswith("--")}
    declared = [flag for s in SETTINGS.values() for flag in s.argv]
    assert len(declared) == len(set(declared)) and set(declared) <= in_argv
    argv = Recipe(lr=3e-6, num_gpus=4, data_dir="/d", target_modules=("up_proj",)).train_argv()
    values = {flag: argv[argv.index(flag) + 1] for flag in declared if flag in argv}
    assert values["--lr"] == "3e-06" and values["--target-modules"] == "up_proj"
    assert values["--actor-num-gpus-per-node"] == values["--num-gpus-per-node"] == "4"
    assert values["--prompt-data"] == "/d/dapo-math-17k/dapo-math-17k.jsonl"


def test_the_identity_leaves_out_locations_and_tracking() -> None:
    """Changing this set changes every new run's ``recipe_digest``: stored history runs would
    no longer match new ones, so it is spelled out here to make that a reviewed change."""
    recorded_elsewhere = {
        "model_dir", "data_dir", "miles_dir", "megatron_dir",
        "use_wandb", "wandb_project", "wandb_group", "capture_metrics",
    }  # fmt: skip
    assert recorded_elsewhere == NOT_IDENTITY
