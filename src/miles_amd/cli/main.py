"""The ``miles-amd`` command line: its commands, ``--version``, and how the process exits.

A usage error is one ``miles-amd: error:`` line and exit 2; Ctrl-C one line naming the
command, exit 130; a path longer than the OS allows one line naming it, exit 2.
"""

from __future__ import annotations

import errno
import importlib
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Annotated, NoReturn

import typer

from miles_amd.cli import canary, gate, train
from miles_amd.cli.options import fail, guard_std_streams, new_app, opt, say
from miles_amd.exit_codes import EXIT_CODES_HELP, EXIT_INTERRUPTED

PROG_NAME = "miles-amd"
APP_HELP = "gpt-oss-20b MoE LoRA GRPO on 8x AMD MI355X/MI350X: plan, run and gate it."
# typer >= 0.2x vendors click as typer._click: take the exceptions from where typer has them
_click_errors = importlib.import_module(typer.BadParameter.__module__)
# typer converts values with pydantic, whose messages carry its own prefix
PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")

app = new_app(APP_HELP, completion=True)  # shell completion: miles-amd --install-completion
for module in (train, gate, canary):
    module.register(app)


def _print_version(value: bool) -> None:
    if value:
        try:
            installed = metadata.version("miles-amd")
        except metadata.PackageNotFoundError:
            installed = "unknown (not installed; pip install -e .)"
        typer.echo(f"{PROG_NAME} {installed}")
        raise typer.Exit()


@app.callback(help=APP_HELP, epilog=EXIT_CODES_HELP)
def _root(
    show_version: Annotated[
        bool, opt("--version", "Print the version.", callback=_print_version, is_eager=True)
    ] = False,
) -> None:
    pass  # only --version; the commands do the work


def main(argv: Sequence[str] | None = None) -> NoReturn:
    guard_std_streams()
    command = typer.main.get_command(app)
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        try:
            code = command.main(args=args, prog_name=PROG_NAME, standalone_mode=False)
        except _click_errors.ClickException as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # `miles-amd` alone: the help
                exc.show()
                code = exc.exit_code
            else:
                fail(_usage_message(exc), code=exc.exit_code)
        except (KeyboardInterrupt, typer.Abort):
            code = EXIT_INTERRUPTED
        except OSError as exc:
            if exc.errno != errno.ENAMETOOLONG:
                raise
            path = str(exc.filename or "")
            longest = max((len(part.encode()) for part in path.split("/")), default=0)
            shown = path if len(path) <= 80 else path[:60] + "..." + path[-10:]
            fail(
                f"{shown}: the path is longer than this OS allows ({len(path.encode())} bytes, "
                f"its longest name {longest} bytes; ENAMETOOLONG); fix: name a shorter path"
            )
        if code == EXIT_INTERRUPTED:  # typer returns Ctrl-C as 130 without standalone mode
            say(interrupted_line(command, args), err=True)
    except typer.Exit as exc:  # fail() above
        code = exc.exit_code
    sys.exit(code if isinstance(code, int) else 0)


def interrupted_line(command: object, args: Sequence[str]) -> str:
    words = [PROG_NAME]
    for arg in args:
        subcommands = getattr(command, "commands", None) or {}
        if arg in subcommands:
            words.append(arg)
            command = subcommands[arg]
        elif not arg.startswith("-"):
            break
    return f"{' '.join(words)}: interrupted (Ctrl-C); exit {EXIT_INTERRUPTED}"


def _usage_message(exc: Exception) -> str:
    message = exc.format_message()  # type: ignore[attr-defined]
    for prefix in PYDANTIC_PREFIXES:
        message = message.replace(prefix, "")
    message = message.rstrip(".")
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        message += f"; see `{ctx.command_path} --help`"
    return message


if __name__ == "__main__":
    main()
