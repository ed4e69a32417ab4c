"""The TFRecord framing reader on files written by TensorBoard's own EventFileWriter."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as reference_crc
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.summary.writer.record_writer import RecordWriter

from miles_amd.evidence.tensorboard import EventFileError, masked_crc32c, read_records, split_records


def write_events(directory: Path, steps: int = 5) -> Path:
    """An event file written by TensorBoard's EventFileWriter: file_version + ``steps`` events."""
    writer = EventFileWriter(str(directory))
    for step in range(steps):
        value = Summary.Value(tag="train/loss", simple_value=0.5 + step)
        writer.add_event(Event(wall_time=1.0 + step, step=step, summary=Summary(value=[value])))
    writer.close()
    (path,) = directory.glob("events.out.tfevents.*")
    return path


def record_offsets(data: bytes) -> list[int]:
    """Where each record starts, by walking the lengths (no CRC checks)."""
    offsets, offset = [], 0
    while offset < len(data):
        offsets.append(offset)
        (length,) = struct.unpack_from("<Q", data, offset)
        offset += 12 + length + 4
    return offsets


@pytest.fixture
def event_file(tmp_path: Path) -> Path:
    return write_events(tmp_path)


def test_reads_every_record_the_real_writer_wrote(event_file: Path) -> None:
    payloads = read_records(event_file)
    events = [Event.FromString(payload) for payload in payloads]
    assert events[0].file_version == "brain.Event:2"
    assert [event.step for event in events[1:]] == [0, 1, 2, 3, 4]
    assert [event.summary.value[0].simple_value for event in events[1:]] == [
        0.5,
        1.5,
        2.5,
        3.5,
        4.5,
    ]


@given(st.binary(max_size=300))
def test_masked_crc_matches_tensorboards_reference(data: bytes) -> None:
    assert masked_crc32c(data) == reference_crc(data)


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_flipped_payload_byte_is_a_named_error_at_its_record(event_file: Path) -> None:
    third = record_offsets(event_file.read_bytes())[2]
    flip(event_file, third + 12 + 3)
    with pytest.raises(EventFileError) as caught:
        read_records(event_file)
    error = caught.value
    assert (error.path, error.offset) == (str(event_file), third)
    assert error.reason.startswith("payload CRC mismatch")
    assert str(error) == (
        f"{event_file}: offset {third}: payload CRC mismatch "
        "(corrupt event file; re-copy it or rerun)"
    )


def test_a_flipped_length_byte_is_a_length_crc_error(event_file: Path) -> None:
    second = record_offsets(event_file.read_bytes())[1]
    flip(event_file, second + 1)
    with pytest.raises(EventFileError, match="length CRC mismatch") as caught:
        read_records(event_file)
    assert caught.value.offset == second


def test_a_flipped_stored_crc_is_a_payload_crc_error(event_file: Path) -> None:
    data = event_file.read_bytes()
    last = record_offsets(data)[-1]
    flip(event_file, len(data) - 2)
    with pytest.raises(EventFileError, match="payload CRC mismatch") as caught:
        read_records(event_file)
    assert caught.value.offset == last


def test_a_cut_payload_is_truncation_unless_reading_live(event_file: Path) -> None:
    data = event_file.read_bytes()
    last = record_offsets(data)[-1]
    event_file.write_bytes(data[: last + 12 + 5])
    with pytest.raises(EventFileError, match=r"record cut short.*truncated event file") as caught:
        read_records(event_file)
    assert caught.value.offset == last
    assert len(read_records(event_file, allow_partial_tail=True)) == 5  # version + 4 of 5


def test_a_cut_header_is_truncation_unless_reading_live(event_file: Path) -> None:
    data = event_file.read_bytes()
    event_file.write_bytes(data + data[:7])
    with pytest.raises(EventFileError, match="record header cut short: 7 of 12 bytes"):
        read_records(event_file)
    assert len(read_records(event_file, allow_partial_tail=True)) == 6


def test_live_reading_still_rejects_corruption(event_file: Path) -> None:
    data = event_file.read_bytes()
    first = record_offsets(data)[1]
    flip(event_file, first + 12)
    event_file.write_bytes(event_file.read_bytes()[:-3])  # and a partial tail
    with pytest.raises(EventFileError, match="payload CRC mismatch"):
        read_records(event_file, allow_partial_tail=True)


def test_an_empty_file_has_no_records(tmp_path: Path) -> None:
    empty = tmp_path / "events.out.tfevents.0.host"
    empty.write_bytes(b"")
    assert read_records(empty) == []


@settings(max_examples=60)
@given(st.data())
def test_every_cut_is_named_strictly_and_tolerated_live(data: st.DataObject) -> None:
    """Cut a valid stream anywhere: strict reading fails unless the cut is on a record
    boundary; live reading returns exactly the records completed before the cut."""
    payloads = [bytes([n]) * n for n in (0, 1, 7, 30)]
    buffer = io.BytesIO()
    writer = RecordWriter(buffer)  # TensorBoard's own framing
    for payload in payloads:
        writer.write(payload)
    stream = buffer.getvalue()
    boundaries = [*record_offsets(stream), len(stream)]
    cut = data.draw(st.integers(min_value=0, max_value=len(stream)))
    complete = sum(1 for end in boundaries[1:] if end <= cut)
    assert split_records(stream[:cut], "s", allow_partial_tail=True) == payloads[:complete]
    if cut in boundaries:
        assert split_records(stream[:cut], "s") == payloads[:complete]
    else:
        with pytest.raises(EventFileError, match="cut short"):
            split_records(stream[:cut], "s")
