"""miles_amd.recipe.inputs on real checkpoint and dataset files written to tmp_path."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from miles_amd.recipe.inputs import InputError, validate_checkpoint, validate_dataset

BF16_CONFIG = {"model_type": "gpt_oss", "num_hidden_layers": 24, "torch_dtype": "bfloat16"}


def safetensors_bytes(tensors: dict[str, int]) -> bytes:
    """A valid safetensors file: tensor name -> byte length of its (zero) data."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, length in tensors.items():
        header[name] = {
            "dtype": "BF16",
            "shape": [length // 2],
            "data_offsets": [offset, offset + length],
        }
        offset += length
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * offset


def write_checkpoint(root: Path, config: dict | None = None) -> Path:
    """A two-shard checkpoint shaped like lmsys/gpt-oss-20b-bf16 (tiny tensors)."""
    ckpt = root / "gpt-oss-20b-bf16"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text(json.dumps(config or BF16_CONFIG))
    shards = {
        "model-00001-of-00002.safetensors": {"model.embed_tokens.weight": 8, "lm_head.weight": 4},
        "model-00002-of-00002.safetensors": {"model.layers.0.mlp.experts.gate_up_proj": 16},
    }
    weight_map = {}
    for shard, tensors in shards.items():
        (ckpt / shard).write_bytes(safetensors_bytes(tensors))
        weight_map.update(dict.fromkeys(tensors, shard))
    index = {"metadata": {"total_size": 28}, "weight_map": weight_map}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    return ckpt


def error_of(call, *args, **kwargs) -> str:
    with pytest.raises(InputError) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    return message


# ---- checkpoint -------------------------------------------------------------------------------


def test_complete_sharded_bf16_checkpoint_passes(tmp_path: Path) -> None:
    validate_checkpoint(write_checkpoint(tmp_path))


def test_single_file_checkpoint_passes(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(BF16_CONFIG))
    (ckpt / "model.safetensors").write_bytes(safetensors_bytes({"w": 4}))
    validate_checkpoint(ckpt)


def test_missing_directory_names_flag_path_and_download(tmp_path: Path) -> None:
    ckpt = tmp_path / "gpt-oss-20b-bf16"
    message = error_of(validate_checkpoint, ckpt)
    assert message.startswith(f"--model-dir: {ckpt}:")
    assert "does not exist" in message
    assert f"hf download lmsys/gpt-oss-20b-bf16 --local-dir {ckpt}" in message


def test_custom_flag_is_named(tmp_path: Path) -> None:
    message = error_of(validate_checkpoint, tmp_path / "nope", flag="--hf-checkpoint")
    assert message.startswith("--hf-checkpoint: ")


def test_file_instead_of_directory(tmp_path: Path) -> None:
    target = tmp_path / "gpt-oss-20b-bf16"
    target.write_text("x")
    assert "is not a directory" in error_of(validate_checkpoint, target)


def test_mxfp4_checkpoint_is_rejected_with_the_bf16_fix(tmp_path: Path) -> None:
    config = {
        "model_type": "gpt_oss",
        "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["router"]},
    }
    ckpt = write_checkpoint(tmp_path, config)
    message = error_of(validate_checkpoint, ckpt)
    assert "MXFP4" in message
    assert "openai/gpt-oss-20b" in message
    assert "BF16" in message
    assert "miles-amd prepare" in message
    assert f"hf download lmsys/gpt-oss-20b-bf16 --local-dir {ckpt}" in message


def test_other_quantization_is_not_mistaken_for_mxfp4(tmp_path: Path) -> None:
    config = dict(BF16_CONFIG, quantization_config={"quant_method": "fp8"})
    validate_checkpoint(write_checkpoint(tmp_path, config))


@pytest.mark.parametrize("key", ["torch_dtype", "dtype"])
def test_non_bf16_dtype_is_rejected(tmp_path: Path, key: str) -> None:
    config = {"model_type": "gpt_oss", key: "float16"}
    message = error_of(validate_checkpoint, write_checkpoint(tmp_path, config))
    assert f"{key}='float16'" in message
    assert "bfloat16" in message


def test_config_without_dtype_is_accepted(tmp_path: Path) -> None:
    validate_checkpoint(write_checkpoint(tmp_path, {"model_type": "gpt_oss"}))


def test_missing_config_json(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path)
    (ckpt / "config.json").unlink()
    message = error_of(validate_checkpoint, ckpt)
    assert f"{ckpt / 'config.json'}: is missing" in message


def test_invalid_config_json(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path)
    (ckpt / "config.json").write_text('{"torch_dtype": "bfloat16",')
    assert "config.json: is not valid JSON" in error_of(validate_checkpoint, ckpt)


def test_config_json_with_a_duplicate_key_is_refused(tmp_path: Path) -> None:
    """Python's json keeps the last: a second key could hide the MXFP4 quantization."""
    ckpt = write_checkpoint(tmp_path)
    text = '{"quantization_config": {"quant_method": "mxfp4"}, "quantization_config": null}'
    (ckpt / "config.json").write_text(text)
    message = error_of(validate_checkpoint, ckpt)
    assert "config.json: is not valid JSON" in message
    assert "duplicate key 'quantization_config'" in message


def test_a_safetensors_header_with_a_huge_integer_is_refused(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path)
    shard = ckpt / "model-00001-of-00002.safetensors"
    raw = b'{"lm_head.weight": {"dtype": "BF16", "data_offsets": [0, 1' + b"0" * 40 + b"]}}"
    shard.write_bytes(struct.pack("<Q", len(raw)) + raw)
    assert "unreadable safetensors header" in error_of(validate_checkpoint, ckpt)


def test_config_json_that_is_not_an_object(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path)
    (ckpt / "config.json").write_text("[1, 2]")
    assert "holds a JSON list, not an object" in error_of(validate_checkpoint, ckpt)


def test_missing_shard_is_named(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path)
    (ckpt / "model-00002-of-00002.safetensors").unlink()
    message = error_of(validate_checkpoint, ckpt)
    assert "1 of 2 shards" in message
    assert "model-00002-of-00002.safetensors" in message


def test_truncated_shard_is_rejected(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path)
    shard = ckpt / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-3])
    message = error_of(validate_checkpoint, ckpt)
    assert "model-00001-of-00002.safetensors" in message
    assert "truncated" in message


def test_shard_cut_inside_its_header_is_rejected(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path)
    shard = ckpt / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:20])
    assert "truncated" in error_of(validate_checkpoint, ckpt)


def test_empty_shard_is_rejected(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path)
    (ckpt / "model-00002-of-00002.safetensors").write_bytes(b"")
    assert "truncated (0 bytes" in error_of(validate_checkpoint, ckpt)


def test_shard_lacking_an_indexed_tensor(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path)
    (ckpt / "model-00001-of-00002.safetensors").write_bytes(
        safetensors_bytes({"model.embed_tokens.weight": 8})
    )
    message = error_of(validate_checkpoint, ckpt)
    assert "lacks 1 tensors" in message
    assert "lm_head.weight" in message


def test_index_without_weight_map(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path)
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    assert "has no non-empty 'weight_map'" in error_of(validate_checkpoint, ckpt)


def test_index_pointing_outside_the_directory(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path)
    index = {"weight_map": {"w": "../elsewhere.safetensors"}}
    (ckpt / "model.safetensors.index.json").write_text(json.dumps(index))
    assert "invalid file '../elsewhere.safetensors'" in error_of(validate_checkpoint, ckpt)


def test_directory_without_weights(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(BF16_CONFIG))
    message = error_of(validate_checkpoint, ckpt)
    assert "has neither model.safetensors.index.json nor model.safetensors" in message


# ---- dataset ----------------------------------------------------------------------------------

DAPO_RECORD = {
    "prompt": [{"role": "user", "content": "Solve 1 + 1. Answer: $Answer"}],
    "label": "2",
}


def write_dataset(root: Path, text: str) -> Path:
    path = root / "dapo-math-17k" / "dapo-math-17k.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_dataset_with_prompt_and_label_passes(tmp_path: Path) -> None:
    validate_dataset(write_dataset(tmp_path, json.dumps(DAPO_RECORD) + "\n" + "not read\n"))


def test_leading_blank_lines_are_skipped(tmp_path: Path) -> None:
    validate_dataset(write_dataset(tmp_path, "\n   \n" + json.dumps(DAPO_RECORD) + "\n"))


def test_missing_dataset_names_flag_and_download(tmp_path: Path) -> None:
    path = tmp_path / "dapo-math-17k" / "dapo-math-17k.jsonl"
    message = error_of(validate_dataset, path)
    assert message.startswith(f"--data-dir: {path}: dataset file does not exist")
    expected = f"hf download --repo-type dataset zhuzilin/dapo-math-17k --local-dir {path.parent}"
    assert expected in message


def test_empty_dataset(tmp_path: Path) -> None:
    assert "is empty" in error_of(validate_dataset, write_dataset(tmp_path, "\n\n"))


def test_dataset_line_that_is_not_json(tmp_path: Path) -> None:
    message = error_of(validate_dataset, write_dataset(tmp_path, "\n<html>404</html>\n"))
    assert "line 2 is not JSON" in message


def test_dataset_line_that_is_not_an_object(tmp_path: Path) -> None:
    message = error_of(validate_dataset, write_dataset(tmp_path, '["prompt", "label"]\n'))
    assert "line 1 is a JSON list, not an object" in message


def test_dataset_without_label_names_the_key_and_the_keys_found(tmp_path: Path) -> None:
    record = {"prompt": "x", "answer": "2"}
    message = error_of(validate_dataset, write_dataset(tmp_path, json.dumps(record) + "\n"))
    assert "has no key 'label'" in message
    assert "keys: answer, prompt" in message
    assert "--label-key" in message


def test_dataset_with_custom_keys(tmp_path: Path) -> None:
    path = write_dataset(tmp_path, json.dumps({"question": "q", "answer": "a"}) + "\n")
    validate_dataset(path, input_key="question", label_key="answer")
    message = error_of(validate_dataset, path, flag="--prompt-data")
    assert message.startswith("--prompt-data: ")
    assert "has no key 'prompt' or 'label'" in message


def test_dataset_that_is_not_utf8(tmp_path: Path) -> None:
    path = write_dataset(tmp_path, "")
    path.write_bytes(b"\xff\xfe\x00garbage\n")
    assert "is not UTF-8 text" in error_of(validate_dataset, path)


def test_dataset_directory_instead_of_file(tmp_path: Path) -> None:
    assert "is not a file" in error_of(validate_dataset, tmp_path)


def test_shard_with_garbage_header_is_rejected(tmp_path: Path) -> None:
    ckpt = write_checkpoint(tmp_path)
    garbage = b"<html>rate limited</html>"
    (ckpt / "model-00002-of-00002.safetensors").write_bytes(struct.pack("<Q", 8) + garbage)
    assert "unreadable safetensors header" in error_of(validate_checkpoint, ckpt)
