"""How a ``miles-amd`` command reports an error and exits.

Decides the error line's shape, ``miles-amd: error: <message>`` (one line on stderr, newlines
folded); the codes are ``miles_amd.exit_codes``'.

Usage errors that click finds while parsing (an unknown flag, a value out of range) are
reported through :func:`fail` as well, by :func:`miles_amd.cli.main.main`. Does not decide
what a message says; each command words its own.
"""

from __future__ import annotations

from typing import NoReturn

import typer

from miles_amd.exit_codes import EXIT_BAD_INPUT

ERROR_PREFIX = "miles-amd: error: "


def error_line(message: str) -> str:
    """``message`` as the one stderr line every command prints (control characters and
    escape sequences of a run dir's strings shown escaped: ``miles_amd.escape.terminal``)."""
    from miles_amd.escape import terminal

    return ERROR_PREFIX + terminal(" ".join(message.split()))


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print :func:`error_line` of ``message`` on stderr and exit with ``code`` (default 2)."""
    typer.echo(error_line(message), err=True)
    raise typer.Exit(code)
