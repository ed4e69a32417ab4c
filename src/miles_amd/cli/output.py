"""A closed stdout or stderr is not a failure: the exit code stays the command's verdict.

Decides what happens when the reader of ``miles-amd``'s output goes away (``| head -2``, a
CI step that stops reading): :func:`guard_std_streams` replaces ``sys.stdout`` and
``sys.stderr`` with text streams over the same file descriptors whose writes, once the pipe
is broken, are dropped instead of raising ``BrokenPipeError``. Everything that prints (typer,
click's help, the driver's ``print``, the interpreter's final flush) goes through them, so
no write can turn a PASS into exit 1 or a bad input into a traceback. Does not decide what
is printed, nor the codes (``miles_amd.exit_codes``). Only :func:`miles_amd.cli.main.main`
calls it: in-process runs (typer's ``CliRunner``) keep their own streams.
"""

from __future__ import annotations

import io
import os
import sys


class PipeSafeWriter(io.RawIOBase):
    """Writes to ``fd``; after the first ``BrokenPipeError`` every write is dropped."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd
        self.broken = False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:  # a terminal stays one (miles_amd.progress asks)
        return os.isatty(self.fd)

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        size = len(view)
        while view and not self.broken:
            try:
                view = view[os.write(self.fd, view) :]
            except BrokenPipeError:
                self.broken = True
        return size


def guard_std_streams() -> None:
    """Put a :class:`PipeSafeWriter` under ``sys.stdout`` and ``sys.stderr`` (see module doc)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            fd = stream.fileno()
            stream.flush()
        except (AttributeError, OSError, ValueError):
            continue  # not a real file (captured): nothing to guard
        safe = io.TextIOWrapper(
            io.BufferedWriter(PipeSafeWriter(fd)),  # type: ignore[type-var]
            encoding=stream.encoding,
            errors=stream.errors,
            line_buffering=True,
            write_through=name == "stderr",
        )
        setattr(sys, name, safe)
