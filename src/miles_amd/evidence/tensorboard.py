"""Scalars from TensorBoard event files, read strictly.

- Which summary values are scalars and their (step, value) points: every event file
  (``tfevents`` in its name, TensorBoard's rule) under a directory, recursively, directory by
  directory, files in name order (which is write order).
- Both scalar encodings: ``simple_value`` (float32; what ``SummaryWriter.add_scalar`` and so
  miles writes) and a one-element float tensor of the ``scalars`` plugin (what
  ``tensorboard.summary.Writer`` writes; the plugin remembered per directory, since only a
  tag's first value carries it).
- Everything else is skipped; nothing else is: no "orphaned data" purge as in
  ``EventAccumulator``, every point kept, duplicates too (the gate names them).
- Decoded record by record with the ``tensorboard`` package's ``event_pb2.Event``.

Caveats:

- ``simple_value`` is float32: a value read here is the float32 nearest what the run logged.
- About 2.5 us a scalar with protobuf's upb backend; a faster whole-file decoder was removed
  as within ``benchmarks/bench_gate.py``'s noise (figures in the doc).
- Does not decide whether an empty directory is a problem (``load``) or which source wins
  (``merge``).

Explained in ``docs/cli.md`` ("How the gate reads a run dir", TensorBoard).
"""

from __future__ import annotations

import os
import struct
from collections import defaultdict
from itertools import groupby
from operator import attrgetter
from pathlib import Path

from google.protobuf.message import DecodeError
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2

from miles_amd.evidence.safe_open import regular_files
from miles_amd.evidence.series import Columns, columns_to_series, new_columns
from miles_amd.evidence.tfrecord import EventFileError, read_records, record_offset
from miles_amd.evidence.types import SeriesMap

SCALARS_PLUGIN = "scalars"

_FLOAT_DTYPES: dict[int, tuple[str, str]] = {
    types_pb2.DT_FLOAT: ("<f", "float_val"),
    types_pb2.DT_DOUBLE: ("<d", "double_val"),
}


def find_event_files(
    directory: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
) -> list[Path]:
    """Every event file under ``directory`` (recursively), by directory, then name.

    Only regular files and real directories inside ``root`` (default ``directory``) are
    walked; an event file that is not one, or a link, is a ``RefusedFile``
    (:mod:`miles_amd.evidence.safe_open`).
    """
    return regular_files(directory, _is_event_file, recursive=True, root=root)


def _is_event_file(name: str) -> bool:
    return "tfevents" in name


def read_tensorboard_dir(
    path: str | os.PathLike[str],
    *,
    live: bool = False,
    root: str | os.PathLike[str] | None = None,
) -> SeriesMap:
    """The scalar series of every event file under ``path``, keyed by tag.

    ``live`` reads files a writer is still appending to: an incomplete final record is left
    out; a CRC mismatch is an error either way. Raises :class:`EventFileError` for a corrupt,
    truncated or undecodable file, ``FileNotFoundError``/``NotADirectoryError`` for a bad
    ``path``, ``RefusedFile`` for what is not a regular file inside ``root`` (default
    ``path``) or is over its cap. A directory without event files or scalars gives an
    empty map.
    """
    directory = Path(path)
    if not directory.exists():
        raise FileNotFoundError(f"{directory}: no such TensorBoard directory")
    if not directory.is_dir():
        raise NotADirectoryError(f"{directory}: expected a TensorBoard directory, found a file")
    within = directory if root is None else root
    points: defaultdict[str, Columns] = defaultdict(new_columns)
    event_files = find_event_files(directory, root=within)
    for _directory, files in groupby(event_files, key=attrgetter("parent")):
        scalar_tags: dict[str, bool] = {}
        for file in files:
            records = read_records(file, allow_partial_tail=live, root=within)
            _decode_records(str(file), records, points, scalar_tags)
    return columns_to_series(points)


def _decode_records(
    path: str,
    records: list[bytes],
    points: defaultdict[str, Columns],
    scalar_tags: dict[str, bool],
) -> None:
    """Add the scalars of an event file's records to each tag's columns in ``points``.

    Records are decoded one by one as ``tensorboard.Event``; errors name the record's
    offset. ``scalar_tags`` is the directory's tag -> is-scalar memory.

    Equal steps share one ``int`` object (fewer scattered objects for later passes; see
    ``series``).
    """
    decode = event_pb2.Event.FromString
    steps: dict[int, int] = {}
    for index, payload in enumerate(records):
        try:
            event = decode(payload)
        except DecodeError as error:
            raise EventFileError(
                path,
                record_offset(records, index),
                f"payload is not a TensorBoard Event ({error}); corrupt event file, "
                "re-copy it or rerun",
            ) from None
        step = event.step
        step = steps.setdefault(step, step)
        for value in event.summary.value:
            # A oneof member that is not set reads as 0.0, so a non-zero simple_value is
            # one; only a zero needs the (slower) oneof lookup.
            number = value.simple_value
            if not number:
                kind = value.WhichOneof("value")
                if kind == "tensor" and _is_scalar_tag(value, scalar_tags):
                    try:
                        number = tensor_scalar(value.tensor)
                    except ValueError as error:
                        raise EventFileError(
                            path, record_offset(records, index), f"tag {value.tag!r}: {error}"
                        ) from None
                elif kind != "simple_value":
                    continue
            columns = points[value.tag]
            columns[0].append(step)
            columns[1].append(number)


def _is_scalar_tag(value: summary_pb2.Summary.Value, scalar_tags: dict[str, bool]) -> bool:
    """Whether a tensor value is a scalar, from its metadata or its tag's earlier metadata."""
    if value.HasField("metadata"):
        metadata = value.metadata
        plugin = metadata.plugin_data.plugin_name
        data_class = metadata.data_class
        if plugin or data_class:
            is_scalar = plugin == SCALARS_PLUGIN or data_class == summary_pb2.DATA_CLASS_SCALAR
            scalar_tags[value.tag] = is_scalar
            return is_scalar
    return scalar_tags.get(value.tag, False)


def tensor_scalar(tensor: tensor_pb2.TensorProto) -> float:
    """The one number a scalars-plugin ``TensorProto`` holds.

    TensorBoard's scalars plugin reads any single-element tensor (it calls ``.item()``), so
    the shape may be ``[]``, ``[1]``, ``[1, 1]``...; the dtype must be ``DT_FLOAT`` or
    ``DT_DOUBLE``, the value in ``tensor_content`` or the typed ``*_val`` field. Anything
    else raises ``ValueError`` with the reason.
    """
    shape = tensor.tensor_shape
    elements = 1
    for dim in shape.dim:
        elements *= dim.size
    if shape.unknown_rank or elements != 1:
        dims = [dim.size for dim in shape.dim]
        raise ValueError(f"scalars tensor has shape {dims}, not a single value")
    dtype = tensor.dtype
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(
            f"scalars tensor has dtype {types_pb2.DataType.Name(dtype)}, "
            "expected DT_FLOAT or DT_DOUBLE"
        )
    layout, field = _FLOAT_DTYPES[dtype]
    content = tensor.tensor_content
    if content:
        if len(content) != struct.calcsize(layout):
            raise ValueError(f"scalars tensor_content has {len(content)} bytes, not one value")
        return float(struct.unpack(layout, content)[0])
    values = getattr(tensor, field)
    if len(values) != 1:
        raise ValueError(f"scalars tensor holds {len(values)} values in {field}, expected 1")
    return float(values[0])
