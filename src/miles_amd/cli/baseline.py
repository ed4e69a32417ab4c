"""``miles-amd baseline record|diff``: turn a finished run into a baseline file; compare two.

Decides the commands' options, output and exit codes; what a recorded baseline holds and
when a run is refused is ``miles_amd.baseline.record``'s (its module doc states the method).

- ``record --run-dir DIR --variant stock|patched --out PATH``: reads the run strictly
  (``metrics.run_dir.load_run``), records it with the shipped baseline of that variant as
  template, checks the loader accepts the result and the run passes it, and writes ``PATH``
  atomically (temp file in the same directory, then a rename: ``os.link`` without ``--force``,
  so an existing file is never replaced by a race, ``os.replace`` with it). Exit 0 written;
  2 refused (no run dir, a failed, short, corrupt, non-finite or fatal-log run, preflight not
  passed without ``--allow-no-preflight``, ``--out`` exists without ``--force``), with one
  line on stderr naming the flag or file and the fix, and nothing written.
- ``diff OLD NEW`` (each ``stock``, ``patched`` or a path): prints, per rule, its tolerance
  and reference before -> after, marks what changed, lists added and removed rules and the
  provenance before -> after (``--format markdown`` for a PR comment). Exit 0 whenever both
  load (it is a report, not a gate); 2 when either does not.

Everything beyond typer and the standard library is imported inside the commands, so
registering them costs the CLI's start-up nothing.
"""

from __future__ import annotations

import os
import tempfile
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from miles_amd.cli.errors import EXIT_CODES_HELP
from miles_amd.cli.errors import fail as _fail
from miles_amd.cli.options import new_app

baseline_app = new_app("Record a baseline from a finished run; diff two baselines.")


class Variant(str, Enum):
    stock = "stock"
    patched = "patched"  # with ROCm/aiter#5694


class DiffFormat(str, Enum):
    text = "text"
    markdown = "markdown"


def register(app: typer.Typer) -> None:
    """Add the ``baseline`` command group (``record``, ``diff``) to ``app``."""
    app.add_typer(baseline_app, name="baseline")


def write_atomically(path: Path, text: str, *, replace: bool) -> None:
    """Write ``text`` to ``path`` whole or not at all; ``FileExistsError`` if it exists and
    ``replace`` is false (checked by the final link, so no race can clobber a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


@baseline_app.command("record", epilog=EXIT_CODES_HELP)
def record(
    run_dir: Annotated[
        Path,
        typer.Option(
            "--run-dir", help="A finished run: tensorboard/, ci_history/, job.*, env.json."
        ),
    ],
    variant: Annotated[
        Variant, typer.Option("--variant", help="The run's aiter: stock, or patched (#5694).")
    ],
    out: Annotated[Path, typer.Option("--out", help="The baseline JSON file to write.")],
    num_rollouts: Annotated[
        int | None,
        typer.Option(
            "--num-rollouts", min=2, help="Rollouts the run had (default: the template's, 20)."
        ),
    ] = None,
    allow_no_preflight: Annotated[
        bool,
        typer.Option(
            "--allow-no-preflight",
            help="Record a run without a passing preflight (no GPUs: the example, a rehearsal); "
            "the provenance says so.",
        ),
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out.")] = False,
    name: Annotated[
        str | None,
        typer.Option("--name", help="The baseline's name (default: the --out file's stem)."),
    ] = None,
) -> None:
    """Record a baseline from a run that passed preflight and finished all rollouts."""
    if out.is_dir():
        _fail(f"--out {out}: is a directory; fix: name the baseline JSON file to write")
    if out.exists() and not force:
        _fail(f"--out {out}: already exists; fix: pass --force to replace it, or another --out")
    if not run_dir.is_dir():
        _fail(f"--run-dir {run_dir}: no such directory; fix: point it at a finished run's dir")

    from miles_amd.baseline.model import SCHEMA_PATH, BaselineError, load_baseline
    from miles_amd.baseline.record import RecordError, baseline_json_text, record_baseline
    from miles_amd.evidence.load import load_run

    try:
        template = load_baseline(variant.value)
    except BaselineError as exc:
        _fail(f"--variant {variant.value}: the shipped template does not load: {exc}")
    try:
        evidence = load_run(run_dir)
    except OSError as exc:
        _fail(f"--run-dir {run_dir}: {exc}")
    schema_ref = os.path.relpath(SCHEMA_PATH, out.resolve().parent)
    try:
        doc = record_baseline(
            evidence,
            template,
            variant=variant.value,
            name=name if name is not None else out.stem,
            recorded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            rollouts=num_rollouts,
            allow_no_preflight=allow_no_preflight,
            schema_ref=schema_ref,
        )
    except RecordError as exc:
        _fail(str(exc))
    try:
        write_atomically(out, baseline_json_text(doc), replace=force)
    except FileExistsError:
        _fail(f"--out {out}: already exists; fix: pass --force to replace it, or another --out")
    except OSError as exc:
        _fail(f"--out {out}: cannot write ({exc}); fix: choose a writable path")
    bands = sum(1 for rule in doc["rules"] if "band" in rule)
    typer.echo(
        f"miles-amd baseline record: wrote {out} (baseline {doc['name']}, run "
        f"{doc['provenance']['run_id']}, {doc['run_shape']['rollouts']} rollouts, {bands} bands "
        f"recomputed); review it with: miles-amd baseline diff {variant.value} {out}"
    )


@baseline_app.command("diff", epilog=EXIT_CODES_HELP)
def diff(
    old: Annotated[str, typer.Argument(help="stock, patched, or a baseline file path.")],
    new: Annotated[str, typer.Argument(help="stock, patched, or a baseline file path.")],
    output_format: Annotated[
        DiffFormat, typer.Option("--format", help="text, or markdown for a PR comment.")
    ] = DiffFormat.text,
) -> None:
    """Print what a reviewer must look at between two baselines (exit 0 when both load)."""
    from miles_amd.baseline.model import BaselineError, load_baseline
    from miles_amd.baseline.record import diff_baselines, render_diff

    loaded = []
    for label, spec in (("OLD", old), ("NEW", new)):
        try:
            loaded.append(load_baseline(spec))
        except BaselineError as exc:
            _fail(f"{label} {spec}: {exc}")
    typer.echo(render_diff(diff_baselines(*loaded), output_format.value), nl=False)
