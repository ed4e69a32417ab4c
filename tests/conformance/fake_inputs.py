"""Smallest on-disk inputs that let miles' real ``parse_args()`` run for the gpt-oss-20b recipe.

miles' parser is not purely syntactic: it opens the checkpoint's ``config.json`` and
compares it with the Megatron model flags, so a parse on a machine without the real
checkpoint needs a stand-in with the real checkpoint's dimensions. Nothing else under
the model or data directory is opened while parsing (measured: see the notes on each
file below); weights, tokenizer and dataset rows are first read by the Ray actors,
which a parse never starts.

Layout (the same relative paths the recipe uses, so ``miles-amd train --model-dir M
--data-dir D`` points at these files unchanged)::

    <root>/models/gpt-oss-20b-bf16/config.json
    <root>/datasets/dapo-math-17k/dapo-math-17k.jsonl

The start-up smoke goes further than a parse: miles' rollout manager loads the dataset with
the checkpoint's tokenizer (``miles/rollout/data_source.py``: ``AutoTokenizer`` on
``--hf-checkpoint``, then ``apply_chat_template``). :data:`STAND_IN_TOKENIZER_SCRIPT` writes a
stand-in there: a word-level fast tokenizer over the dataset row's words with a chat template,
made with ``transformers`` by the conformance python (the test's own python need not have it).
Without a tokenizer, ``train()`` stops at the data source: a stop for the fake checkpoint, not
for the argv.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MODEL_SUBDIR = "gpt-oss-20b-bf16"
DATASET_SUBPATH = Path("dapo-math-17k") / "dapo-math-17k.jsonl"

NUM_LAYERS = 24

# config.json of lmsys/gpt-oss-20b-bf16: the BF16 export of openai/gpt-oss-20b, i.e. the
# same architecture without a ``quantization_config`` (a checkpoint is MXFP4 iff that key
# says ``quant_method: mxfp4``; the recipe refuses MXFP4).
#
# Who reads it during parse_args():
#   miles/utils/arguments.py  parse_args() -> load_hf_config(--hf-checkpoint)
#     (miles/utils/hf_config.py, transformers.AutoConfig.from_pretrained) -> hf_validate_args(),
#     which fails unless these match the Megatron flags of the recipe:
#       hidden_size == --hidden-size, num_attention_heads == --num-attention-heads,
#       num_hidden_layers == --num-layers, intermediate_size == --ffn-hidden-size,
#       (not tie_word_embeddings) == --untie-embeddings-and-output-weights,
#       rms_norm_eps == --norm-epsilon, rope_theta == --rotary-base.
#     It also reads ``compress_ratios`` (absent: None) and checks ``is_dsa`` (false here).
#   ``model_type: gpt_oss`` selects transformers' GptOssConfig; its strict dataclass
#   validation rejects wrong types, so keep the real value types.
# The remaining keys (experts, head_dim, kv heads, vocab, sliding window, rope scaling) are
# not compared by the parser but are kept real so the file also fits later readers
# (SGLang, megatron.bridge) and tests that check the recipe against the checkpoint.
GPT_OSS_20B_BF16_CONFIG: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "torch_dtype": "bfloat16",
    "attention_bias": True,
    "attention_dropout": 0.0,
    "eos_token_id": 200002,
    "pad_token_id": 199999,
    "experts_per_token": 4,
    "num_experts_per_tok": 4,
    "num_local_experts": 32,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "initial_context_length": 4096,
    "initializer_range": 0.02,
    "layer_types": [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(NUM_LAYERS)
    ],
    "max_position_embeddings": 131072,
    "num_attention_heads": 64,
    "num_hidden_layers": NUM_LAYERS,
    "num_key_value_heads": 8,
    "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "rope_theta": 150000,
    "router_aux_loss_coef": 0.9,
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": 201088,
}

# One row in the dapo-math-17k shape (``--input-key prompt --label-key label``; the real rows
# carry the prompt as a chat message list, which ``--apply-chat-template`` renders).
# The parser itself never opens --prompt-data (measured: parse_args() succeeds with the file
# absent); it is created so the paths in the parsed namespace point at something real and
# later tiers (dataset loading) can reuse the same tree.
DATASET_ROW: dict[str, Any] = {
    "prompt": [{"role": "user", "content": "What is 1 + 1? Put the final answer in \\boxed{}."}],
    "label": "2",
}


def make_fake_inputs(root: Path) -> tuple[Path, Path]:
    """Create the fake checkpoint and dataset under ``root``.

    Returns ``(model_dir, data_dir)``: the values for ``miles-amd train --model-dir`` and
    ``--data-dir``. Idempotent; existing files are overwritten.
    """
    model_dir = root / "models"
    data_dir = root / "datasets"

    checkpoint = model_dir / MODEL_SUBDIR
    checkpoint.mkdir(parents=True, exist_ok=True)
    (checkpoint / "config.json").write_text(json.dumps(GPT_OSS_20B_BF16_CONFIG, indent=2) + "\n")

    dataset = data_dir / DATASET_SUBPATH
    dataset.parent.mkdir(parents=True, exist_ok=True)
    dataset.write_text(json.dumps(DATASET_ROW) + "\n")

    return model_dir, data_dir


# Run by the conformance python with the checkpoint dir as argv[1]: the stand-in tokenizer.
STAND_IN_TOKENIZER_SCRIPT = r"""
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

words = "<unk> <|endoftext|> <|start|> <|end|> user assistant what is 1 + ? put the final"
words += " answer in \\boxed{} 2"
vocab = {word: i for i, word in enumerate(dict.fromkeys(words.split()))}
tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
fast = PreTrainedTokenizerFast(
    tokenizer_object=tokenizer, unk_token="<unk>", eos_token="<|endoftext|>",
    pad_token="<|endoftext|>",
)
fast.chat_template = (
    "{% for m in messages %}<|start|>{{ m['role'] }} {{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)
fast.save_pretrained(sys.argv[1])
"""
