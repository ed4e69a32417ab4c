"""miles_amd.recipe.inputs on real checkpoint and dataset files written to tmp_path: every
refusal is one line naming the path, the flag and the fix."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from miles_amd.recipe.inputs import InputError, validate_checkpoint, validate_dataset

BF16_CONFIG = {"model_type": "gpt_oss", "num_hidden_layers": 24, "torch_dtype": "bfloat16"}
SHARD1, SHARD2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
INDEX = "model.safetensors.index.json"
MXFP4 = {"quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["router"]}}
DAPO_RECORD = {"prompt": [{"role": "user", "content": "Solve 1 + 1."}], "label": "2"}
DAPO = json.dumps(DAPO_RECORD)


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


def write_checkpoint(root: Path) -> Path:
    """A two-shard checkpoint shaped like lmsys/gpt-oss-20b-bf16 (tiny tensors)."""
    ckpt = root / "gpt-oss-20b-bf16"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text(json.dumps(BF16_CONFIG))
    shards = {
        SHARD1: {"model.embed_tokens.weight": 8, "lm_head.weight": 4},
        SHARD2: {"e.gate_up_proj": 16},
    }
    weight_map = {}
    for shard, tensors in shards.items():
        (ckpt / shard).write_bytes(safetensors_bytes(tensors))
        weight_map.update(dict.fromkeys(tensors, shard))
    (ckpt / INDEX).write_text(
        json.dumps({"metadata": {"total_size": 28}, "weight_map": weight_map})
    )
    return ckpt


def error_of(call: Callable[..., None], *args: object, **kwargs: object) -> str:
    with pytest.raises(InputError) as info:
        call(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def _config(config: dict) -> Callable[[Path], object]:
    return lambda ckpt: (ckpt / "config.json").write_text(json.dumps(config))


def _write(name: str, data: bytes | str) -> Callable[[Path], None]:
    def edit(ckpt: Path) -> None:
        path = ckpt / name
        path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)

    return edit


def _cut(name: str, keep: slice) -> Callable[[Path], object]:
    return lambda ckpt: (ckpt / name).write_bytes((ckpt / name).read_bytes()[keep])


def _single_file(ckpt: Path) -> None:
    (ckpt / INDEX).unlink()
    (ckpt / "model.safetensors").write_bytes(safetensors_bytes({"w": 4}))


HUGE = b'{"lm_head.weight": {"dtype": "BF16", "data_offsets": [0, 1' + b"0" * 40 + b"]}}"
# (case, edit, needles of the refusal; none: the checkpoint passes). Python's json keeps the
# last key: a duplicate one could hide the MXFP4 quantization.
DUPLICATE = '{"quantization_config": {"quant_method": "mxfp4"}, "quantization_config": null}'
GARBAGE = struct.pack("<Q", 8) + b"<html>rate limited</html>"
NOT_ALL = safetensors_bytes({"model.embed_tokens.weight": 8})
# fmt: off
CASES = [
    ("sharded bf16", lambda ckpt: None, []),
    ("single file", _single_file, []),
    ("fp8", _config(dict(BF16_CONFIG, quantization_config={"quant_method": "fp8"})), []),
    ("no dtype", _config({"model_type": "gpt_oss"}), []),
    ("mxfp4", _config({"model_type": "gpt_oss", **MXFP4}),
     ["MXFP4", "openai/gpt-oss-20b", "BF16", "miles-amd prepare"]),
    ("torch_dtype", _config({"torch_dtype": "float16"}), ["torch_dtype='float16'", "bfloat16"]),
    ("dtype", _config({"dtype": "float16"}), ["dtype='float16'", "bfloat16"]),
    ("no config", lambda ckpt: (ckpt / "config.json").unlink(), ["config.json: is missing"]),
    ("bad json", _write("config.json", '{"torch_dtype": "bf16",'), ["config.json: is not valid"]),
    ("duplicate key", _write("config.json", DUPLICATE),
     ["config.json: is not valid JSON", "duplicate key 'quantization_config'"]),
    ("config list", _write("config.json", "[1, 2]"), ["holds a JSON list, not an object"]),
    ("missing shard", lambda ckpt: (ckpt / SHARD2).unlink(), ["1 of 2 shards", SHARD2]),
    ("truncated", _cut(SHARD1, slice(None, -3)), [SHARD1, "truncated"]),
    ("cut in header", _cut(SHARD1, slice(None, 20)), ["truncated"]),
    ("empty shard", _write(SHARD2, b""), ["truncated (0 bytes"]),
    ("lacks a tensor", _write(SHARD1, NOT_ALL), ["lacks 1 tensors", "lm_head.weight"]),
    ("huge integer", _write(SHARD1, struct.pack("<Q", len(HUGE)) + HUGE), ["unreadable safet"]),
    ("garbage header", _write(SHARD2, GARBAGE), ["unreadable safetensors header"]),
    ("no weight map", _write(INDEX, json.dumps({"metadata": {}})), ["no non-empty 'weight_map'"]),
    ("outside", _write(INDEX, json.dumps({"weight_map": {"w": "../x.safetensors"}})),
     ["invalid file '../x.safetensors'"]),
    ("no weights", lambda ckpt: [(ckpt / n).unlink() for n in (INDEX, SHARD1, SHARD2)],
     [f"has neither {INDEX} nor model.safetensors"]),
]
# fmt: on


@pytest.mark.parametrize(("name", "edit", "needles"), CASES, ids=[c[0] for c in CASES])
def test_a_broken_checkpoint_is_one_line_with_the_download_fix(
    tmp_path: Path, name, edit, needles
) -> None:
    ckpt = write_checkpoint(tmp_path)
    edit(ckpt)
    if not needles:
        validate_checkpoint(ckpt)
        return
    message = error_of(validate_checkpoint, ckpt)
    assert message.startswith("--model-dir: ") and str(ckpt) in message
    assert f"hf download lmsys/gpt-oss-20b-bf16 --local-dir {ckpt}" in message
    assert all(needle in message for needle in needles), message


def test_a_missing_or_wrong_kind_of_checkpoint_path_names_its_flag(tmp_path: Path) -> None:
    ckpt = tmp_path / "gpt-oss-20b-bf16"
    message = error_of(validate_checkpoint, ckpt)
    assert message.startswith(f"--model-dir: {ckpt}:") and "does not exist" in message
    assert f"hf download lmsys/gpt-oss-20b-bf16 --local-dir {ckpt}" in message
    assert error_of(validate_checkpoint, ckpt, flag="--hf-checkpoint").startswith(
        "--hf-checkpoint: "
    )
    ckpt.write_text("x")
    assert "is not a directory" in error_of(validate_checkpoint, ckpt)


def write_dataset(root: Path, text: str | bytes) -> Path:
    path = root / "dapo-math-17k" / "dapo-math-17k.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        (DAPO + "\nnot read\n", []),
        ("\n   \n" + DAPO + "\n", []),
        ("\n\n", ["is empty"]),
        ("\n<html>404</html>\n", ["line 2 is not JSON"]),
        ('["prompt", "label"]\n', ["line 1 is a JSON list, not an object"]),
        (
            '{"prompt": "x", "answer": "2"}\n',
            ["has no key 'label'", "keys: answer, prompt", "--label-key"],
        ),
        (b"\xff\xfe\x00garbage\n", ["is not UTF-8 text"]),
    ],
)
def test_a_wrong_dataset_is_one_line_naming_the_fix(tmp_path: Path, text, needles) -> None:
    path = write_dataset(tmp_path, text)
    if not needles:
        validate_dataset(path)
        return
    message = error_of(validate_dataset, path)
    assert message.startswith(f"--data-dir: {path}: ")
    assert f"--repo-type dataset zhuzilin/dapo-math-17k --local-dir {path.parent}" in message
    assert all(needle in message for needle in needles), message


def test_dataset_paths_and_custom_keys(tmp_path: Path) -> None:
    path = tmp_path / "dapo-math-17k" / "dapo-math-17k.jsonl"
    message = error_of(validate_dataset, path)
    assert message.startswith(f"--data-dir: {path}: dataset file does not exist")
    assert "is not a file" in error_of(validate_dataset, tmp_path)
    path = write_dataset(tmp_path, '{"question": "q", "answer": "a"}\n')
    validate_dataset(path, input_key="question", label_key="answer")
    message = error_of(validate_dataset, path, flag="--prompt-data")
    assert message.startswith("--prompt-data: ") and "has no key 'prompt' or 'label'" in message
