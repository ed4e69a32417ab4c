"""Whether the recipe's two input files are the ones it needs: a complete BF16 gpt-oss-20b
checkpoint (not MXFP4, every shard present and as long as its header says) and a dataset whose
first record holds the prompt and label keys. Each failure is one :class:`InputError` line
naming the path, the flag and the fix. ``docs/conformance.md`` ("The recipe's input files").
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

from miles_amd import strict_json
from miles_amd.recipe.settings import CHECKPOINT_REPO, DATASET_REPO

MXFP4_REPO = "openai/gpt-oss-20b"
_INDEX_FILE = "model.safetensors.index.json"
_SINGLE_FILE = "model.safetensors"
_MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors spec caps the header at 100 MB
_SHOWN_NAMES = 3  # how many missing shards / tensors a message names before "and N more"


class InputError(ValueError):
    """An input file is missing or unusable; the message is one line with the fix."""


Fail = Callable[[Path, str], InputError]


def _fail(flag: str, fix: str) -> Fail:
    return lambda path, problem: InputError(f"{flag}: {path}: {problem}; {fix}")


def _names(items: list[str]) -> str:
    rest = len(items) - _SHOWN_NAMES
    shown = ", ".join(items[:_SHOWN_NAMES])
    return f"{shown} and {rest} more" if rest > 0 else shown


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def validate_checkpoint(path: Path, *, flag: str = "--model-dir") -> None:
    """InputError unless ``path`` is a complete BF16 gpt-oss-20b checkpoint."""
    fail = _fail(
        flag, f"run `miles-amd prepare` or `hf download {CHECKPOINT_REPO} --local-dir {path}`"
    )
    if not path.is_dir():
        raise fail(
            path, "is not a directory" if path.exists() else "checkpoint directory does not exist"
        )
    config = _json_object(path / "config.json", fail)
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and str(quant.get("quant_method", "")).lower() == "mxfp4":
        problem = (
            f"this is the MXFP4 checkpoint ({MXFP4_REPO}) but SGLang's Triton MoE path needs BF16"
        )
        raise fail(path, problem)
    for key in ("torch_dtype", "dtype"):
        if config.get(key) not in (None, "bfloat16"):
            raise fail(path, f"config.json says {key}={config[key]!r}, the recipe needs 'bfloat16'")
    index_file = path / _INDEX_FILE
    if not index_file.exists():
        if not (path / _SINGLE_FILE).is_file():
            raise fail(path, f"has neither {_INDEX_FILE} nor {_SINGLE_FILE}")
        _tensor_names(path / _SINGLE_FILE, fail)
        return
    weight_map = _json_object(index_file, fail).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise fail(index_file, "has no non-empty 'weight_map'")
    by_shard: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard:
            raise fail(index_file, f"maps {tensor!r} to an invalid file {shard!r}")
        by_shard.setdefault(shard, []).append(tensor)
    missing = sorted(s for s in by_shard if not (path / s).is_file())
    if missing:
        raise fail(
            path,
            f"{len(missing)} of {len(by_shard)} shards listed in {_INDEX_FILE} are missing "
            f"({_names(missing)})",
        )
    for shard, tensors in sorted(by_shard.items()):
        present = _tensor_names(path / shard, fail)
        absent = [t for t in tensors if t not in present]
        if absent:
            raise fail(
                path / shard,
                f"lacks {len(absent)} tensors that {_INDEX_FILE} assigns to it ({_names(absent)})",
            )


def _json_object(file: Path, fail: Fail) -> dict:
    if not file.is_file():
        raise fail(file, "is missing")
    try:
        data = strict_json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, strict_json.StrictJsonError) as exc:
        raise fail(file, f"is not valid JSON ({_one_line(exc)})") from exc
    if not isinstance(data, dict):
        raise fail(file, f"holds a JSON {type(data).__name__}, not an object")
    return data


def _tensor_names(file: Path, fail: Fail) -> set[str]:
    """The tensor names of a safetensors file whose length its header accounts for."""
    try:
        size = file.stat().st_size
        with file.open("rb") as handle:
            head = handle.read(8)
            header_len = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            raw = handle.read(header_len) if 0 <= header_len <= _MAX_HEADER_BYTES else b""
    except OSError as exc:
        raise fail(file, f"cannot be read ({_one_line(exc)})") from exc
    if header_len < 0:
        raise fail(file, f"is truncated ({size} bytes, no safetensors header)")
    if header_len > _MAX_HEADER_BYTES or len(raw) < header_len:
        raise fail(file, f"is truncated or corrupt (header length {header_len}, size {size})")
    try:
        header = strict_json.loads(raw)
        ends = [int(e["data_offsets"][1]) for k, e in header.items() if k != "__metadata__"]
    except (AttributeError, KeyError, IndexError, TypeError, ValueError) as exc:  # incl. JSON
        raise fail(file, f"has an unreadable safetensors header ({_one_line(exc)})") from exc
    expected = 8 + header_len + max(ends, default=0)
    if size != expected:
        raise fail(file, f"is truncated or corrupt ({size} bytes, its header describes {expected})")
    return {name for name in header if name != "__metadata__"}


def validate_dataset(
    path: Path, *, input_key: str = "prompt", label_key: str = "label", flag: str = "--data-dir"
) -> None:
    """InputError unless the first non-empty line is a JSON object with both keys."""
    repo = f"--repo-type dataset {DATASET_REPO} --local-dir {path.parent}"
    fail = _fail(flag, f"fetch it with `hf download {repo}`")
    if not path.is_file():
        raise fail(path, "is not a file" if path.exists() else "dataset file does not exist")
    try:
        with path.open(encoding="utf-8") as handle:
            first = next(((n, line) for n, line in enumerate(handle, 1) if line.strip()), None)
    except UnicodeDecodeError as exc:
        raise fail(path, f"is not UTF-8 text ({_one_line(exc)})") from exc
    if first is None:
        raise fail(path, "is empty")
    line_no, text = first
    try:
        record = strict_json.loads(text, non_finite=True)
    except strict_json.StrictJsonError as exc:
        raise fail(path, f"line {line_no} is not JSON ({_one_line(exc)})") from exc
    if not isinstance(record, dict):
        raise fail(path, f"line {line_no} is a JSON {type(record).__name__}, not an object")
    absent = [key for key in (input_key, label_key) if key not in record]
    if absent:
        raise fail(
            path,
            f"line {line_no} has no key {' or '.join(repr(k) for k in absent)} "
            f"(keys: {', '.join(sorted(map(str, record))) or 'none'}); "
            "check --input-key/--label-key or the file",
        )
