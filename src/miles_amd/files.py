"""Writing files so that no reader sees half of one, and not through a link.

- :func:`write_files`: a set of files into one directory (:func:`atomic_write_bytes`: a set
  of one). Every directory below ``root`` is opened ``O_NOFOLLOW`` relative to its parent,
  so a ``report`` link in an untrusted run dir is :class:`UnsafeDir`, not followed. Each
  file goes to a flushed temp file beside it first; only when all are written are they
  renamed into place (``os.replace``), so a failure leaves the previous set as it was.
- A writer owns its temps: ``.<name>.<pid>-<random>.tmp``, held under an ``flock`` until
  renamed or removed; a set is renamed under an ``flock`` of its directory, so concurrent
  writers never take each other's temps and the last set committed is whole. Another writer
  removes a temp only when it is provably a dead writer's (:func:`abandoned`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeDir(OSError):
    """A directory to write into is a link or not a directory; ``str()`` names it and the fix."""


def atomic_write_bytes(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` whole or not at all (parent dirs are created)."""
    write_files(path.parent, {path.name: data}, root=path.parent, mode=mode)


def atomic_write_text(path: Path, text: str, *, mode: int = 0o644) -> None:
    """:func:`atomic_write_bytes` of ``text`` encoded as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def write_files(
    out_dir: Path, files: Mapping[str, bytes], *, root: Path | None = None, mode: int = 0o644
) -> None:
    """Write the set ``files`` (``name: bytes``) into ``out_dir``, created when absent.

    ``root`` (default ``out_dir``'s parent) is trusted, followed if a link; a link or file
    from it down to ``out_dir`` is ``UnsafeDir`` and nothing is written.
    """
    with staged_files(out_dir, files, root=root, mode=mode) as commit:
        commit()


@contextlib.contextmanager
def staged_files(
    out_dir: Path, files: Mapping[str, bytes], *, root: Path | None = None, mode: int = 0o644
) -> Iterator[Callable[[], None]]:
    """:func:`write_files` in two steps: the set's temp files are written on entry, the
    function given renames them into place under the directory's lock (one set at a time);
    leaving the block removes the temps not committed."""
    base = root if root is not None else out_dir.parent
    parts = out_dir.relative_to(base).parts if out_dir != base else ()
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"{out_dir} is not a directory below {base}")
    for name in files:
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"{name!r} is not a file name")
    base.mkdir(parents=True, exist_ok=True)
    fd = _open_below(base, parts, out_dir)
    temps: dict[str, tuple[str, int]] = {}  # name: (its temp, the temp's held fd)

    def commit() -> None:
        hold(fd, wait=True)
        try:
            for name, (tmp, held) in list(temps.items()):
                os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
                del temps[name]
                os.close(held)
        finally:
            with contextlib.suppress(OSError):  # no flock on this file system: nothing held
                fcntl.flock(fd, fcntl.LOCK_UN)

    try:
        for name, data in files.items():
            _remove_stale(fd, name)
            temps[name] = _write_temp(fd, name, data, mode)
        yield commit
    finally:
        for tmp, held in temps.values():
            _unlink(fd, tmp)
            os.close(held)
        os.close(fd)


def _open_below(base: Path, parts: tuple[str, ...], out_dir: Path) -> int:
    fd = os.open(base, _DIR_FLAGS)
    for index, part in enumerate(parts):
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o755, dir_fd=fd)
            child = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
        except OSError as error:
            if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                os.close(fd)
                raise
            info = os.stat(part, dir_fd=fd, follow_symlinks=False)
            os.close(fd)
            kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a directory"
            where = base.joinpath(*parts[: index + 1])
            raise UnsafeDir(
                f"{where} is {kind}; files are never written through a link or over a file: "
                f"remove it, or write {out_dir.name} elsewhere"
            ) from None
        os.close(fd)
        fd = child
    return fd


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
        fd = os.open(
            entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
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
    """``data`` in a new temp of ``name``, flushed; returns it and its fd, locked (:func:`hold`)."""
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


def _remove_stale(dir_fd: int, name: str) -> None:
    """The temp files of ``name`` that a killed writer left (:func:`abandoned`)."""
    for entry in os.listdir(dir_fd):
        if abandoned(dir_fd, entry, f".{name}", ".tmp"):
            _unlink(dir_fd, entry)


def _unlink(dir_fd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)
