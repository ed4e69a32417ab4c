"""Write report files into one directory, whole or not at all, never through a link.

The report dir is ``<run-dir>/report/`` unless ``--report-dir`` names another, and a run dir
is untrusted input: a ``report`` symbolic link in it (or a ``report.md`` link inside) would
make the gate write wherever the link points. So the directory's last component is opened
with ``O_NOFOLLOW`` (created first when absent; the part above it is the directory the user
named and is followed, as ``--run-dir runs/latest`` is), and every file is written relative
to that descriptor: a temp file created ``O_EXCL | O_NOFOLLOW``, flushed to disk, renamed
over the target (``renameat`` replaces a link, never follows it). A link where the directory
should be, or a non-directory, is :class:`UnsafeReportDir` (an ``OSError``: the CLI reports
it as an unwritable report dir, one line, exit 2), and nothing is written.

Decides where report bytes may go; what they say is ``render``'s and ``plot``'s.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path

__all__ = ["UnsafeReportDir", "write_files"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeReportDir(OSError):
    """The report dir is a link or not a directory; ``str()`` names it and the fix."""


def _open_dir(out_dir: Path) -> int:
    parent = os.open(out_dir.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(out_dir.name, 0o755, dir_fd=parent)
        try:
            return os.open(out_dir.name, _DIR_FLAGS, dir_fd=parent)
        except OSError as error:
            if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            info = os.stat(out_dir.name, dir_fd=parent, follow_symlinks=False)
            kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a directory"
            raise UnsafeReportDir(
                f"{out_dir} is {kind}; a report is never written through a link or over a "
                "file: remove it, or pass --report-dir DIR"
            ) from None
    finally:
        os.close(parent)


def write_files(out_dir: Path, files: dict[str, bytes], *, mode: int = 0o644) -> None:
    """Write each ``name: bytes`` of ``files`` into ``out_dir`` (created when absent)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    fd = _open_dir(out_dir)
    try:
        for name, data in files.items():
            _write_one(fd, name, data, mode)
    finally:
        os.close(fd)


def _write_one(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"{name!r} is not a file name")
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, _TMP_FLAGS, mode, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
