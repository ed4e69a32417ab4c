"""The progress of a long read (a real pseudo-terminal). The hint for a mistyped baseline
name: ``test_gate_cli.py``; Ctrl-C and shell completion: ``test_cli_interface.py``."""

from __future__ import annotations

import io
import os
import pty

from miles_amd.evidence.job_log import Progress


def test_progress_is_shown_on_a_terminal_and_cleared() -> None:
    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as terminal:
        progress = Progress("reading job.log", 200 << 20, stream=terminal)
        progress.update(50 << 20)
        progress.close()
    shown = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the terminal's other end closed: all read
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    text = shown.decode()
    assert text.startswith("\rreading job.log: 25% of 200 MB")
    assert text.endswith("\r" + " " * len("reading job.log: 25% of 200 MB") + "\r")


def test_no_progress_off_a_terminal_or_for_a_short_read() -> None:
    piped = io.StringIO()
    progress = Progress("reading job.log", 200 << 20, stream=piped)
    progress.update(100 << 20)
    progress.close()
    assert piped.getvalue() == ""
    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as terminal:
        short = Progress("reading job.log", 1 << 20, stream=terminal)
        assert not short.on
    os.close(master)
