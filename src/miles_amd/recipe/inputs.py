"""Whether the recipe's two input files are the ones it needs: a complete BF16 gpt-oss-20b
checkpoint (not MXFP4, every safetensors shard present and as long as its header says) and a
dataset whose first record holds the prompt and label keys. Each failure is one
:class:`InputError` line naming the path, the flag and the fix. ``docs/conformance.md`` ("The
recipe's input files").
"""

from __future__ import annotations

import struct
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


def _where(path: Path, flag: str | None) -> str:
    return f"{flag}: {path}" if flag else str(path)


def _fail(path: Path, flag: str | None, problem: str, fix: str) -> InputError:
    return InputError(f"{_where(path, flag)}: {problem}; {fix}")


def _names(items: list[str]) -> str:
    shown = ", ".join(items[:_SHOWN_NAMES])
    rest = len(items) - _SHOWN_NAMES
    return f"{shown} and {rest} more" if rest > 0 else shown


def _download_fix(checkpoint_dir: Path) -> str:
    return (
        f"run `miles-amd prepare` or `hf download {CHECKPOINT_REPO} --local-dir {checkpoint_dir}`"
    )


def validate_checkpoint(path: Path, *, flag: str = "--model-dir") -> None:
    """Raise :class:`InputError` unless ``path`` is a complete BF16 gpt-oss-20b checkpoint.

    ``path`` is the checkpoint directory itself (``<model_dir>/gpt-oss-20b-bf16``); ``flag``
    names the CLI option the directory was derived from, for the message.
    """
    fix = _download_fix(path)
    if not path.is_dir():
        problem = "is not a directory" if path.exists() else "checkpoint directory does not exist"
        raise _fail(path, flag, problem, fix)

    config = _read_json_object(path / "config.json", flag, fix)
    quant = config.get("quantization_config")
    if isinstance(quant, dict) and str(quant.get("quant_method", "")).lower() == "mxfp4":
        raise _fail(
            path,
            flag,
            f"this is the MXFP4 checkpoint ({MXFP4_REPO}) but SGLang's Triton MoE path needs BF16",
            fix,
        )
    for dtype_key in ("torch_dtype", "dtype"):
        dtype = config.get(dtype_key)
        if dtype is not None and dtype != "bfloat16":
            raise _fail(
                path,
                flag,
                f"config.json says {dtype_key}={dtype!r}, the recipe needs 'bfloat16'",
                fix,
            )

    _validate_weights(path, flag, fix)


def _read_json_object(file: Path, flag: str | None, fix: str) -> dict:
    if not file.is_file():
        raise _fail(file, flag, "is missing", fix)
    try:
        data = strict_json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, strict_json.StrictJsonError) as exc:
        raise _fail(file, flag, f"is not valid JSON ({_one_line(exc)})", fix) from exc
    if not isinstance(data, dict):
        raise _fail(file, flag, f"holds a JSON {type(data).__name__}, not an object", fix)
    return data


def _validate_weights(checkpoint_dir: Path, flag: str | None, fix: str) -> None:
    index_file = checkpoint_dir / _INDEX_FILE
    if not index_file.exists():
        single = checkpoint_dir / _SINGLE_FILE
        if not single.is_file():
            raise _fail(checkpoint_dir, flag, f"has neither {_INDEX_FILE} nor {_SINGLE_FILE}", fix)
        _safetensors_tensor_names(single, flag, fix)
        return

    index = _read_json_object(index_file, flag, fix)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise _fail(index_file, flag, "has no non-empty 'weight_map'", fix)

    tensors_by_shard: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard:
            raise _fail(index_file, flag, f"maps {tensor!r} to an invalid file {shard!r}", fix)
        tensors_by_shard.setdefault(shard, []).append(tensor)

    missing = sorted(s for s in tensors_by_shard if not (checkpoint_dir / s).is_file())
    if missing:
        raise _fail(
            checkpoint_dir,
            flag,
            f"{len(missing)} of {len(tensors_by_shard)} shards listed in {_INDEX_FILE} "
            f"are missing ({_names(missing)})",
            fix,
        )
    for shard, tensors in sorted(tensors_by_shard.items()):
        shard_path = checkpoint_dir / shard
        present = _safetensors_tensor_names(shard_path, flag, fix)
        absent = [t for t in tensors if t not in present]
        if absent:
            raise _fail(
                shard_path,
                flag,
                f"lacks {len(absent)} tensors that {_INDEX_FILE} assigns to it ({_names(absent)})",
                fix,
            )


def _safetensors_tensor_names(file: Path, flag: str | None, fix: str) -> set[str]:
    """Return the tensor names in a safetensors file after checking its length."""
    try:
        size = file.stat().st_size
        with file.open("rb") as handle:
            head = handle.read(8)
            header_len = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            raw = handle.read(header_len) if 0 <= header_len <= _MAX_HEADER_BYTES else b""
    except OSError as exc:
        raise _fail(file, flag, f"cannot be read ({_one_line(exc)})", fix) from exc
    if header_len < 0:
        raise _fail(file, flag, f"is truncated ({size} bytes, no safetensors header)", fix)
    if header_len > _MAX_HEADER_BYTES or len(raw) < header_len:
        raise _fail(
            file, flag, f"is truncated or corrupt (header length {header_len}, size {size})", fix
        )
    try:
        header = strict_json.loads(raw)
        ends = [
            int(entry["data_offsets"][1])
            for name, entry in header.items()
            if name != "__metadata__"
        ]
    except (AttributeError, KeyError, IndexError, TypeError, ValueError) as exc:  # incl. JSON
        raise _fail(
            file, flag, f"has an unreadable safetensors header ({_one_line(exc)})", fix
        ) from exc
    expected = 8 + header_len + max(ends, default=0)
    if size != expected:
        raise _fail(
            file,
            flag,
            f"is truncated or corrupt ({size} bytes, its header describes {expected})",
            fix,
        )
    return {name for name in header if name != "__metadata__"}


def validate_dataset(
    path: Path,
    *,
    input_key: str = "prompt",
    label_key: str = "label",
    flag: str = "--data-dir",
) -> None:
    """Raise :class:`InputError` unless ``path``'s first non-empty line is a JSON object
    with both ``input_key`` and ``label_key``.

    Only the first record is read: the file is 17k lines and miles itself reports a bad record
    later with its line; this check catches the wrong file, an empty file, or an unfinished
    download before a GPU is touched.
    """
    fix = (
        f"fetch it with `hf download --repo-type dataset {DATASET_REPO} --local-dir {path.parent}`"
    )
    if not path.is_file():
        problem = "is not a file" if path.exists() else "dataset file does not exist"
        raise _fail(path, flag, problem, fix)

    first = _first_non_empty_line(path, flag, fix)
    if first is None:
        raise _fail(path, flag, "is empty", fix)
    line_no, text = first
    try:
        record = strict_json.loads(text, non_finite=True)
    except strict_json.StrictJsonError as exc:
        raise _fail(path, flag, f"line {line_no} is not JSON ({_one_line(exc)})", fix) from exc
    if not isinstance(record, dict):
        raise _fail(
            path, flag, f"line {line_no} is a JSON {type(record).__name__}, not an object", fix
        )
    absent = [key for key in (input_key, label_key) if key not in record]
    if absent:
        raise _fail(
            path,
            flag,
            f"line {line_no} has no key {' or '.join(repr(k) for k in absent)} "
            f"(keys: {', '.join(sorted(map(str, record))) or 'none'}); "
            "check --input-key/--label-key or the file",
            fix,
        )


def _first_non_empty_line(path: Path, flag: str | None, fix: str) -> tuple[int, str] | None:
    try:
        with path.open(encoding="utf-8") as handle:
            for line_no, line in enumerate(handle, start=1):
                if line.strip():
                    return line_no, line
    except UnicodeDecodeError as exc:
        raise _fail(path, flag, f"is not UTF-8 text ({_one_line(exc)})", fix) from exc
    return None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
