"""The one way a ``miles-amd`` command reports an error and exits.

Decides the error line's shape, ``miles-amd: error: <message>`` (one line on stderr, newlines
folded), and the exit codes every command shares:

- 0 success (or the gate passed),
- 1 the run, the gate or the preflight failed (the job failed, a check failed, a fact is
  not ok),
- 2 bad input: a flag, a file or a directory the command cannot use; nothing is started or
  half-written, and the message names the flag or file and the fix,
- 130 interrupted (Ctrl-C).

Usage errors that click finds while parsing (an unknown flag, a value out of range) are
reported through :func:`fail` as well, by :func:`miles_amd.cli.main.main`. Does not decide
what a message says; each command words its own.
"""

from __future__ import annotations

from typing import NoReturn

import typer

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
ERROR_PREFIX = "miles-amd: error: "

EXIT_CODES_HELP = (
    "Exit codes: 0 success, 1 the run, the gate or the preflight failed, 2 bad input (one "
    "line on stderr naming the flag and the fix; nothing is started), 130 interrupted."
)


def error_line(message: str) -> str:
    """``message`` as the one stderr line every command prints (control characters and
    escape sequences of a run dir's strings shown escaped: ``miles_amd.escape.terminal``)."""
    from miles_amd.escape import terminal

    return ERROR_PREFIX + terminal(" ".join(message.split()))


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print :func:`error_line` of ``message`` on stderr and exit with ``code`` (default 2)."""
    typer.echo(error_line(message), err=True)
    raise typer.Exit(code)
