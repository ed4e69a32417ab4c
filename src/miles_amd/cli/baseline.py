"""``miles-amd baseline record|diff``: turn a finished run into a baseline file; compare two.

Decides:

- the commands' options, output and exit codes (``record``: 0 written, 2 refused with nothing
  written; ``diff``: 0 the same, 1 different, 2 either does not load);
- ``record``'s checks of its flags and run dir, and its atomic write of ``--out``;
- ``diff``'s rows: per rule, tolerance and reference before -> after.

What a recorded baseline holds and when a run is refused is ``miles_amd.baseline.record``'s.
Heavy imports happen inside the commands, so registering them costs the CLI's start-up nothing.

Explained in ``docs/cli.md`` ("Baselines").
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from miles_amd.cli.errors import fail as _fail
from miles_amd.cli.errors import say
from miles_amd.cli.options import (
    BASELINE_METAVAR,
    BASELINE_VARIANT_METAVAR,
    INT,
    MAX_ROLLOUTS,
    BaselineVariant,
    existing_run_dir,
    load_baseline_option,
    new_app,
)
from miles_amd.exit_codes import EXIT_CODES_HELP

if TYPE_CHECKING:
    from miles_amd.baseline.record import Candidate

baseline_app = new_app("Record a baseline from a finished run; diff two baselines.")


class DiffFormat(str, Enum):
    text = "text"
    markdown = "markdown"
    json = "json"


def register(app: typer.Typer) -> None:
    """Add the ``baseline`` command group (``record``, ``diff``) to ``app``."""
    app.add_typer(baseline_app, name="baseline")


@baseline_app.command("record", epilog=EXIT_CODES_HELP)
def record(
    out: Annotated[
        Path, typer.Option("--out", metavar="<path>", help="The baseline JSON file to write.")
    ],
    num_rollouts: Annotated[
        int | None,
        typer.Option(
            "--num-rollouts",
            min=2,
            max=MAX_ROLLOUTS,
            metavar=INT,
            help="Rollouts the run had (default: the template's, 20).",
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
        typer.Option(
            "--name",
            metavar="<name>",
            help="The baseline's name (default: the variant); --out must be <name>.json.",
        ),
    ] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option(
            "--run-dir",
            metavar="<path>",
            help="A finished run: tensorboard/, ci_history/, job.*, env.json.",
        ),
    ] = None,
    variant: Annotated[
        BaselineVariant | None,
        typer.Option(
            "--variant",
            metavar=BASELINE_VARIANT_METAVAR,
            help="The run's aiter: stock, or patched (#5694); with --from-history, the key's.",
        ),
    ] = None,
    from_history: Annotated[
        Path | None,
        typer.Option(
            "--from-history",
            metavar="<path>",
            help="Instead of --run-dir: derive the baseline of --key from the trusted runs "
            "this history kept of it (at least 3; the median run is the reference).",
        ),
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(
            "--key",
            metavar="<shape/gpu/variant>",
            help="With --from-history: the key, e.g. 8gpu/mi350x/patched (what `gate "
            "--baseline auto` named record-only).",
        ),
    ] = None,
) -> None:
    """Record a baseline from a run that passed preflight and finished all rollouts, or
    (--from-history) from the trusted runs of a record-only key."""
    if out.is_dir():
        _fail(f"--out {out}: is a directory; fix: name the baseline JSON file to write")
    if out.exists() and not force:
        _fail(f"--out {out}: already exists; fix: pass --force to replace it, or another --out")
    if (run_dir is None) == (from_history is None):
        _fail("--run-dir and --from-history: give exactly one; fix: record one run, or a key")
    if from_history is not None:
        variant = _key_variant(key, variant)
    elif key is not None:
        _fail("--key names what --from-history derives; fix: add --from-history, or drop --key")
    if variant is None:
        _fail("--variant: missing; fix: pass --variant stock|patched")
    if run_dir is not None:
        existing_run_dir(run_dir)
    baseline_name = name if name is not None else variant.value

    from miles_amd.baseline.model import SCHEMA_PATH, BaselineError, load_baseline
    from miles_amd.baseline.record import RecordError, baseline_json_text, record_baseline
    from miles_amd.evidence.load import load_run
    from miles_amd.files import atomic_write_text

    try:
        template = load_baseline(variant.value)
    except BaselineError as exc:
        _fail(f"--variant {variant.value}: the shipped template does not load: {exc}")
    others: list[Candidate] = []
    if from_history is not None:
        assert key is not None  # _key_variant checked it
        reference, others = _history_window(from_history, key)
        evidence = reference.evidence
    else:
        assert run_dir is not None
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
            name=baseline_name,
            recorded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            rollouts=num_rollouts,
            allow_no_preflight=allow_no_preflight,
            schema_ref=schema_ref,
        )
        if others:
            from miles_amd.baseline.model import parse_baseline
            from miles_amd.baseline.record import check_window

            check_window(parse_baseline(baseline_json_text(doc), path=str(out)), others, key or "")
    except RecordError as exc:
        _fail(str(exc))
    if out.stem != baseline_name:  # the loader refuses a file not named after its baseline
        _fail(
            f"--out {out}: a baseline file is named after its baseline ({baseline_name}); "
            f"fix: --out {out.with_name(baseline_name + '.json')} (in a review dir), "
            f"or --name {out.stem}"
        )
    try:
        atomic_write_text(out, baseline_json_text(doc), replace=force)
    except FileExistsError:
        _fail(f"--out {out}: already exists; fix: pass --force to replace it, or another --out")
    except OSError as exc:
        _fail(f"--out {out}: cannot write ({exc}); fix: choose a writable path")
    bands = sum(1 for rule in doc["rules"] if "band" in rule)
    window = f", {len(others)} other trusted runs of {key} pass it" if others else ""
    say(
        f"miles-amd baseline record: wrote {out} (baseline {doc['name']}, run "
        f"{doc['provenance']['run_id']}, {doc['run_shape']['rollouts']} rollouts, {bands} bands "
        f"recomputed{window}); review it with: miles-amd baseline diff {variant.value} {out}"
    )


def _key_variant(key: str | None, variant: BaselineVariant | None) -> BaselineVariant:
    """The variant of ``--key`` (shape/gpu/variant), which ``--variant`` must agree with."""
    parts = (key or "").split("/")
    if key is None or len(parts) != 3 or not all(parts):
        _fail(f"--key {key}: not shape/gpu/variant; fix: e.g. --key 8gpu/mi350x/patched")
    if parts[2] not in {v.value for v in BaselineVariant}:
        _fail(f"--key {key}: {parts[2]} has no baseline of its own; fix: stock or patched")
    if variant is not None and variant.value != parts[2]:
        _fail(f"--variant {variant.value} and --key {key} disagree; fix: drop --variant")
    return BaselineVariant(parts[2])


def _history_window(path: Path, key: str) -> tuple[Candidate, list[Candidate]]:
    """The reference run of ``key`` in the history at ``path`` and the other trusted runs
    (``miles_amd.baseline.record``); what does not count is named, exit 2 when too few."""
    from miles_amd.baseline.keys import RunKeyError, run_key
    from miles_amd.baseline.record import Candidate, RecordError, pick_reference
    from miles_amd.evidence.load import load_run
    from miles_amd.history.store import HistoryStore
    from miles_amd.run_dir import RunDir

    if not path.is_file():
        _fail(f"--from-history {path}: no such history file; fix: name the run history")
    variant = key.split("/")[2]
    try:
        with HistoryStore(path, read_only=True) as store:
            runs = [r for r in store.runs(variant=variant) if r.trusted]
    except (OSError, ValueError) as exc:
        _fail(f"--from-history {path}: {exc}")
    candidates, passed_over, seen = [], [], set()
    for run in runs:
        if not RunDir(Path(run.run_dir)).is_run_dir:
            passed_over.append(f"run {run.run_id}: {run.run_dir} is gone")
            continue
        evidence = load_run(Path(run.run_dir))
        try:
            found = str(run_key(evidence))
        except RunKeyError as exc:
            passed_over.append(f"run {run.run_id}: {exc}")
            continue
        if found == key and run.run_key not in seen:  # a run gated twice counts once
            seen.add(run.run_key)
            candidates.append(Candidate(run.run_id, evidence))
    try:
        return pick_reference(candidates, key, passed_over=passed_over)
    except RecordError as exc:
        _fail(str(exc))


@baseline_app.command("diff", epilog=EXIT_CODES_HELP)
def diff(
    old: Annotated[
        str,
        typer.Argument(metavar=BASELINE_METAVAR, help="stock, patched, or a baseline file path."),
    ],
    new: Annotated[
        str,
        typer.Argument(metavar=BASELINE_METAVAR, help="stock, patched, or a baseline file path."),
    ],
    output_format: Annotated[
        DiffFormat,
        typer.Option(
            "--format",
            metavar="<text|markdown|json>",
            help="text, markdown for a PR comment, or json.",
        ),
    ] = DiffFormat.text,
) -> None:
    """Print what a reviewer must look at between two baselines; exit 0 when they are the
    same, 1 when they differ (as diff(1)), 2 when either does not load."""
    from miles_amd.baseline.diff import diff_baselines, render_diff

    loaded = [load_baseline_option(spec, label) for label, spec in (("OLD", old), ("NEW", new))]
    found = diff_baselines(*loaded)
    typer.echo(render_diff(found, output_format.value), nl=False)
    raise typer.Exit(1 if found.differs else 0)
