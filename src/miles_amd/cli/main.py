"""The ``miles-amd`` command line: the app, its commands, and where errors leave it.

Decides which commands exist (each lives in its own module: ``prepare``, ``train`` and
``full-train``, ``preflight``, ``gate``, ``baseline``, ``compare``, ``history``,
``canary``),
``--version``, shell completion (``--install-completion``), and how the process exits (Ctrl-C:
one line naming the command interrupted, exit 130): :func:`main` runs the app without click's
standalone handling, so a usage error click finds (unknown flag, value out of range) is
reported like other bad input, as one
``miles-amd: error:`` line and exit 2 (``miles_amd.exit_codes`` lists the exit codes), and a
reader that closes stdout or stderr early changes no exit code (``miles_amd.cli.output``).
A path longer than the OS allows (``ENAMETOOLONG``), wherever a command first touches it, is
one line naming the path and exit 2 (:func:`path_too_long`).
typer >= 0.2x vendors click as ``typer._click`` (older typer uses ``click`` itself); the
exception classes are taken from the module of ``typer.BadParameter``, so either works.
Top-level imports stay light (no ray, torch, tensorboard or matplotlib) so ``--dry-run`` and
the snapshot suite are fast.

Explained for people in ``docs/cli.md``.
"""

from __future__ import annotations

import errno
import importlib
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from miles_amd.cli import baseline as baseline_command
from miles_amd.cli import canary as canary_command
from miles_amd.cli import compare as compare_command
from miles_amd.cli import gate as gate_command
from miles_amd.cli import history as history_command
from miles_amd.cli import preflight as preflight_command
from miles_amd.cli import prepare as prepare_command
from miles_amd.cli import train as train_command
from miles_amd.cli.errors import fail, say
from miles_amd.cli.options import new_app
from miles_amd.cli.output import guard_std_streams
from miles_amd.exit_codes import EXIT_CODES_HELP, EXIT_INTERRUPTED

if TYPE_CHECKING:
    from click import ClickException

PROG_NAME = "miles-amd"
APP_HELP = "gpt-oss-20b MoE LoRA GRPO on 8x AMD MI355X/MI350X: plan, run and gate it."
_click_errors = importlib.import_module(typer.BadParameter.__module__)

app = new_app(APP_HELP, completion=True)  # shell completion: miles-amd --install-completion
prepare_command.register(app)
train_command.register(app)
preflight_command.register(app)
gate_command.register(app)
baseline_command.register(app)
compare_command.register(app)
history_command.register(app)
canary_command.register(app)


def version() -> str:
    """This package's installed version."""
    try:
        return metadata.version("miles-amd")
    except metadata.PackageNotFoundError:
        return "unknown (not installed; pip install -e .)"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"{PROG_NAME} {version()}")
        raise typer.Exit()


@app.callback(help=APP_HELP, epilog=EXIT_CODES_HELP)
def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version; exit."
        ),
    ] = False,
) -> None:
    pass  # only --version; the commands do the work


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Run the CLI on ``argv`` (default: ``sys.argv[1:]``) and exit with its code."""
    guard_std_streams()
    command = typer.main.get_command(app)
    try:
        try:
            code = command.main(
                args=list(argv) if argv is not None else None,
                prog_name=PROG_NAME,
                standalone_mode=False,
            )
        except _click_errors.ClickException as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # `miles-amd` alone: the help
                exc.show()
                code = exc.exit_code
            else:
                fail(_usage_message(exc), code=exc.exit_code)
        except (KeyboardInterrupt, typer.Abort):
            code = EXIT_INTERRUPTED
            say(interrupted_line(command, sys.argv[1:] if argv is None else argv), err=True)
        except OSError as exc:
            if exc.errno != errno.ENAMETOOLONG:
                raise
            fail(path_too_long(exc))
        else:  # typer turns Ctrl-C into Exit(130), which click returns without standalone mode
            if code == EXIT_INTERRUPTED:
                say(interrupted_line(command, sys.argv[1:] if argv is None else argv), err=True)
    except typer.Exit as exc:  # fail() above
        code = exc.exit_code
    sys.exit(code if isinstance(code, int) else 0)


def path_too_long(exc: OSError) -> str:
    """The one line for ``ENAMETOOLONG``: the path (its start, when long), its length and the
    longest name in it, and the fix."""
    path = str(exc.filename or "")
    longest = max((len(part.encode()) for part in path.split("/")), default=0)
    shown = path if len(path) <= 80 else path[:60] + "..." + path[-10:]
    return (
        f"{shown}: the path is longer than this OS allows ({len(path.encode())} bytes, its "
        f"longest name {longest} bytes; ENAMETOOLONG); fix: name a shorter path"
    )


def interrupted_line(command: object, args: Sequence[str]) -> str:
    """The one line Ctrl-C leaves: which command was interrupted, and the exit code."""
    words = [PROG_NAME]
    for arg in args:
        subcommands = getattr(command, "commands", None) or {}
        if arg in subcommands:
            words.append(arg)
            command = subcommands[arg]
        elif not arg.startswith("-"):
            break
    return f"{' '.join(words)}: interrupted (Ctrl-C); exit {EXIT_INTERRUPTED}"


# typer (0.29) converts values with pydantic, whose messages carry its own prefix
PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


def _usage_message(exc: ClickException) -> str:
    """click's message without the converting library's prefix, and the help to read."""
    message = exc.format_message()
    for prefix in PYDANTIC_PREFIXES:
        message = message.replace(prefix, "")
    message = message.rstrip(".")
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        message += f"; see `{ctx.command_path} --help`"
    return message


if __name__ == "__main__":
    main()
