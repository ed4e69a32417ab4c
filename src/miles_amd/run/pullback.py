"""Bring a cluster job's evidence from its node into the local run dir, every frame checked; a
failed final pull empties the evidence dirs and records why. ``docs/cluster.md`` ("How the
pull-back works").
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import re
import shlex
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from miles_amd import strict_json
from miles_amd.files import (
    EVENT_FILE,
    RECORD_FILE,
    RefusedFile,
    atomic_write_bytes,
    atomic_write_text,
    read_regular,
)
from miles_amd.run_dir import RunDir

FRAME, END, ERROR = "MILES_AMD_PULL ", "MILES_AMD_PULL_END ", "MILES_AMD_PULL_ERROR "
SUBDIRS = ("tensorboard", "ci_history")
CAPS = {"tensorboard": EVENT_FILE, "ci_history": RECORD_FILE}  # the gate's caps, per subdir
_SHA256 = re.compile(r"[0-9a-f]{64}")
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


class PullError(RuntimeError):
    """The evidence could not be brought back intact."""


@dataclass(frozen=True)
class Frame:
    path: str
    size: int
    sha256: str
    offset: int
    data: bytes


def parse_frames(log: str) -> list[Frame]:
    """The frames of a pull job's log; :class:`PullError` for an error, a cut transfer, a
    malformed or an oversized frame."""
    frames: list[Frame] = []
    end: dict[str, Any] | None = None
    for number, line in enumerate(log.splitlines(), start=1):
        if not line.startswith((ERROR, END, FRAME)):
            continue
        try:
            if line.startswith(ERROR):
                reason = _object(line[len(ERROR) :]).get("reason")
                raise PullError(f"the node says: {reason}")
            if line.startswith(END):
                end = _object(line[len(END) :])
            else:
                frames.append(_frame(_object(line[len(FRAME) :])))
        except (ValueError, TypeError, binascii.Error) as exc:
            raise PullError(f"malformed frame at line {number} of the pull log: {exc}") from None
    if end is None:
        raise PullError(f"transfer cut: no end marker after {len(frames)} file frame(s)")
    count = end.get("files")
    if not isinstance(count, int) or isinstance(count, bool) or count != len(frames):
        raise PullError(f"transfer cut: {len(frames)} of {count!r} file frame(s) arrived")
    return frames


def _object(payload: str) -> dict[str, Any]:
    data = strict_json.loads(payload)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def _frame(raw: dict[str, Any]) -> Frame:
    path, size, offset, sha, data = (
        raw.get(k) for k in ("path", "size", "offset", "sha256", "data")
    )
    if not isinstance(path, str) or not isinstance(sha, str) or not isinstance(data, str):
        raise ValueError("path, sha256 and data must be strings")
    cap = CAPS[safe_relpath(path).parts[0]].cap
    if type(size) is not int or type(offset) is not int:  # not bool either
        raise ValueError("size and offset must be integers")
    if not 0 <= offset <= size:
        raise ValueError(f"{path}: offset {offset} outside 0..{size}")
    if size > cap:
        raise PullError(f"{path}: {size:,} bytes, over the gate's {cap:,}-byte cap for it")
    if not _SHA256.fullmatch(sha):
        raise ValueError(f"{path}: sha256 is not 64 hex digits")
    if len(data) > 4 * ((size - offset + 2) // 3):
        raise ValueError(f"{path}: more data than the {size - offset} bytes it announces")
    return Frame(path, size, sha, offset, base64.b64decode(data, validate=True))


def safe_relpath(path: str) -> Path:
    rel = Path(path)
    if rel.is_absolute() or ".." in rel.parts or not rel.parts or rel.parts[0] not in SUBDIRS:
        raise PullError(f"refused path {path!r} from the node (outside {', '.join(SUBDIRS)})")
    return rel


def apply_frame(root: Path, frame: Frame) -> None:
    """Write ``held[:offset] + frame.data`` atomically, size and sha256 verified."""
    rel = safe_relpath(frame.path)
    target = root / rel
    held: bytes | None = None
    try:
        held = read_regular(target, CAPS[rel.parts[0]], root=root)
    except FileNotFoundError:
        pass
    except (OSError, RefusedFile) as exc:
        raise PullError(f"{frame.path}: the local copy cannot be read ({exc})") from None
    have = held or b""
    if frame.offset > len(have):
        raise PullError(f"{frame.path}: node sent bytes from {frame.offset}, {len(have)} held")
    data = have[: frame.offset] + frame.data
    if len(data) != frame.size:
        raise PullError(f"{frame.path}: truncated: {len(data)} of {frame.size} bytes arrived")
    digest = hashlib.sha256(data).hexdigest()
    if digest != frame.sha256:
        raise PullError(f"{frame.path}: sha256 {digest[:12]} != node's {frame.sha256[:12]}")
    if data != held:  # an empty file arrives too (miles' 0-byte record)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, data)
        except OSError as exc:
            raise PullError(f"{frame.path}: cannot be written locally ({exc})") from None


@dataclass
class PullBack:
    """Pulls one job's node-local evidence dir into ``run_dir`` through Ray jobs."""

    client: Any  # ray.job_submission.JobSubmissionClient
    job_id: str
    node_dir: str
    run_dir: RunDir
    node_id: str | None = None
    pulls: int = 0
    held: dict[str, tuple[int, str]] = field(default_factory=dict)  # path: size, sha256

    def pull(self, timeout_s: float = 120.0) -> list[Frame]:
        node_id = self.node_id or self._job_node()
        request = {"node_id": node_id, "root": self.node_dir, "subdirs": list(SUBDIRS)}
        frames = parse_frames(self._run_pull_job({**request, "offsets": self.held}, timeout_s))
        for frame in frames:
            apply_frame(self.run_dir.root, frame)
            self.held[frame.path] = (frame.size, frame.sha256)
        for gone in set(self.held) - {frame.path for frame in frames}:
            try:  # a writer's temp file, since renamed: the local copy mirrors the node
                (self.run_dir.root / safe_relpath(gone)).unlink(missing_ok=True)
            except OSError as exc:
                raise PullError(f"{gone}: cannot be removed locally ({exc})") from None
            del self.held[gone]
        self.pulls += 1
        return frames

    def try_pull(self) -> None:  # during the run: a failure is left to the final pull
        with contextlib.suppress(PullError):
            self.pull()

    def final(self) -> str | None:
        """The complete, verified pull at the end: why it failed, or ``None``."""
        try:
            frames = self.pull()
            if not frames:
                raise PullError(f"no evidence files under {self.node_dir} on the node")
        except PullError as exc:
            reason = f"pull-back failed: {exc}"
            for sub in SUBDIRS:  # never judge partial evidence: empty dirs are a problem
                shutil.rmtree(self.run_dir.root / sub, ignore_errors=True)  # to the reader
                (self.run_dir.root / sub).mkdir()
            self._record({"status": "failed", "reason": reason})
            return reason
        files = {f.path: {"size": f.size, "sha256": f.sha256} for f in frames}
        self._record({"status": "verified", "files": files, "node_id": self.node_id})
        return None

    def _record(self, data: dict[str, object]) -> None:
        data = {**data, "job_id": self.job_id, "node_dir": self.node_dir, "pulls": self.pulls}
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
        atomic_write_text(self.run_dir.pullback_json, text)

    def _job_node(self) -> str:
        try:
            node_id = self.client.get_job_info(self.job_id).driver_node_id
        except Exception as exc:
            raise PullError(f"cannot ask the Jobs API for {self.job_id}'s node: {exc}") from None
        if not node_id:
            raise PullError(f"{self.job_id} has no node yet (not started)")
        self.node_id = node_id
        return node_id

    def _run_pull_job(self, request: Mapping[str, object], timeout_s: float) -> str:
        pull_id = f"{self.job_id}-pull-{uuid.uuid4().hex[:6]}"
        script = (Path(__file__).parents[1] / "node" / "pullback_node.py").read_text("utf-8")
        entrypoint = shlex.join(["python", "-c", script, json.dumps(request)])
        try:
            self.client.submit_job(
                entrypoint=entrypoint, submission_id=pull_id, entrypoint_num_cpus=0
            )
            deadline = time.monotonic() + timeout_s
            while (status := str(self.client.get_job_status(pull_id).value)) not in TERMINAL:
                if time.monotonic() > deadline:
                    self.client.stop_job(pull_id)
                    raise PullError(f"pull job {pull_id} not done after {timeout_s:.0f} s")
                time.sleep(0.3)
            log = str(self.client.get_job_logs(pull_id))
        except PullError:
            raise
        except Exception as exc:
            raise PullError(f"pull job {pull_id}: {exc}") from None
        if status != "SUCCEEDED" and ERROR not in log:
            tail = " | ".join(log.strip().splitlines()[-3:])
            raise PullError(f"pull job {pull_id} {status}: {tail or 'no output'}")
        return log
