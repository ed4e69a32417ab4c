"""The pull-back's client side on real files: frames parsed, applied, verified or refused."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from miles_amd.run.pullback import END, ERROR, FRAME, Frame, PullError, apply_frame, parse_frames

pytestmark = pytest.mark.unit


def frame_line(path: str, content: bytes, offset: int = 0) -> str:
    raw = {
        "path": path,
        "size": len(content),
        "sha256": hashlib.sha256(content).hexdigest(),
        "offset": offset,
        "data": base64.b64encode(content[offset:]).decode(),
    }
    return FRAME + json.dumps(raw)


def frame(path: str, content: bytes, offset: int = 0) -> Frame:
    (parsed,) = parse_frames(frame_line(path, content, offset) + "\n" + END + '{"files": 1}')
    return parsed


def test_frames_need_the_end_marker_and_its_count() -> None:
    line = frame_line("tensorboard/e", b"abc")
    assert len(parse_frames(f"noise\n{line}\n{END}" + '{"files": 1}\n')) == 1
    with pytest.raises(PullError, match="no end marker after 1"):
        parse_frames(line)
    with pytest.raises(PullError, match="1 of 2 file frame"):
        parse_frames(f"{line}\n{END}" + '{"files": 2}')
    with pytest.raises(PullError, match="node gone"):
        parse_frames(ERROR + '{"reason": "node gone"}')


def test_incremental_frames_append_and_an_empty_file_arrives(tmp_path: Path) -> None:
    apply_frame(tmp_path, frame("ci_history/x.jsonl", b"line1\n"))
    apply_frame(tmp_path, frame("ci_history/x.jsonl", b"line1\nline2\n", offset=6))
    assert (tmp_path / "ci_history/x.jsonl").read_bytes() == b"line1\nline2\n"
    apply_frame(tmp_path, frame("ci_history/driver.jsonl", b""))  # miles' 0-byte record
    assert (tmp_path / "ci_history/driver.jsonl").read_bytes() == b""


def test_truncated_or_corrupt_transfer_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    good = frame("tensorboard/e", b"0123456789")
    cut = Frame(good.path, good.size, good.sha256, 0, good.data[:7])
    with pytest.raises(PullError, match="truncated: 7 of 10 bytes"):
        apply_frame(tmp_path, cut)
    flipped = Frame(good.path, good.size, good.sha256, 0, b"0123456780")
    with pytest.raises(PullError, match="sha256"):
        apply_frame(tmp_path, flipped)
    assert not (tmp_path / "tensorboard/e").exists()


def test_paths_outside_the_evidence_dirs_are_refused(tmp_path: Path) -> None:
    for path in ("../x", "/etc/passwd", "job.json", "tensorboard/../../x"):
        with pytest.raises(PullError, match="refused path"):
            apply_frame(tmp_path, frame(path, b"x"))
