"""Writing a file so that no reader ever sees half of it.

The one way this package writes a file another process may read (reports, ``job.json``,
``env.json``, recorded baselines, the driver's state): the bytes go to a temp file beside
the target, are flushed to disk (``fsync``), and the temp file is renamed over the target
(``os.replace``, atomic on POSIX within one file system) or, with ``replace=False``, linked
to it (``os.link`` fails if the target exists, so no race can clobber a file). On any error
the temp file is removed and the target is untouched. Decides nothing about content.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["atomic_write_bytes", "atomic_write_text"]


def atomic_write_bytes(path: Path, data: bytes, *, replace: bool = True, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` whole or not at all (parent dirs are created).

    ``replace=False`` raises ``FileExistsError`` when ``path`` exists. ``mode`` is applied
    before the rename (``mkstemp`` creates 0600; most of what we write is for every reader).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def atomic_write_text(path: Path, text: str, *, replace: bool = True, mode: int = 0o644) -> None:
    """:func:`atomic_write_bytes` of ``text`` encoded as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"), replace=replace, mode=mode)
