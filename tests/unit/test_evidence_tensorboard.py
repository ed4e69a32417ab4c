"""TensorBoard event files read strictly: the TFRecord framing and the scalars, on files the
real writers produced."""

from __future__ import annotations

import io
import math
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import (
    DATA_CLASS_SCALAR,
    HistogramProto,
    Summary,
    SummaryMetadata,
)
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.compat.proto.types_pb2 import DT_DOUBLE, DT_FLOAT, DT_STRING
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as reference_crc
from tensorboard.summary import Writer
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.summary.writer.record_writer import RecordWriter

from miles_amd.evidence.tensorboard import (
    EventFileError,
    find_event_files,
    masked_crc32c,
    read_records,
    read_tensorboard_dir,
    split_records,
)

SCALARS_METADATA = SummaryMetadata(
    plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"), data_class=DATA_CLASS_SCALAR
)


def write_events(directory: Path, events: list[Event]) -> Path:
    writer = EventFileWriter(str(directory))
    for event in events:
        writer.add_event(event)
    writer.close()
    return max(directory.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime_ns)


def simple(tag: str, step: int, value: float) -> Event:
    """torch's SummaryWriter form: one Event per scalar, ``simple_value``."""
    return Event(step=step, summary=Summary(value=[Summary.Value(tag=tag, simple_value=value)]))


def scalar_tensor(value: float, dtype: int = DT_FLOAT) -> TensorProto:
    field = "float_val" if dtype == DT_FLOAT else "double_val"
    return TensorProto(dtype=dtype, tensor_shape=TensorShapeProto(), **{field: [value]})


def offsets(data: bytes) -> list[int]:
    """Where each record starts, by walking the lengths (no CRC checks)."""
    found, at = [], 0
    while at < len(data):
        found.append(at)
        at += 12 + struct.unpack_from("<Q", data, at)[0] + 4
    return found


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]


def test_reads_every_record_the_real_writer_wrote_with_tensorboards_crc(tmp_path: Path) -> None:
    path = write_events(tmp_path, [simple("train/loss", s, 0.5 + s) for s in range(5)])
    events = [Event.FromString(payload) for payload in read_records(path)]
    assert events[0].file_version == "brain.Event:2"
    assert [(e.step, e.summary.value[0].simple_value) for e in events[1:]] == [
        (s, 0.5 + s) for s in range(5)
    ]
    assert all(masked_crc32c(b) == reference_crc(b) for b in (b"", b"x", bytes(range(256))))
    path.write_bytes(b"")
    assert read_records(path) == []


# damage to a file of 6 records (version + 5 events): (change, record named, reason, records
# read live; None: live reading fails too)
DAMAGE = {
    "payload byte": (lambda d, o: flip(d, o[2] + 15), 2, "payload CRC mismatch", None),
    "length byte": (lambda d, o: flip(d, o[1] + 1), 1, "length CRC mismatch", None),
    "stored CRC": (lambda d, o: flip(d, len(d) - 2), 5, "payload CRC mismatch", None),
    "cut payload": (lambda d, o: d[: o[5] + 17], 5, r"record cut short.*truncated event", 5),
    "cut header": (lambda d, o: d + d[:7], 6, "record header cut short: 7 of 12 bytes", 6),
    "flip, cut tail": (lambda d, o: flip(d, o[1] + 12)[:-3], 1, "payload CRC mismatch", None),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_damage_is_named_at_its_record_and_live_reading_drops_only_a_cut(
    tmp_path: Path, damage: str
) -> None:
    change, record, reason, live = DAMAGE[damage]
    path = write_events(tmp_path, [simple("train/loss", s, 0.5 + s) for s in range(5)])
    data = path.read_bytes()
    starts = [*offsets(data), len(data)]
    path.write_bytes(change(data, starts))
    with pytest.raises(EventFileError, match=reason) as caught:
        read_records(path)
    assert (caught.value.path, caught.value.offset) == (str(path), starts[record])
    if damage == "payload byte":
        assert str(caught.value) == (
            f"{path}: offset {starts[2]}: payload CRC mismatch "
            "(corrupt event file; re-copy it or rerun)"
        )
    if live is None:
        with pytest.raises(EventFileError, match=reason):
            read_records(path, allow_partial_tail=True)
    else:
        assert len(read_records(path, allow_partial_tail=True)) == live


@settings(max_examples=60)
@given(st.data())
def test_every_cut_is_named_strictly_and_tolerated_live(data: st.DataObject) -> None:
    """Strict reading fails unless a cut is on a record boundary; live reading returns the
    records completed before it, at their offsets."""
    payloads = [bytes([n]) * n for n in (0, 1, 7, 30)]
    buffer = io.BytesIO()
    writer = RecordWriter(buffer)  # TensorBoard's own framing
    for payload in payloads:
        writer.write(payload)
    stream = buffer.getvalue()
    boundaries = [*offsets(stream), len(stream)]
    cut = data.draw(st.integers(min_value=0, max_value=len(stream)))
    complete = sum(1 for end in boundaries[1:] if end <= cut)
    expected = list(zip(boundaries, payloads[:complete], strict=False))
    assert split_records(stream[:cut], "s", True) == expected
    if cut in boundaries:
        assert split_records(stream[:cut], "s") == expected
    else:
        with pytest.raises(EventFileError, match="cut short"):
            split_records(stream[:cut], "s")


def test_both_scalar_encodings_across_subdirectories_sorted_stably_with_duplicates(
    tmp_path: Path,
) -> None:
    writer = Writer(str(tmp_path / "writer"))  # tensorboard.summary: scalars-plugin tensors
    for step, value in enumerate([0.1, 0.0, math.nan, -math.inf, 1e-30]):
        writer.add_scalar("train/loss", value, step)
    writer.close()
    # within a directory, name order is write order (10-digit time in the name)
    write_events(tmp_path / "a", [simple("m", 2, 2.0), simple("m", 0, 0.0), simple("m", 1, 1.0)])
    write_events(tmp_path / "b" / "c", [simple("m", 1, 1.5), simple("n", 5, math.inf)])
    series = read_tensorboard_dir(tmp_path)
    assert series["m"] == ((0, 0.0), (1, 1.0), (1, 1.5), (2, 2.0))
    assert series["n"] == ((5, math.inf),)
    loss = series["train/loss"]
    assert [step for step, _ in loss] == [0, 1, 2, 3, 4]
    assert loss[0][1] == float(np.float32(0.1)) and loss[1][1] == 0.0 and math.isnan(loss[2][1])
    assert loss[3][1] == -math.inf and loss[4][1] == float(np.float32(1e-30))
    assert all(type(step) is int and type(value) is float for step, value in loss)


def test_only_scalars_are_series_and_metadata_given_once_covers_later_values(
    tmp_path: Path,
) -> None:
    """TensorFlow's summary ops attach the plugin metadata to a tag's first value only; a
    histogram, a text tensor and a tensor without scalar metadata are not series."""
    text_metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
    text = TensorProto(dtype=DT_STRING, tensor_shape=TensorShapeProto(), string_val=[b"hi"])
    content = TensorProto(
        dtype=DT_DOUBLE, tensor_shape=TensorShapeProto(), tensor_content=struct.pack("<d", 0.1)
    )
    values = [
        Summary.Value(tag="h", histo=HistogramProto()),
        Summary.Value(tag="t", tensor=text, metadata=text_metadata),
        Summary.Value(tag="u", tensor=scalar_tensor(3.0)),
        Summary.Value(tag="k", tensor=scalar_tensor(0.5), metadata=SCALARS_METADATA),
        Summary.Value(tag="c", tensor=content, metadata=SCALARS_METADATA),
    ]
    later = Summary.Value(tag="k", tensor=scalar_tensor(0.75, DT_DOUBLE))
    write_events(
        tmp_path,
        [
            Event(step=1, summary=Summary(value=values)),
            Event(step=2, summary=Summary(value=[later])),
        ],
    )
    assert read_tensorboard_dir(tmp_path) == {"c": ((1, 0.1),), "k": ((1, 0.5), (2, 0.75))}


@pytest.mark.parametrize(
    ("tensor", "reason"),
    [
        (
            TensorProto(dtype=DT_STRING, tensor_shape=TensorShapeProto(), string_val=[b"x"]),
            "dtype DT_STRING",
        ),
        (
            TensorProto(
                dtype=DT_FLOAT,
                tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=2)]),
                float_val=[1.0, 2.0],
            ),
            r"shape \[2\]",
        ),
        (TensorProto(dtype=DT_FLOAT, tensor_shape=TensorShapeProto()), "holds 0 values"),
        (
            TensorProto(dtype=DT_DOUBLE, tensor_shape=TensorShapeProto(), tensor_content=b"123"),
            "tensor_content has 3 bytes",
        ),
    ],
)
def test_a_malformed_scalar_tensor_is_a_named_error(
    tmp_path: Path, tensor: TensorProto, reason: str
) -> None:
    value = Summary.Value(tag="bad/tag", tensor=tensor, metadata=SCALARS_METADATA)
    path = write_events(tmp_path, [Event(step=3, summary=Summary(value=[value]))])
    with pytest.raises(EventFileError, match=f"tag 'bad/tag': .*{reason}") as caught:
        read_tensorboard_dir(tmp_path)
    assert caught.value.path == str(path)


def test_a_framed_payload_that_is_no_event_is_named_at_its_offset(tmp_path: Path) -> None:
    """(A truncated directory, strict and live: test_evidence_load.)"""
    path = write_events(tmp_path, [])
    garbage = b"\x12\xff\xff\xff\xff"  # valid CRCs; a length-delimited field past the payload
    header = struct.pack("<Q", len(garbage))
    crcs = (masked_crc32c(header), masked_crc32c(garbage))
    path.write_bytes(header + struct.pack("<I", crcs[0]) + garbage + struct.pack("<I", crcs[1]))
    with pytest.raises(EventFileError, match="not a TensorBoard Event") as caught:
        read_tensorboard_dir(tmp_path)
    assert caught.value.offset == 0


def test_no_scalars_give_an_empty_map_and_no_directory_is_not_found(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not an event file")
    assert read_tensorboard_dir(tmp_path) == {}
    write_events(tmp_path, [])  # only the file_version event
    assert len(find_event_files(tmp_path)) == 1
    assert read_tensorboard_dir(tmp_path) == {}
    with pytest.raises(FileNotFoundError, match="absent"):
        read_tensorboard_dir(tmp_path / "absent")
    with pytest.raises(NotADirectoryError, match=r"notes\.txt"):
        read_tensorboard_dir(tmp_path / "notes.txt")


def reference_scalars(directory: Path) -> dict[str, tuple[tuple[int, float], ...]]:
    """A plain record-by-record decoding with the shipped Event class, for comparison."""
    points: dict[str, list[tuple[int, float]]] = {}
    for path in find_event_files(directory):
        for payload in read_records(path):
            event = Event.FromString(payload)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    number = value.simple_value
                elif value.HasField("tensor") and value.metadata.plugin_data.plugin_name:
                    number = value.tensor.float_val[0]
                else:
                    continue
                points.setdefault(value.tag, []).append((event.step, number))
    return {tag: tuple(sorted(p, key=lambda point: point[0])) for tag, p in sorted(points.items())}


summary_values = st.one_of(
    st.builds(
        lambda tag, number: Summary.Value(tag=tag, simple_value=number),
        st.sampled_from(["a", "b/c", ""]),
        st.floats(width=32),
    ),
    st.builds(
        lambda number: Summary.Value(
            tag="t", tensor=scalar_tensor(number), metadata=SCALARS_METADATA
        ),
        st.floats(width=32),
    ),
    st.just(Summary.Value(tag="h", histo=HistogramProto())),
)
events = st.lists(
    st.builds(
        lambda step, values: Event(step=step, summary=Summary(value=values)),
        st.sampled_from([0, 1, 2, -1, 2**40]),
        st.lists(summary_values, max_size=3),
    ),
    max_size=12,
)


@settings(max_examples=25, deadline=None)
@given(events)
def test_any_mix_of_events_reads_as_a_plain_decoding(batch: list[Event]) -> None:
    """Values, empty tags, zero and negative steps, events without values: read exactly as a
    plain decoding does."""
    with tempfile.TemporaryDirectory() as directory:
        write_events(Path(directory), batch)
        got = read_tensorboard_dir(directory)
        expected = reference_scalars(Path(directory))
    assert list(got) == list(expected)
    for tag, series in expected.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in series]
        assert all(
            a == b or (math.isnan(a) and math.isnan(b))
            for (_, a), (_, b) in zip(got[tag], series, strict=True)
        )
