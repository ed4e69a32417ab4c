"""``miles-amd history``: list past gate verdicts, plot their trends, check drift, export.

Decides the command's options and output:

- the history is the one the user names (``--history PATH``, else ``$MILES_AMD_HISTORY``;
  ``miles_amd.cli.options.named_history``); none named, a missing file, a file that is no
  history (an empty one included) or one of another schema version exits 2 naming
  ``--history`` and the fix;
- listing reads it read-only and creates or modifies no file
  (``tests/unit/test_cli_interface.py``): the runs (``--variant``, ``--baseline``, ``--limit``
  filter), oldest first, with the drift findings of each identity (recipe and aiter build,
  from the run; ``miles_amd.history.drift``); exit 0 when listed (a drift is reported, not
  an exit code);
- ``--plot PATH`` writes the per-metric trend PNG; ``--export DIR`` writes what upstream
  miles' CI capture would have written for the runs (``miles_amd.history.export``);
- ``history mark-untrusted ID`` / ``mark-trusted ID`` take a run out of the trend (and the
  export's trusted runs) and put it back; a failed gate is not trusted whatever its mark.

The append of a judged run (``gate``, ``train --gate``) is ``miles_amd.app.gate``'s.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from miles_amd import escape
from miles_amd.cli.errors import fail, say
from miles_amd.cli.options import (
    HISTORY_ENV,
    INT,
    VARIANT_METAVAR,
    AiterVariant,
    FormatOpt,
    HistoryOpt,
    OutputFormat,
    named_history,
)
from miles_amd.exit_codes import EXIT_CODES_HELP

if TYPE_CHECKING:
    from miles_amd.history.drift import Drift
    from miles_amd.history.store import HistoryStore, StoredRun


def register(app: typer.Typer) -> None:
    """Add the ``history`` command (listing) and its ``mark-*`` subcommands to ``app``."""
    group = typer.Typer(add_completion=False)
    group.callback(invoke_without_command=True, epilog=EXIT_CODES_HELP)(history)
    group.command("mark-untrusted", epilog=EXIT_CODES_HELP)(mark_untrusted)
    group.command("mark-trusted", epilog=EXIT_CODES_HELP)(mark_trusted)
    app.add_typer(group, name="history")


MAX_RUN_ID = 2**63 - 1  # SQLite's INTEGER PRIMARY KEY is a signed 64-bit rowid
RunIdArg = Annotated[
    int,
    typer.Argument(
        metavar="ID", min=1, max=MAX_RUN_ID, help="The run's id in the history (1 to 2**63-1)."
    ),
]


def _mark(history_file: Path | None, run_id: int, *, untrusted: bool) -> None:
    from datetime import datetime, timezone

    from miles_amd.history.store import HistoryError, HistoryStore

    path = named_history(history_file)
    if path is None:
        fail(f"no history named; fix: pass --history PATH or set ${HISTORY_ENV}")
    if not path.is_file():
        fail(f"--history {path}: no history there; fix: point --history at the store")
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        with HistoryStore(path) as store:
            changed = store.mark(run_id, untrusted=untrusted, now=now)
    except (HistoryError, sqlite3.Error) as exc:
        fail(f"--history {path}: {exc}; fix: `miles-amd history --history {path}` lists the ids")
    state = "untrusted" if untrusted else "trusted again"
    say(f"run {run_id} {'marked' if changed else 'was already'} {state} in {path}")


def mark_untrusted(run_id: RunIdArg, history_file: HistoryOpt = None) -> None:
    """Take run ID out of the drift trend and the export's trusted runs (reversible)."""
    _mark(history_file, run_id, untrusted=True)


def mark_trusted(run_id: RunIdArg, history_file: HistoryOpt = None) -> None:
    """Undo mark-untrusted for run ID (a failed gate stays untrusted)."""
    _mark(history_file, run_id, untrusted=False)


def open_history_option(path: Path) -> Path:
    """The named store, checked to open before anything is judged or run; else exit 2."""
    from miles_amd.app.errors import AppError
    from miles_amd.app.gate import open_history

    try:
        return open_history(path)
    except AppError as exc:
        fail(str(exc))


def history(
    ctx: typer.Context,
    history_file: HistoryOpt = None,
    variant: Annotated[
        AiterVariant | None,
        typer.Option("--variant", metavar=VARIANT_METAVAR, help="Only this aiter variant."),
    ] = None,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline", metavar="<name>", help="Only runs judged against this baseline."
        ),
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, metavar=INT, help="Only the newest N runs.")
    ] = None,
    output_format: FormatOpt = OutputFormat.text,
    plot: Annotated[
        Path | None, typer.Option("--plot", metavar="<path>", help="Write the trend PNG here.")
    ] = None,
    export: Annotated[
        Path | None,
        typer.Option(
            "--export",
            metavar="<path>",
            help="Write upstream metric-history JSONL into this directory.",
        ),
    ] = None,
) -> None:
    """List past gate verdicts with drift findings; plot trends; export for upstream miles."""
    from miles_amd.history.drift import by_identity
    from miles_amd.history.store import HistoryError, HistoryStore

    if ctx.invoked_subcommand is not None:
        return
    path = named_history(history_file)
    if path is None:
        fail(f"no history named; fix: pass --history PATH or set ${HISTORY_ENV}")
    if not path.is_file():
        fail(
            f"--history {path}: no history there; fix: run `miles-amd gate --history {path}` "
            "first, or point --history at the store"
        )
    try:
        store = HistoryStore(path, read_only=True)
    except HistoryError as exc:
        fail(f"--history {path}: {exc}")
    with store:
        try:
            read = store.read_runs(
                variant=variant.value if variant else None, baseline=baseline, limit=limit
            )
        except HistoryError as exc:
            fail(f"--history {path}: {exc}")
        runs = read.runs
        for line in read.skipped:  # a corrupt row is named and skipped, the rest listed
            typer.echo(escape.terminal(line), err=True)
        checked = by_identity(runs)
        found = [d for group in checked for d in group.found]
        written = []
        if plot is not None:
            written.append(_plot(plot, runs, found))
        if export is not None:
            written.append(_export(export, store, path))
    from miles_amd.history import render

    text = {
        "text": render.render_text,
        "markdown": render.render_markdown,
        "json": render.to_json,
    }[output_format.value](runs, checked)
    typer.echo(text, nl=False)
    for line in written:
        say(line, err=output_format is not OutputFormat.text)


def _plot(plot: Path, runs: list[StoredRun], found: list[Drift]) -> str:
    """Write the trend PNG; exit 2 naming ``--plot`` when it cannot be written."""
    from miles_amd.files import atomic_write_bytes
    from miles_amd.report.plot import trend_png

    try:
        atomic_write_bytes(plot, trend_png(runs, found))
    except OSError as exc:
        fail(f"--plot {plot}: cannot write ({exc}); choose a writable path")
    return f"trend plot written to {plot}"


def _export(export: Path, store: HistoryStore, path: Path) -> str:
    """Write the export; exit 2 naming ``--export`` (or ``--history``) when it cannot be."""
    from miles_amd.history.export import export_upstream

    try:
        done = export_upstream(store, export)
    except FileExistsError as exc:
        fail(
            f"--export: {exc}; nothing was changed; fix: name a new or empty dir, or an "
            "earlier export"
        )
    except OSError as exc:
        fail(f"--export {export}: cannot write ({exc}); choose a writable path")
    except (sqlite3.DatabaseError, ValueError) as exc:
        fail(f"--history {path}: --export cannot use the stored values ({exc})")
    left_out = (
        f"; {done.without_variant} run(s) without a recorded aiter variant left out "
        "(no upstream identity)"
        if done.without_variant
        else ""
    )
    return (
        f"exported {done.runs} run(s) to {export} (runs.jsonl, records/, "
        f"{', '.join(done.test_files) or 'no test file'}){left_out}"
    )
