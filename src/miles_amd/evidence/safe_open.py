"""Open a run directory's files as untrusted input: regular files inside it, of bounded size.

- A regular file only: a device, FIFO or socket is refused before it is opened, and the
  opened descriptor is checked again (``fstat``), so a swap in between is caught.
- Inside ``root`` (the run dir): no symbolic link below ``root`` is followed, in or out;
  ``root`` itself may be a link. A hard link is read like any file.
- At most its cap (:class:`Limit`, per kind of file), and the bytes it had when opened.

A refusal is a :class:`RefusedFile` naming the file and the reason (``load`` decides what it
means for the run); ``FileNotFoundError`` means absent. Why each rule, and the flags used:
``docs/cli.md`` ("How the gate reads a run dir").
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, NoReturn

_MIB = 1 << 20


@dataclass(frozen=True)
class Limit:
    """The largest file of one kind a reader accepts, and why that size."""

    kind: str
    cap: int  # bytes
    why: str


EVENT_FILE = Limit(
    "event file",
    256 * _MIB,
    "read whole, so memory is a few times this: ~5 million scalars at 54 bytes each, 30x "
    "the 8 MB of event files a 1000-rollout x 150-tag run writes (benchmarks/bench_gate.py)",
)
RECORD_FILE = Limit(
    "CI-history record file",
    64 * _MIB,
    "read whole; miles rewrites it on every log call and it holds the 5 captured keys: "
    "108 kB for 1000 rollouts",
)
JOB_LOG = Limit(
    "job log",
    8 << 30,
    "streamed in bounded memory, so the cap bounds time only: 10-12 s of CPU per GiB "
    "(benchmarks/bench_log.py), ~1.5 min at the cap; 8x a 1000-rollout log as estimated "
    "from SGLang's decode-batch logging (~0.5 GiB, not measured on a node)",
)
JOB_JSON = Limit("job.json", _MIB, "the driver writes a few hundred bytes")
ENV_JSON = Limit("env.json", _MIB, "the preflight writes a few kilobytes")
PLAN_JSON = Limit("plan.json", _MIB, "the driver writes a few kilobytes")
CANARY_JSON = Limit(
    "canary.json", _MIB, "miles-amd canary writes ~40 kB for the node plan's 58 sizes, all red"
)


class RefusedFile(Exception):
    """A file of the run dir that is not read: not a regular file, a link, or over its cap."""

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
)


def open_regular(
    path: str | os.PathLike[str], limit: Limit, *, root: str | os.PathLike[str] | None = None
) -> tuple[BinaryIO, int]:
    """``(binary handle, size)`` of the regular file ``path`` inside ``root`` (default its
    parent); read at most ``size`` bytes. :class:`RefusedFile`, ``FileNotFoundError``."""
    base, parts = _split(path, root)
    if not parts:
        raise RefusedFile(str(base), "is the directory itself, not a file")
    parent = _open_dir(base, parts[:-1])
    try:
        fd = _open_file(parent, base, parts)
    finally:
        os.close(parent)
    size = os.fstat(fd).st_size
    if size > limit.cap:
        os.close(fd)
        raise RefusedFile(
            _shown(base, parts),
            f"is {size:,} bytes, over the {limit.kind} cap of {limit.cap:,} bytes "
            f"({limit.why}); this is not a file the run wrote",
        )
    return os.fdopen(fd, "rb"), size


def read_regular(
    path: str | os.PathLike[str], limit: Limit, *, root: str | os.PathLike[str] | None = None
) -> bytes:
    """The bytes of the regular file ``path`` inside ``root`` (see :func:`open_regular`)."""
    handle, size = open_regular(path, limit, root=root)
    with handle:
        return handle.read(size)


def regular_files(
    directory: str | os.PathLike[str],
    keep: Callable[[str], bool],
    *,
    recursive: bool,
    root: str | os.PathLike[str] | None = None,
    max_files: int | None = None,
) -> list[Path]:
    """The files under ``directory`` (inside ``root``, default ``directory``) whose names
    ``keep`` accepts, by directory, then name.

    Refused (:class:`RefusedFile`): a kept name that is not a regular file, every link when
    ``recursive``, and more than ``max_files`` files (as the listing passes the bound).
    """
    base, top = _split(directory, directory if root is None else root)
    found: list[PurePosixPath] = []
    pending = [top]
    while pending:
        parts = pending.pop()
        fd = _open_dir(base, parts)
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    child = (*parts, entry.name)
                    if recursive and entry.is_dir(follow_symlinks=False):
                        pending.append(child)
                    elif keep(entry.name) or (recursive and entry.is_symlink()):
                        if not entry.is_file(follow_symlinks=False):
                            info = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
                            _refuse_entry(base, child, info)
                        found.append(PurePosixPath(*child))
                        if max_files is not None and len(found) > max_files:
                            raise RefusedFile(
                                os.fspath(directory),
                                f"holds more than {max_files} such files; this is not a "
                                "directory the run wrote",
                            )
        finally:
            os.close(fd)
    found.sort(key=lambda path: (path.parent, path.name))
    return [Path(base, path) for path in found]


def _split(
    path: str | os.PathLike[str], root: str | os.PathLike[str] | None
) -> tuple[Path, tuple[str, ...]]:
    """``(root, components of path below root)``; ValueError if path is not below root."""
    target = Path(path)
    base = target.parent if root is None else Path(root)
    parts = target.relative_to(base).parts
    if ".." in parts:
        raise ValueError(f"{target} leaves {base}")
    return base, parts


def _open_dir(base: Path, parts: tuple[str, ...]) -> int:
    """A descriptor of ``base/parts...``: ``base`` as named, each part without following."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    for depth, name in enumerate(parts, start=1):
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError as error:
            try:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    if not stat.S_ISREG(info.st_mode):
                        _refuse_entry(base, parts[:depth], info)
                raise
            finally:
                os.close(fd)
        os.close(fd)
        fd = child
    return fd


def _open_file(parent: int, base: Path, parts: tuple[str, ...]) -> int:
    """Open the last of ``parts`` in ``parent``: refused unless a regular file."""
    name = parts[-1]
    before = os.stat(name, dir_fd=parent, follow_symlinks=False)
    if not stat.S_ISREG(before.st_mode):
        _refuse_entry(base, parts, before)
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=parent)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        _refuse_entry(base, parts, os.stat(name, dir_fd=parent, follow_symlinks=False))
    after = os.fstat(fd)
    if not stat.S_ISREG(after.st_mode):
        os.close(fd)
        _refuse_entry(base, parts, after)
    return fd


def _refuse_entry(base: Path, parts: tuple[str, ...], info: os.stat_result) -> NoReturn:
    shown = _shown(base, parts)
    if stat.S_ISLNK(info.st_mode):
        where = "inside" if _link_stays_inside(base, parts) else "outside"
        raise RefusedFile(
            shown,
            f"is a symbolic link to a path {where} the run directory (links are not "
            "followed in a run dir: put the file itself there)",
        )
    kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
    raise RefusedFile(shown, f"is {kind}, not a regular file; a run dir holds regular files only")


def _link_stays_inside(base: Path, parts: tuple[str, ...]) -> bool:
    """Whether the link ``base/parts`` resolves inside ``base`` (for the message only)."""
    real_base = os.path.realpath(base)
    real = os.path.realpath(Path(base, *parts))
    return real == real_base or real.startswith(real_base + os.sep)


def _shown(base: Path, parts: tuple[str, ...]) -> str:
    return str(Path(base, *parts))
