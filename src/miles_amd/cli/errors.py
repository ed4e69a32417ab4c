"""How a ``miles-amd`` command reports an error and exits.

Decides the error line's shape, ``miles-amd: error: <message>`` (one line on stderr, newlines
folded, control and format characters escaped, secrets redacted: ``miles_amd.escape``,
``miles_amd.redact``); the codes are ``miles_amd.exit_codes``'.

Usage errors that click finds while parsing (an unknown flag, a value out of range) are
reported through :func:`fail` as well, by :func:`miles_amd.cli.main.main`. No other ``cli`` module
spells the error prefix or defines a ``fail`` (``tests/unit/test_cli_plan.py``). Does not decide
what a message says; each command words its own.
"""

from __future__ import annotations

from typing import NoReturn

import typer

from miles_amd.exit_codes import EXIT_BAD_INPUT

ERROR_PREFIX = "miles-amd: error: "


def error_line(message: str) -> str:
    """``message`` as the one stderr line every command prints (control characters and
    escape sequences of a run dir's strings shown escaped: ``miles_amd.escape.terminal``;
    a secret a foreign reply echoed redacted: ``miles_amd.redact.redact``)."""
    from miles_amd.escape import terminal
    from miles_amd.redact import redact

    return ERROR_PREFIX + terminal(redact(" ".join(message.split())))


def say(line: str, *, err: bool = False) -> None:
    """Print ``line`` (which may hold a path or a foreign string) as one line, shown by
    ``miles_amd.escape.terminal``: a value cannot add a line or reorder what is read."""
    from miles_amd.escape import terminal

    typer.echo(terminal(line), err=err)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print :func:`error_line` of ``message`` on stderr and exit with ``code`` (default 2)."""
    typer.echo(error_line(message), err=True)
    raise typer.Exit(code)
