"""Files written whole or not at all, and a run dir's files read as untrusted input; neither
through a link. A set is written as flushed temps renamed into place (``os.replace``) under the
directory's ``flock``; a reader gets a regular file only, inside ``root``, no link below it
followed, at most its :class:`Limit`, else a :class:`RefusedFile`. Why: ``docs/cli.md``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, NoReturn

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_MIB = 1 << 20


@dataclass(frozen=True)
class Limit:
    """The largest file of one kind a reader accepts (why each size: ``docs/cli.md``)."""

    kind: str
    cap: int  # bytes


EVENT_FILE = Limit("event file", 256 * _MIB)
RECORD_FILE = Limit("CI-history record file", 64 * _MIB)
JOB_LOG = Limit("job log", 8 << 30)
JOB_JSON = Limit("job.json", _MIB)
ENV_JSON = Limit("env.json", _MIB)
PLAN_JSON = Limit("plan.json", _MIB)
CANARY_JSON = Limit("canary.json", _MIB)


class UnsafeDir(OSError):
    """A directory to write into is a link or not a directory; ``str()`` names it and the fix."""


def atomic_write_bytes(
    path: Path, data: bytes | str, *, replace: bool = True, mode: int = 0o644
) -> None:
    """``data`` (text as UTF-8) to ``path`` whole, parents made; ``replace=False``: atomic
    ``FileExistsError`` when ``path`` exists."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    write_files(path.parent, {path.name: raw}, root=path.parent, replace=replace, mode=mode)


atomic_write_text = atomic_write_bytes


def write_files(
    out_dir: Path,
    files: Mapping[str, bytes],
    *,
    root: Path | None = None,
    replace: bool = True,
    mode: int = 0o644,
) -> None:
    """Write the set ``files`` (``name: bytes``) into ``out_dir``, created when absent: temps
    first, renamed into place under the directory's lock; ``root`` (default ``out_dir``'s
    parent) is trusted, a link or file below it ``UnsafeDir``."""
    base = root if root is not None else out_dir.parent
    parts = out_dir.relative_to(base).parts if out_dir != base else ()
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"{out_dir} is not a directory below {base}")
    for name in files:
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"{name!r} is not a file name")
    base.mkdir(parents=True, exist_ok=True)
    try:
        fd = _open_dir(base, parts, create=True)
    except _Blocked as blocked:
        kind = "a symbolic link" if stat.S_ISLNK(blocked.info.st_mode) else "not a directory"
        raise UnsafeDir(
            f"{base.joinpath(*parts[: blocked.depth])} is {kind}; files are never written "
            f"through a link or over a file: remove it, or write {out_dir.name} elsewhere"
        ) from None
    temps: dict[str, tuple[str, int]] = {}  # name: (its temp, the temp's held fd)
    try:
        for name, data in files.items():
            for entry in os.listdir(fd):  # the temps of ``name`` a killed writer left
                if abandoned(fd, entry, f".{name}", ".tmp"):
                    _unlink(fd, entry)
            temps[name] = _write_temp(fd, name, data, mode)
        hold(fd, wait=True)
        try:
            for name, (tmp, held) in list(temps.items()):
                if not replace:  # FileExistsError if it exists; the temp goes below
                    os.link(tmp, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
                    continue
                os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
                del temps[name]
                os.close(held)
        finally:
            with contextlib.suppress(OSError):  # no flock on this file system: nothing held
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        for tmp, held in temps.values():
            _unlink(fd, tmp)
            os.close(held)
        os.close(fd)


def owned_name(stem: str, suffix: str) -> str:
    """A name no other writer picks: ``<stem>.<this pid>-<random><suffix>``."""
    return f"{stem}.{os.getpid()}-{secrets.token_hex(6)}{suffix}"


def hold(fd: int, *, wait: bool = False) -> None:
    """Take the writer's lock on ``fd`` until it is closed (``wait``: wait for it);
    ``BlockingIOError`` when held. Without ``flock`` (``ENOLCK``) the pid is the only proof."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except OSError as error:
        if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP):
            raise


def abandoned(dir_fd: int, entry: str, stem: str, suffix: str) -> bool:
    """Whether ``entry`` (in ``dir_fd``) is a dead writer's :func:`owned_name` of ``stem``: its
    pid runs nowhere here and no one (a writer on another host) holds its lock."""
    found = re.fullmatch(re.escape(stem) + r"\.(\d+)-[0-9a-f]+" + re.escape(suffix), entry)
    if found is None or _running(int(found.group(1))):
        return False
    try:
        fd = os.open(entry, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        hold(fd)
    except BlockingIOError:
        return False  # its writer holds it
    finally:
        os.close(fd)  # a lock taken here goes with the descriptor
    return True


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process; a pid past the range is not ours to judge
    return True


def _write_temp(dir_fd: int, name: str, data: bytes, mode: int) -> tuple[str, int]:
    tmp = owned_name(f".{name}", ".tmp")
    fd = os.open(tmp, _TMP_FLAGS, mode, dir_fd=dir_fd)
    try:
        hold(fd)
        with open(fd, "wb", closefd=False) as handle:
            handle.write(data)
        os.fchmod(fd, mode)
        os.fsync(fd)
    except BaseException:
        _unlink(dir_fd, tmp)
        os.close(fd)
        raise
    return tmp, fd


def _unlink(dir_fd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


class RefusedFile(Exception):
    """A file of the run dir that is not read: not a regular file, a link, or over its cap."""

    def __init__(self, path: str, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


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
    parent, name = _open_run_dir(base, parts[:-1]), parts[-1]
    try:
        before = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISREG(before.st_mode):
            _refuse_entry(base, parts, before)
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=parent)
        except OSError as error:
            if error.errno != errno.ELOOP:
                raise
            _refuse_entry(base, parts, os.stat(name, dir_fd=parent, follow_symlinks=False))
    finally:
        os.close(parent)
    after = os.fstat(fd)
    if not stat.S_ISREG(after.st_mode):  # swapped since the stat
        os.close(fd)
        _refuse_entry(base, parts, after)
    size = after.st_size
    if size > limit.cap:
        os.close(fd)
        raise RefusedFile(
            str(Path(base, *parts)),
            f"is {size:,} bytes, over the {limit.kind} cap of {limit.cap:,} bytes; this is not "
            "a file the run wrote",
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
    ``keep`` accepts, by directory, then name; :class:`RefusedFile` for a kept name that is not
    a regular file, any link when ``recursive``, or more than ``max_files`` files."""
    base, top = _split(directory, directory if root is None else root)
    found: list[PurePosixPath] = []
    pending = [top]
    while pending:
        parts = pending.pop()
        fd = _open_run_dir(base, parts)
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
    target = Path(path)
    base = target.parent if root is None else Path(root)
    parts = target.relative_to(base).parts
    if ".." in parts:
        raise ValueError(f"{target} leaves {base}")
    return base, parts


class _Blocked(Exception):
    def __init__(self, depth: int, info: os.stat_result) -> None:
        self.depth, self.info = depth, info


def _open_dir(base: Path, parts: tuple[str, ...], *, create: bool = False) -> int:
    """``base`` as named (a link followed), then each part ``O_NOFOLLOW`` below its parent."""
    fd = os.open(base, _DIR_FLAGS)
    for depth, name in enumerate(parts, start=1):
        try:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
            child = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
        except OSError as error:
            try:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _Blocked(depth, os.stat(name, dir_fd=fd, follow_symlinks=False)) from None
                raise
            finally:
                os.close(fd)
        os.close(fd)
        fd = child
    return fd


def _open_run_dir(base: Path, parts: tuple[str, ...]) -> int:
    try:
        return _open_dir(base, parts)
    except _Blocked as blocked:
        if not stat.S_ISREG(blocked.info.st_mode):
            _refuse_entry(base, parts[: blocked.depth], blocked.info)
        path = base.joinpath(*parts[: blocked.depth])
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path)) from None


def _refuse_entry(base: Path, parts: tuple[str, ...], info: os.stat_result) -> NoReturn:
    shown = str(Path(base, *parts))
    if stat.S_ISLNK(info.st_mode):
        real_base, real = os.path.realpath(base), os.path.realpath(Path(base, *parts))
        inside = real == real_base or real.startswith(real_base + os.sep)
        where = "inside" if inside else "outside"
        raise RefusedFile(
            shown,
            f"is a symbolic link to a path {where} the run directory (links are not "
            "followed in a run dir: put the file itself there)",
        )
    kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
    raise RefusedFile(shown, f"is {kind}, not a regular file; a run dir holds regular files only")
