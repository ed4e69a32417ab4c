"""A job log streamed as blocks of whole lines, in bounded memory whatever the log's size.

Decides how ``job.log`` is cut for its readers (``job_log``'s metric lines and the scan of
``sentinels``, fed from one pass by ``load``):

- blocks of about :data:`CHUNK` bytes of whole lines, each with the 1-based number of its
  first line; split on ``\\n`` only, so numbers match ``grep -n``; bad UTF-8 becomes U+FFFD;
- a line over :data:`MAX_LINE` bytes comes as pieces, none of it skipped: cut after the last
  ``\\r`` when there is one, else at :data:`MAX_LINE` with :data:`OVERLAP` bytes repeated;
- ``live``: an unterminated last line (the write in flight) is left out; at most ``size``
  bytes are read, so a growing log is read as a consistent prefix.

Caveat: a signature across a hard cut may be counted twice. Does not decide what a line
means. The cuts, the limits and the measured cost (``benchmarks/bench_log.py``):
``docs/cli.md`` ("How the gate reads a run dir").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from miles_amd.progress import Progress

CHUNK = 1 << 20  # bytes read at a time
MAX_LINE = 1 << 20  # bytes of one line (or one piece of a longer line) yielded at a time
OVERLAP = 4096  # bytes a hard-cut piece repeats of the previous one (> any signature)


def line_blocks(handle: BinaryIO, size: int, *, live: bool = False) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` for each block of whole lines of the first ``size`` bytes, and
    for each piece of an over-long line (see the module doc).

    Each block but the last ends with ``\\n``; the last may be an unterminated final line
    (never when ``live``: it is left out, but for the pieces of it already over the limit).
    """
    # a long read on a terminal shows progress (never for the watcher's live reads)
    name = getattr(handle, "name", None)  # an fd's handle is named by its number
    label = f"reading {name if isinstance(name, str) else 'job.log'}"
    progress = Progress(label, 0 if live else size)
    try:
        yield from _blocks(handle, size, live, progress)
    finally:
        progress.close()


def _blocks(
    handle: BinaryIO, size: int, live: bool, progress: Progress
) -> Iterator[tuple[int, str]]:
    line = 1
    carry = b""  # the start of a line whose end is not read yet
    remaining = size
    while remaining > 0:
        data = handle.read(min(CHUNK, remaining))
        if not data:
            break
        remaining -= len(data)
        progress.update(size - remaining)
        end = data.rfind(b"\n")
        if end < 0:
            carry += data
            while len(carry) > MAX_LINE:
                piece, carry = _cut(carry)
                yield line, _text(piece)
            continue
        block = carry + data[: end + 1]
        carry = data[end + 1 :]
        yield line, _text(block)
        line += block.count(b"\n")
    if carry and not live:
        yield line, _text(carry)


def _cut(carry: bytes) -> tuple[bytes, bytes]:
    """``(piece, rest)`` of an over-long unterminated line: after its last ``\\r`` within the
    limit, else at the limit with :data:`OVERLAP` bytes kept for the next piece."""
    cr = carry.rfind(b"\r", 0, MAX_LINE)
    if cr >= 0:
        return carry[: cr + 1], carry[cr + 1 :]
    return carry[:MAX_LINE], carry[MAX_LINE - OVERLAP :]


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")
