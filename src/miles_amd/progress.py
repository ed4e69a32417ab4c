"""Progress of a long read (the job log), shown on a terminal only: one line rewritten in
place at most every :data:`INTERVAL_S`, cleared at the end, only on a TTY and for at least
:data:`MIN_BYTES` (a pipe, a CI log or a short read shows nothing).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

MIN_BYTES = 64 << 20
INTERVAL_S = 0.5


class Progress:
    """``label: N% of M MB`` on ``stream`` (default stderr) while ``update`` is called."""

    def __init__(
        self, label: str, total: int, stream: TextIO | None = None, min_bytes: int = MIN_BYTES
    ) -> None:
        self.label, self.total = label, total
        self.stream = stream if stream is not None else sys.stderr
        try:
            tty = self.stream.isatty()
        except (AttributeError, ValueError):  # a closed or replaced stream
            tty = False
        self.on = tty and total >= min_bytes
        self.last = 0.0
        self.width = 0

    def update(self, done: int) -> None:
        now = time.monotonic()
        if not self.on or now - self.last < INTERVAL_S:
            return
        self.last = now
        text = f"{self.label}: {100 * done // max(self.total, 1)}% of {self.total >> 20} MB"
        self._write("\r" + text.ljust(self.width))
        self.width = len(text)

    def close(self) -> None:
        """Clear the line (nothing was written when the progress was off)."""
        if self.on and self.width:
            self._write("\r" + " " * self.width + "\r")
            self.width = 0

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a terminal gone: the read goes on
            self.on = False
