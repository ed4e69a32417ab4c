"""A job log streamed as blocks of whole lines, in bounded memory whatever the log's size.

Decides how ``job.log`` is cut for its readers (the metric lines of ``job_log`` and the
sentinel scan of ``sentinels``, which ``load`` feeds from one pass): blocks of about
:data:`CHUNK` bytes of whole ``\\n``-terminated lines, decoded as UTF-8 (undecodable bytes
become U+FFFD), each with the 1-based number of its first line. Lines are split on ``\\n``
only, so line numbers match ``grep -n`` even where progress bars wrote a bare ``\\r``.

A line longer than :data:`MAX_LINE` bytes is cut to its first :data:`MAX_LINE` bytes and the
rest of it is skipped: memory stays bounded even for a log without newlines. No line the
recipe prints comes near it (a metric line of 150 metrics is about 8 kB); a metric line that
long fails to parse and is named by its line, a sentinel in the part kept is still found.

``live`` (the watcher's view of a log still being written) leaves out an unterminated last
line: it is the write in flight. At most ``size`` bytes are read (the size the file had when
it was opened, see ``safe_open``), so a log growing meanwhile is read as a consistent prefix.

Measured (``benchmarks/bench_log.py``, 1 GiB log, 150,000 metric points): ``load_run`` peaks
at 65 MiB RSS (28 MiB before it starts) and takes 11 s (10 s of CPU), most of it the
sentinel scan's substring searches.

Does not decide: what a line means.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

CHUNK = 1 << 20  # bytes read at a time
MAX_LINE = 1 << 20  # bytes of one line kept (>= CHUNK keeps each block's lines whole)


def line_blocks(handle: BinaryIO, size: int, *, live: bool = False) -> Iterator[tuple[int, str]]:
    """``(first line number, text)`` for each block of whole lines of the first ``size`` bytes.

    Each block but the last ends with ``\\n``; the last may be an unterminated final line
    (never when ``live``).
    """
    line = 1
    carry = b""  # the start of a line whose end is not read yet
    skipping = False  # inside the rest of a line already cut and yielded
    remaining = size
    while remaining > 0:
        data = handle.read(min(CHUNK, remaining))
        if not data:
            break
        remaining -= len(data)
        start = 0
        if skipping:
            newline = data.find(b"\n")
            if newline < 0:
                continue
            start, skipping = newline + 1, False
        end = data.rfind(b"\n", start)
        if end < 0:
            carry += data[start:]
            if len(carry) > MAX_LINE:
                yield line, _text(carry[:MAX_LINE]) + "\n"
                line, carry, skipping = line + 1, b"", True
            continue
        first_end = data.find(b"\n", start)
        if carry and len(carry) + first_end - start > MAX_LINE:
            yield line, _text((carry + data[start:first_end])[:MAX_LINE]) + "\n"
            line, carry, start = line + 1, b"", first_end + 1
        block = carry + data[start : end + 1]
        carry = data[end + 1 :]
        if block:
            yield line, _text(block)
            line += block.count(b"\n")
    if carry and not live:
        yield line, _text(carry)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")
