"""The smallest on-disk inputs miles' real ``parse_args()`` and ``train()`` need for the recipe,
at the recipe's relative paths: ``models/gpt-oss-20b-bf16/config.json`` (the parser's
``hf_validate_args`` compares it with the Megatron model flags) and one dapo-math row (the
parser never opens it; the start-up smoke's rollout manager reads it with the stand-in
tokenizer :data:`STAND_IN_TOKENIZER_SCRIPT` writes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MODEL_SUBDIR = "gpt-oss-20b-bf16"
DATASET_SUBPATH = Path("dapo-math-17k") / "dapo-math-17k.jsonl"

NUM_LAYERS = 24

# config.json of lmsys/gpt-oss-20b-bf16 (openai/gpt-oss-20b without its MXFP4
# quantization_config), with its real value types: transformers' GptOssConfig checks them.
GPT_OSS_20B_BF16_CONFIG: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "torch_dtype": "bfloat16",
    "attention_bias": True, "attention_dropout": 0.0, "eos_token_id": 200002,
    "pad_token_id": 199999, "experts_per_token": 4, "num_experts_per_tok": 4,
    "num_local_experts": 32, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
    "intermediate_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "layer_types": [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(NUM_LAYERS)
    ],
    "max_position_embeddings": 131072, "num_attention_heads": 64,
    "num_hidden_layers": NUM_LAYERS, "num_key_value_heads": 8, "output_router_logits": False,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
        "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False,
    },
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "use_cache": True, "vocab_size": 201088,
}  # fmt: skip

# One row in the dapo-math-17k shape (--input-key prompt --label-key label, a chat message list).
DATASET_ROW: dict[str, Any] = {
    "prompt": [{"role": "user", "content": "What is 1 + 1? Put the final answer in \\boxed{}."}],
    "label": "2",
}


def make_fake_inputs(root: Path) -> tuple[Path, Path]:
    """The fake checkpoint and dataset under ``root``: ``(model_dir, data_dir)``."""
    model_dir, data_dir = root / "models", root / "datasets"
    checkpoint = model_dir / MODEL_SUBDIR
    checkpoint.mkdir(parents=True, exist_ok=True)
    (checkpoint / "config.json").write_text(json.dumps(GPT_OSS_20B_BF16_CONFIG, indent=2) + "\n")
    dataset = data_dir / DATASET_SUBPATH
    dataset.parent.mkdir(parents=True, exist_ok=True)
    dataset.write_text(json.dumps(DATASET_ROW) + "\n")
    return model_dir, data_dir


# Run by the conformance python with the checkpoint dir as argv[1]: a word-level tokenizer
# over the row's words with a chat template (miles/rollout/data_source.py applies it).
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
