"""Strict reader of the TFRecord framing that TensorBoard event files are written in.

Decides:

- whether a file is a whole, uncorrupted sequence of records (length, its masked CRC32C,
  payload, the payload's masked CRC32C); every record is checked;
- the first bad record is an :class:`EventFileError` naming file, byte offset and reason.

Does not decide: what the payloads mean (``evidence.tensorboard`` decodes them). Caveat:
TensorBoard's own loader is not used, as it stops quietly at a damaged record. The framing,
why not TensorBoard's loader and the speed facts: ``docs/gate-and-statistics.md``
("Reading event files strictly").
"""

from __future__ import annotations

import os
import struct

import google_crc32c

from miles_amd.evidence.safe_open import EVENT_FILE, read_regular

_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_HEADER_SIZE = _HEADER.size  # 12
_FOOTER_SIZE = _CRC.size  # 4
_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF

_CORRUPT = "corrupt event file; re-copy it or rerun"
_TRUNCATED = "truncated event file: its writer did not finish; re-copy it or rerun"


class EventFileError(ValueError):
    """An event file whose framing or payload cannot be trusted, located to the byte."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        super().__init__(f"{path}: offset {offset}: {reason}")


def masked_crc32c(data: bytes) -> int:
    """The masked CRC32C that TFRecord stores after the length and after the payload."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32


def read_records(
    path: str | os.PathLike[str],
    *,
    allow_partial_tail: bool = False,
    root: str | os.PathLike[str] | None = None,
) -> list[bytes]:
    """Every record payload of the event file at ``path``, in file order.

    Strict by default: a record cut short (a header, payload or CRC running past the end of
    the file) is an :class:`EventFileError`, like a CRC mismatch. ``allow_partial_tail`` is
    for reading a file its writer is still appending to: an incomplete final record is then
    left out (it is the write in flight), but a CRC mismatch is still an error, because
    bytes already written never change.

    The file must be a regular file inside ``root`` (default: its directory) within the
    event-file cap, else :class:`~miles_amd.evidence.safe_open.RefusedFile`.
    """
    name = os.fspath(path)
    data = read_regular(name, EVENT_FILE, root=root)
    return split_records(data, name, allow_partial_tail=allow_partial_tail)


def split_records(data: bytes, path: str, *, allow_partial_tail: bool = False) -> list[bytes]:
    """The payloads framed in ``data`` (the bytes of the file ``path``, named in errors)."""
    crc = google_crc32c.value
    stored_crc_at = _CRC.unpack_from
    size = len(data)
    payloads: list[bytes] = []
    append = payloads.append
    verified_headers: dict[bytes, int] = {}  # header bytes -> payload length
    offset = 0
    while offset < size:
        header = data[offset : offset + _HEADER_SIZE]
        length = verified_headers.get(header)
        if length is None:
            length = _checked_length(header, path, offset, allow_partial_tail)
            if length is None:
                break
            verified_headers[header] = length
        start = offset + _HEADER_SIZE
        end = start + length
        if end + _FOOTER_SIZE > size:
            if allow_partial_tail:
                break
            raise EventFileError(
                path,
                offset,
                f"record cut short: a {length}-byte payload and its CRC need "
                f"{length + _FOOTER_SIZE} bytes, {size - start} remain ({_TRUNCATED})",
            )
        payload = data[start:end]
        computed = crc(payload)
        masked = (((computed >> 15) | (computed << 17)) + _MASK_DELTA) & _U32
        if masked != stored_crc_at(data, end)[0]:
            raise EventFileError(path, offset, f"payload CRC mismatch ({_CORRUPT})")
        append(payload)
        offset = end + _FOOTER_SIZE
    return payloads


def record_offset(payloads: list[bytes], index: int) -> int:
    """The byte offset of record ``index`` in a file that :func:`split_records` read whole."""
    return sum(_HEADER_SIZE + len(payload) + _FOOTER_SIZE for payload in payloads[:index])


def _checked_length(header: bytes, path: str, offset: int, allow_partial_tail: bool) -> int | None:
    """The payload length a header announces, after checking the header's own CRC.

    ``None`` means a header cut short at the end of the file that ``allow_partial_tail``
    lets the caller ignore.
    """
    if len(header) < _HEADER_SIZE:
        if allow_partial_tail:
            return None
        raise EventFileError(
            path,
            offset,
            f"record header cut short: {len(header)} of {_HEADER_SIZE} bytes ({_TRUNCATED})",
        )
    length, stored = _HEADER.unpack(header)
    if masked_crc32c(header[:8]) != stored:
        raise EventFileError(path, offset, f"length CRC mismatch ({_CORRUPT})")
    return length
