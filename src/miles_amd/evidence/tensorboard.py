"""Scalars from TensorBoard event files, read strictly, record by record: every record's
framing and CRC32C is checked (the first bad one is an :class:`EventFileError` naming file and
byte offset), both scalar encodings are read and every point kept, duplicates too. Why:
``docs/gate-and-statistics.md`` ("Reading event files strictly"), ``docs/cli.md``.
"""

from __future__ import annotations

import math
import os
import struct
from collections import defaultdict
from itertools import groupby
from operator import attrgetter
from pathlib import Path

import google_crc32c
from google.protobuf.message import DecodeError
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2

from miles_amd.evidence.types import Columns, SeriesMap, columns_to_series, new_columns
from miles_amd.files import EVENT_FILE, read_regular, regular_files

SCALARS_PLUGIN = "scalars"
_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_CORRUPT = "corrupt event file; re-copy it or rerun"
_TRUNCATED = "truncated event file: its writer did not finish; re-copy it or rerun"
_FLOAT_DTYPES = {types_pb2.DT_FLOAT: ("<f", "float_val"), types_pb2.DT_DOUBLE: ("<d", "double_val")}


class EventFileError(ValueError):
    """An event file whose framing or payload cannot be trusted, located to the byte."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        self.path, self.offset, self.reason = path, offset, reason
        super().__init__(f"{path}: offset {offset}: {reason}")


def masked_crc32c(data: bytes) -> int:
    """The masked CRC32C that TFRecord stores after the length and after the payload."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_records(path: str | os.PathLike[str], *, allow_partial_tail: bool = False) -> list[bytes]:
    """Every record payload of the event file ``path`` (a regular file)."""
    name = os.fspath(path)
    return [p for _, p in split_records(read_regular(name, EVENT_FILE), name, allow_partial_tail)]


def split_records(
    data: bytes, path: str, allow_partial_tail: bool = False
) -> list[tuple[int, bytes]]:
    """``(offset, payload)`` of each record framed in ``data`` (the bytes of ``path``); a
    record cut short is an error unless ``allow_partial_tail`` (a writer still appending: it is
    left out); a CRC mismatch is an error either way."""
    records: list[tuple[int, bytes]] = []
    lengths: dict[bytes, int] = {}  # header bytes already verified -> payload length
    offset, size = 0, len(data)
    while offset < size:
        header = data[offset : offset + _HEADER.size]
        length = lengths.get(header)
        if length is None:
            if len(header) < _HEADER.size:
                if allow_partial_tail:
                    break
                cut = f"{len(header)} of {_HEADER.size} bytes"
                raise EventFileError(path, offset, f"record header cut short: {cut} ({_TRUNCATED})")
            length, stored = _HEADER.unpack(header)
            if masked_crc32c(header[:8]) != stored:
                raise EventFileError(path, offset, f"length CRC mismatch ({_CORRUPT})")
            lengths[header] = length
        start = offset + _HEADER.size
        end = start + length
        if end + _CRC.size > size:
            if allow_partial_tail:
                break
            raise EventFileError(
                path,
                offset,
                f"record cut short: a {length}-byte payload and its CRC need "
                f"{length + _CRC.size} bytes, {size - start} remain ({_TRUNCATED})",
            )
        payload = data[start:end]
        if masked_crc32c(payload) != _CRC.unpack_from(data, end)[0]:
            raise EventFileError(path, offset, f"payload CRC mismatch ({_CORRUPT})")
        records.append((offset, payload))
        offset = end + _CRC.size
    return records


def find_event_files(
    directory: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
) -> list[Path]:
    """Every event file under ``directory``, by directory, then name; only regular files and
    real directories inside ``root`` (default ``directory``), else ``RefusedFile``."""
    return regular_files(directory, lambda name: "tfevents" in name, recursive=True, root=root)


def read_tensorboard_dir(
    path: str | os.PathLike[str],
    *,
    live: bool = False,
    root: str | os.PathLike[str] | None = None,
) -> SeriesMap:
    """The scalar series of every event file under ``path``, keyed by tag (none: an empty
    map); ``live``: an incomplete final record is left out. :class:`EventFileError`, ``OSError``."""
    within = path if root is None else root
    points: defaultdict[str, Columns] = defaultdict(new_columns)
    for _, files in groupby(find_event_files(path, root=within), key=attrgetter("parent")):
        scalar_tags: dict[str, bool] = {}  # the directory's tag -> is-scalar memory
        for file in files:
            data = read_regular(file, EVENT_FILE, root=within)
            _decode(str(file), split_records(data, str(file), live), points, scalar_tags)
    return columns_to_series(points)


def _decode(
    path: str,
    records: list[tuple[int, bytes]],
    points: defaultdict[str, Columns],
    scalar_tags: dict[str, bool],
) -> None:
    steps: dict[int, int] = {}
    for offset, payload in records:
        try:
            event = event_pb2.Event.FromString(payload)
        except DecodeError as error:
            reason = f"payload is not a TensorBoard Event ({error}); {_CORRUPT}"
            raise EventFileError(path, offset, reason) from None
        step = steps.setdefault(event.step, event.step)
        for value in event.summary.value:
            number = value.simple_value  # an unset oneof member reads 0.0: only 0 needs a look
            if not number:
                kind = value.WhichOneof("value")
                if kind == "tensor" and _is_scalar_tag(value, scalar_tags):
                    try:
                        number = tensor_scalar(value.tensor)
                    except ValueError as error:
                        raise EventFileError(path, offset, f"tag {value.tag!r}: {error}") from None
                elif kind != "simple_value":
                    continue
            columns = points[value.tag]
            columns[0].append(step)
            columns[1].append(number)


def _is_scalar_tag(value: summary_pb2.Summary.Value, scalar_tags: dict[str, bool]) -> bool:
    if value.HasField("metadata"):
        plugin = value.metadata.plugin_data.plugin_name
        data_class = value.metadata.data_class
        if plugin or data_class:
            is_scalar = plugin == SCALARS_PLUGIN or data_class == summary_pb2.DATA_CLASS_SCALAR
            scalar_tags[value.tag] = is_scalar
            return is_scalar
    return scalar_tags.get(value.tag, False)


def tensor_scalar(tensor: tensor_pb2.TensorProto) -> float:
    """The one number of a scalars-plugin tensor: any single-element shape (TensorBoard calls
    ``.item()``), ``DT_FLOAT``/``DT_DOUBLE`` in ``tensor_content`` or ``*_val``; else
    ``ValueError`` with the reason."""
    dims = [dim.size for dim in tensor.tensor_shape.dim]
    if tensor.tensor_shape.unknown_rank or math.prod(dims) != 1:
        raise ValueError(f"scalars tensor has shape {dims}, not a single value")
    if tensor.dtype not in _FLOAT_DTYPES:
        raise ValueError(
            f"scalars tensor has dtype {types_pb2.DataType.Name(tensor.dtype)}, "
            "expected DT_FLOAT or DT_DOUBLE"
        )
    layout, field = _FLOAT_DTYPES[tensor.dtype]
    content = tensor.tensor_content
    if content:
        if len(content) != struct.calcsize(layout):
            raise ValueError(f"scalars tensor_content has {len(content)} bytes, not one value")
        return float(struct.unpack(layout, content)[0])
    values = getattr(tensor, field)
    if len(values) != 1:
        raise ValueError(f"scalars tensor holds {len(values)} values in {field}, expected 1")
    return float(values[0])
