"""TensorBoard scalars read strictly from files the real writers produced."""

from __future__ import annotations

import math
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tensorboard.backend.event_processing import event_accumulator
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
from tensorboard.summary import Writer
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from miles_amd.evidence.tensorboard import find_event_files, read_tensorboard_dir
from miles_amd.evidence.tensorboard import EventFileError, masked_crc32c, read_records


def f32(value: float) -> float:
    """What a float32 field gives back for ``value``."""
    return float(np.float32(value))


def write_simple_values(directory: Path, points: list[tuple[str, int, float]]) -> Path:
    """torch's SummaryWriter form: one Event per scalar with Summary.Value(simple_value=...)."""
    writer = EventFileWriter(str(directory))
    for tag, step, value in points:
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
        writer.add_event(Event(wall_time=1.7e9, step=step, summary=summary))
    writer.close()
    return newest_event_file(directory)


def write_events(directory: Path, events: list[Event]) -> Path:
    writer = EventFileWriter(str(directory))
    for event in events:
        writer.add_event(event)
    writer.close()
    return newest_event_file(directory)


def newest_event_file(directory: Path) -> Path:
    return max(directory.glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime_ns)


def scalar_tensor(value: float, dtype: int = DT_FLOAT) -> TensorProto:
    field = "float_val" if dtype == DT_FLOAT else "double_val"
    return TensorProto(dtype=dtype, tensor_shape=TensorShapeProto(), **{field: [value]})


SCALARS_METADATA = SummaryMetadata(
    plugin_data=SummaryMetadata.PluginData(plugin_name="scalars"),
    data_class=DATA_CLASS_SCALAR,
)


def test_tensor_scalars_of_tensorboard_summary_writer(tmp_path: Path) -> None:
    writer = Writer(str(tmp_path))
    for step, value in enumerate([0.1, 0.0, math.nan, -math.inf, 1e-30]):
        writer.add_scalar("train/loss", value, step)
    writer.add_scalar("rollout/raw_reward", 0.5625, 0)
    writer.close()

    series = read_tensorboard_dir(tmp_path)

    assert series["rollout/raw_reward"] == ((0, 0.5625),)
    loss = series["train/loss"]
    assert [step for step, _ in loss] == [0, 1, 2, 3, 4]
    assert loss[0][1] == f32(0.1) and loss[1][1] == 0.0 and math.isnan(loss[2][1])
    assert loss[3][1] == -math.inf and loss[4][1] == f32(1e-30)
    assert all(type(step) is int and type(value) is float for step, value in loss)


def test_simple_values_of_the_torch_form(tmp_path: Path) -> None:
    write_simple_values(
        tmp_path,
        [("train/grad_norm", 0, 0.25), ("train/grad_norm", 1, 0.0), ("perf/x", 7, math.inf)],
    )
    assert read_tensorboard_dir(tmp_path) == {
        "perf/x": ((7, math.inf),),
        "train/grad_norm": ((0, 0.25), (1, 0.0)),
    }


def test_files_in_subdirectories_merge_by_tag_sorted_stably_with_duplicates(
    tmp_path: Path,
) -> None:
    write_simple_values(tmp_path / "a", [("m", 2, 2.0), ("m", 0, 0.0), ("m", 1, 1.0)])
    write_simple_values(tmp_path / "b" / "c", [("m", 1, 1.5), ("n", 5, 5.0)])
    # Within a directory, path order is write order (10-digit time in the name).
    assert read_tensorboard_dir(tmp_path) == {
        "m": ((0, 0.0), (1, 1.0), (1, 1.5), (2, 2.0)),
        "n": ((5, 5.0),),
    }


def test_agrees_with_event_accumulator_on_an_intact_run(tmp_path: Path) -> None:
    write_simple_values(tmp_path, [(f"train/m{i % 3}", i, i / 7) for i in range(30)])
    accumulator = event_accumulator.EventAccumulator(
        str(tmp_path), size_guidance={event_accumulator.SCALARS: 0}
    )
    accumulator.Reload()
    expected = {
        tag: tuple((e.step, e.value) for e in accumulator.Scalars(tag))
        for tag in accumulator.Tags()[event_accumulator.SCALARS]
    }
    assert read_tensorboard_dir(tmp_path) == expected


def test_non_scalar_summaries_are_not_series(tmp_path: Path) -> None:
    text_metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
    text = TensorProto(dtype=DT_STRING, tensor_shape=TensorShapeProto(), string_val=[b"hi"])
    write_events(
        tmp_path,
        [
            Event(step=1, summary=Summary(value=[Summary.Value(tag="h", histo=HistogramProto())])),
            Event(
                step=1,
                summary=Summary(
                    value=[Summary.Value(tag="t", tensor=text, metadata=text_metadata)]
                ),
            ),
            Event(
                step=1, summary=Summary(value=[Summary.Value(tag="u", tensor=scalar_tensor(3.0))])
            ),
            Event(step=1, summary=Summary(value=[Summary.Value(tag="s", simple_value=1.0)])),
        ],
    )
    assert read_tensorboard_dir(tmp_path) == {"s": ((1, 1.0),)}


def test_scalar_metadata_given_once_covers_the_tags_later_values(tmp_path: Path) -> None:
    """TensorFlow's summary ops attach the plugin metadata to a tag's first value only."""
    first = Summary.Value(tag="k", tensor=scalar_tensor(0.5), metadata=SCALARS_METADATA)
    later = Summary.Value(tag="k", tensor=scalar_tensor(0.75, DT_DOUBLE))
    write_events(
        tmp_path,
        [
            Event(step=0, summary=Summary(value=[first])),
            Event(step=1, summary=Summary(value=[later])),
        ],
    )
    assert read_tensorboard_dir(tmp_path) == {"k": ((0, 0.5), (1, 0.75))}


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


def test_tensor_content_encoding_reads(tmp_path: Path) -> None:
    tensor = TensorProto(
        dtype=DT_DOUBLE, tensor_shape=TensorShapeProto(), tensor_content=struct.pack("<d", 0.1)
    )
    value = Summary.Value(tag="c", tensor=tensor, metadata=SCALARS_METADATA)
    write_events(tmp_path, [Event(step=2, summary=Summary(value=[value]))])
    assert read_tensorboard_dir(tmp_path) == {"c": ((2, 0.1),)}


def test_a_corrupted_event_file_names_file_and_offset(tmp_path: Path) -> None:
    path = write_simple_values(tmp_path, [("m", step, float(step)) for step in range(200)])
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(EventFileError, match="CRC mismatch") as caught:
        read_tensorboard_dir(tmp_path)
    assert caught.value.path == str(path) and 0 < caught.value.offset < len(data) // 2 + 1


def test_a_truncated_event_file_is_an_error_unless_live(tmp_path: Path) -> None:
    path = write_simple_values(tmp_path, [("m", step, float(step)) for step in range(10)])
    path.write_bytes(path.read_bytes()[:-6])
    with pytest.raises(EventFileError, match="truncated"):
        read_tensorboard_dir(tmp_path)
    assert read_tensorboard_dir(tmp_path, live=True) == {
        "m": tuple((s, float(s)) for s in range(9))
    }


def test_an_undecodable_payload_with_valid_crcs_is_named(tmp_path: Path) -> None:
    garbage = b"\x12\xff\xff\xff\xff"  # a length-delimited field running past the payload
    header = struct.pack("<Q", len(garbage))
    record = (
        header
        + struct.pack("<I", masked_crc32c(header))
        + garbage
        + struct.pack("<I", masked_crc32c(garbage))
    )
    path = tmp_path / "events.out.tfevents.0000000001.host.1.0"
    path.write_bytes(record)
    with pytest.raises(EventFileError, match="not a TensorBoard Event") as caught:
        read_tensorboard_dir(tmp_path)
    assert caught.value.offset == 0


def test_directories_without_scalars_give_an_empty_map(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not an event file")
    assert read_tensorboard_dir(tmp_path) == {}
    write_events(tmp_path, [])  # only the file_version event
    assert len(find_event_files(tmp_path)) == 1
    assert read_tensorboard_dir(tmp_path) == {}


def test_a_missing_directory_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such TensorBoard directory"):
        read_tensorboard_dir(tmp_path / "absent")


def reference_scalars(directory: Path) -> dict[str, tuple[tuple[int, float], ...]]:
    """A plain record-by-record decoding with the shipped Event class, for comparison."""
    points: dict[str, list[tuple[int, float]]] = {}
    for path in find_event_files(directory):
        for payload in read_records(path):
            event = Event.FromString(payload)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    number = value.simple_value
                elif (
                    value.HasField("tensor") and value.metadata.plugin_data.plugin_name == "scalars"
                ):
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
    """Any mix of values, empty tags, zero and negative steps and events without values
    reads exactly as a plain decoding does."""
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
