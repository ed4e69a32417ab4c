"""A job log streamed as blocks of whole lines, in bounded memory whatever the log's size.

Decides how ``job.log`` is cut for its readers (the metric lines of ``job_log`` and the
sentinel scan of ``sentinels``, which ``load`` feeds from one pass): blocks of about
:data:`CHUNK` bytes of whole ``\\n``-terminated lines, decoded as UTF-8 (undecodable bytes
become U+FFFD), each with the 1-based number of its first line. Lines are split on ``\\n``
only, so line numbers match ``grep -n`` even where progress bars wrote a bare ``\\r``.

A line longer than :data:`MAX_LINE` bytes is not kept whole, and none of it is skipped:
it comes as pieces of at most :data:`MAX_LINE` bytes, each yielded with the line's number and
no ``\\n`` of its own (only the line's last piece ends with one), so memory stays bounded even
for a log without newlines and the sentinel scan sees every byte (a fatal message after
megabytes of ``\\r`` progress output on one line is found). A piece is cut just after the
last ``\\r`` in it when there is one, so a progress update stays whole; a piece without
any ``\\r`` is cut at :data:`MAX_LINE` bytes and the next one starts :data:`OVERLAP` bytes
earlier, so a signature across the cut is still whole in one piece (and may be counted in
both). No line the recipe prints comes near the limit (a metric line of 150 metrics is about
8 kB); a metric line that long fails to parse and is named by its line.

``live`` (the watcher's view of a log still being written) leaves out an unterminated last
line: it is the write in flight. At most ``size`` bytes are read (the size the file had when
it was opened, see ``safe_open``), so a log growing meanwhile is read as a consistent prefix.

Measured (``benchmarks/bench_log.py``, 1 GiB log, 150,000 metric points): ``load_run`` peaks
at 65 MiB RSS (28 MiB before it starts) and takes 11 s (10 s of CPU), most of it the
sentinel scan's substring searches.

On a terminal, a read of 64 MiB or more shows its progress on stderr
(``miles_amd.progress``).

Does not decide: what a line means.
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
