"""``miles-amd gate``, ``compare``, ``baseline record|diff`` and ``history``: judge evidence.

Exit 0 pass or done, 1 fail or differ, 2 unusable input (one line naming the flag and the fix,
nothing written). Reading, judging and reporting are imported inside the commands.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from miles_amd import escape
from miles_amd.cli import options as opts
from miles_amd.cli.options import INT, MAX_ROLLOUTS, PATH, OutputFormat, fail, opt, say
from miles_amd.exit_codes import EXIT_CODES_HELP, EXIT_FAILED

if TYPE_CHECKING:
    from miles_amd.app.gate import ReportFiles
    from miles_amd.baseline.record import Candidate
    from miles_amd.history.store import HistoryStore

AUTO = "auto"  # --baseline auto: the run's key picks it (miles_amd.baseline.keys)
MAX_RUN_ID = 2**63 - 1  # SQLite's INTEGER PRIMARY KEY is a signed 64-bit rowid
BaselineArg = Annotated[str, typer.Argument(metavar=opts.BASELINE_METAVAR)]
RunIdArg = Annotated[int, typer.Argument(metavar="ID", min=1, max=MAX_RUN_ID)]
RunDirArg = Annotated[Path | None, opt("--run-dir", None, PATH)]


def register(app: typer.Typer) -> None:
    opts.add_command(app, "gate", gate)
    baselines = opts.new_app("Record a baseline from a finished run; diff two baselines.")
    opts.add_command(baselines, "record", record)
    opts.add_command(baselines, "diff", diff)
    app.add_typer(baselines, name="baseline")
    opts.add_command(app, "compare", compare)
    group = typer.Typer(add_completion=False)
    group.callback(invoke_without_command=True, epilog=EXIT_CODES_HELP)(history)
    opts.add_command(group, "mark-untrusted", mark_untrusted)
    opts.add_command(group, "mark-trusted", mark_trusted)
    app.add_typer(group, name="history")


def _written(what: str, files: ReportFiles, output_format: OutputFormat) -> None:
    also = f"(also {files.json.name}, {files.plot.name})"
    say(f"{what} written to {files.markdown} {also}", err=output_format is not OutputFormat.text)


def gate(
    baseline: Annotated[
        str, opt("--baseline", "auto: the run's reviewed one.", "<auto|stock|patched|path>")
    ],
    run_dir: RunDirArg = None,
    example: Annotated[bool, opt("--example", "Gate the embedded example run.")] = False,
    report_dir: Annotated[
        Path | None, opt("--report-dir", "Default RUN_DIR/report (--example: a temp dir).", PATH)
    ] = None,
    output_format: opts.FormatOpt = OutputFormat.text,
    num_rollouts: Annotated[
        int | None, opt("--num-rollouts", "Default: the baseline's.", INT, min=1, max=MAX_ROLLOUTS)
    ] = None,
    expected_rollouts: Annotated[
        int | None, opt("--expected-rollouts", min=1, max=MAX_ROLLOUTS, hidden=True)
    ] = None,
    require_env: opts.RequireEnvOpt = False,
    history_file: opts.HistoryOpt = None,
    no_history: opts.NoHistoryOpt = False,
    no_looks: Annotated[bool, opt("--no-looks", "Judge the whole run only.")] = False,
) -> None:
    """Judge a run dir against a baseline; exit 0 pass, 1 fail, 2 unusable input."""
    import miles_amd
    from miles_amd.app import gate as app_gate
    from miles_amd.app.baselines import load
    from miles_amd.package_data import package_path
    from miles_amd.report.render import render
    from miles_amd.run_dir import RunDir

    rollouts = opts.resolve_alias(
        num_rollouts, expected_rollouts, default=None,
        names=("--num-rollouts", "--expected-rollouts"),
    )  # fmt: skip
    if example == (run_dir is not None):
        fail(
            f"--run-dir and --example: {'give one, not both' if example else 'neither given'}; "
            "fix: pass --run-dir DIR, or --example for the embedded run"
        )
    reference = None if baseline == AUTO else load(baseline, "--baseline")
    example_dir = package_path("miles_amd", "testing", "example-run")
    run_dir = opts.existing_run_dir(run_dir or example_dir)
    history = opts.named_history(history_file, no_history)
    if history is not None:
        app_gate.open_history(history)
    if example and report_dir is None:
        report_dir = Path(tempfile.mkdtemp(prefix="miles-amd-example-"))
    out_dir = report_dir or RunDir(run_dir).report
    if out_dir.resolve().is_relative_to(Path(miles_amd.__file__).resolve().parent):
        flag = "--run-dir" if report_dir is None else "--report-dir"
        fail(
            f"{flag} {run_dir if report_dir is None else report_dir}: the report would go "
            f"into the installed miles_amd package ({out_dir}); fix: pass --report-dir DIR "
            "outside it, or use --example (a temporary dir)"
        )
    try:
        result = app_gate.gate_run_dir(
            run_dir, reference, expected_rollouts=rollouts, report_dir=report_dir,
            require_env=require_env, history=history, looks=not no_looks,
        )  # fmt: skip
    except OSError as exc:
        fail(f"--report-dir {out_dir}: cannot write the report ({exc}); choose a writable dir")
    verdict, to_err = result.verdict, output_format is not OutputFormat.text
    if verdict.record_only:
        say(
            f"no reviewed baseline for {verdict.record_only}: recorded, not judged (the "
            "statistical rules); every evidence check judged",
            err=to_err,
        )
    markdown = output_format is OutputFormat.markdown
    typer.echo(result.markdown if markdown else render(verdict, output_format.value), nl=False)
    for line in result.history_lines:
        say(line, err=to_err)
    _written("report", result.files, output_format)
    if verdict.verdict == "error":
        fail(
            f"--run-dir {run_dir}: {verdict.reason}; point it at a run directory with "
            f"tensorboard/, ci_history/, job.log or job.json (report: {result.files.json})",
            code=verdict.exit_code,
        )
    raise typer.Exit(verdict.exit_code)


def compare(
    run_dirs: Annotated[list[Path], opt("--run-dir", "Twice: run A, then run B.", PATH)],
    baseline: Annotated[
        str, opt("--baseline", "Its metrics and spike threshold.", opts.BASELINE_METAVAR)
    ] = "patched",
    out_dir: Annotated[Path | None, opt("--out-dir", "Default B/report/compare.", PATH)] = None,
    output_format: opts.FormatOpt = OutputFormat.text,
) -> None:
    """Paired A/B of two runs: differences with 95% CIs, spike counts, what N can detect."""
    if len(run_dirs) != 2:
        fail(f"--run-dir: given {len(run_dirs)} time(s); give it exactly twice (run A, then run B)")
    for run_dir in run_dirs:
        opts.existing_run_dir(run_dir)
    from miles_amd.app import gate as app_gate
    from miles_amd.app.baselines import load
    from miles_amd.report.compare_report import render

    reference = load(baseline, "--baseline")
    try:
        compared = app_gate.compare_run_dirs(run_dirs[0], run_dirs[1], reference, out_dir=out_dir)
    except app_gate.NoMetricsError as exc:
        fail(f"--run-dir {exc}; point it at a finished run")
    except app_gate.UntrustedEvidenceError as exc:
        fix = f"`miles-amd gate --run-dir {exc.run_dir}` names every problem"
        fail(f"--run-dir {exc}; its evidence cannot be compared; fix: {fix}", code=EXIT_FAILED)
    except OSError as exc:
        target = app_gate.compare_dir_of(run_dirs[1], out_dir)
        fail(f"--out-dir {target}: cannot write ({exc}); choose a writable directory")
    typer.echo(render(compared.comparison, output_format.value), nl=False)
    _written("comparison", compared.files, output_format)


def record(
    out: Annotated[Path, opt("--out", "The baseline JSON file to write.", PATH)],
    num_rollouts: Annotated[
        int | None, opt("--num-rollouts", "Default: the template's.", INT, min=2, max=MAX_ROLLOUTS)
    ] = None,
    allow_no_preflight: Annotated[
        bool, opt("--allow-no-preflight", "Without a passing preflight (said in provenance).")
    ] = False,
    force: Annotated[bool, opt("--force", "Replace an existing --out.")] = False,
    name: Annotated[
        str | None, opt("--name", "Default: the variant; --out is <name>.json.", "<name>")
    ] = None,
    run_dir: RunDirArg = None,
    variant: Annotated[
        opts.BaselineVariant | None,
        opt("--variant", None, "<" + "|".join(v.value for v in opts.BaselineVariant) + ">"),
    ] = None,
    from_history: Annotated[
        Path | None, opt("--from-history", "Derive --key's baseline from this history.", PATH)
    ] = None,
    key: Annotated[str | None, opt("--key", "With --from-history.", "<shape/gpu/variant>")] = None,
) -> None:
    """Record a baseline from a run that passed preflight and finished all rollouts, or
    (--from-history) from the trusted runs (at least 3) of a record-only key."""
    exists = f"--out {out}: already exists; fix: pass --force to replace it, or another --out"
    if out.is_dir():
        fail(f"--out {out}: is a directory; fix: name the baseline JSON file to write")
    if out.exists() and not force:
        fail(exists)
    if (run_dir is None) == (from_history is None):
        fail("--run-dir and --from-history: give exactly one; fix: record one run, or a key")
    if from_history is not None:
        parts = (key or "").split("/")  # shape/gpu/variant: --variant must agree with it
        if key is None or len(parts) != 3 or not all(parts):
            fail(f"--key {key}: not shape/gpu/variant; fix: e.g. --key 8gpu/mi350x/patched")
        if parts[2] not in {v.value for v in opts.BaselineVariant}:
            fail(f"--key {key}: {parts[2]} has no baseline of its own; fix: stock or patched")
        if variant is not None and variant.value != parts[2]:
            fail(f"--variant {variant.value} and --key {key} disagree; fix: drop --variant")
        variant = opts.BaselineVariant(parts[2])
    elif key is not None:
        fail("--key names what --from-history derives; fix: add --from-history, or drop --key")
    if variant is None:
        fail("--variant: missing; fix: pass --variant stock|patched")
    if run_dir is not None:
        opts.existing_run_dir(run_dir)
    baseline_name = name if name is not None else variant.value

    from miles_amd.baseline.model import SCHEMA_PATH, BaselineError, load_baseline, parse_baseline
    from miles_amd.baseline.record import baseline_json_text, check_window, record_baseline
    from miles_amd.evidence.load import load_run
    from miles_amd.files import atomic_write_text

    try:
        template = load_baseline(variant.value)
    except BaselineError as exc:
        fail(f"--variant {variant.value}: the shipped template does not load: {exc}")
    others: list[Candidate] = []
    if from_history is not None:
        reference, others = _history_window(from_history, key or "")
        evidence = reference.evidence
    else:
        try:
            evidence = load_run(run_dir)  # type: ignore[arg-type]  # one of the two is given
        except OSError as exc:
            fail(f"--run-dir {run_dir}: {exc}")
    doc = record_baseline(
        evidence,
        template,
        variant=variant.value,
        name=baseline_name,
        recorded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        rollouts=num_rollouts,
        allow_no_preflight=allow_no_preflight,
        schema_ref=os.path.relpath(SCHEMA_PATH, out.resolve().parent),
    )
    if others:
        check_window(parse_baseline(baseline_json_text(doc), path=str(out)), others, key or "")
    if out.stem != baseline_name:  # the loader refuses a file not named after its baseline
        fail(
            f"--out {out}: a baseline file is named after its baseline ({baseline_name}); "
            f"fix: --out {out.with_name(baseline_name + '.json')} (in a review dir), "
            f"or --name {out.stem}"
        )
    try:
        atomic_write_text(out, baseline_json_text(doc), replace=force)
    except FileExistsError:
        fail(exists)
    except OSError as exc:
        fail(f"--out {out}: cannot write ({exc}); fix: choose a writable path")
    bands = sum(1 for rule in doc["rules"] if "band" in rule)
    window = f", {len(others)} other trusted runs of {key} pass it" if others else ""
    say(
        f"miles-amd baseline record: wrote {out} (baseline {doc['name']}, run "
        f"{doc['provenance']['run_id']}, {doc['run_shape']['rollouts']} rollouts, {bands} bands "
        f"recomputed{window}); review it with: miles-amd baseline diff {variant.value} {out}"
    )


def _history_window(path: Path, key: str) -> tuple[Candidate, list[Candidate]]:
    """The reference run of ``key`` in the history and the other trusted runs (exit 2 when
    too few; those that do not count are named)."""
    from miles_amd.baseline.keys import RunKeyError, run_key
    from miles_amd.baseline.record import Candidate, pick_reference
    from miles_amd.evidence.load import load_run
    from miles_amd.history.store import HistoryStore
    from miles_amd.run_dir import RunDir

    if not path.is_file():
        fail(f"--from-history {path}: no such history file; fix: name the run history")
    try:
        with HistoryStore(path, read_only=True) as store:
            runs = [r for r in store.runs(variant=key.split("/")[2]) if r.trusted]
    except (OSError, ValueError) as exc:
        fail(f"--from-history {path}: {exc}")
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
    return pick_reference(candidates, key, passed_over=passed_over)


def diff(
    old: BaselineArg,
    new: BaselineArg,
    output_format: Annotated[
        OutputFormat, opt("--format", "markdown: for a PR comment.", "<text|markdown|json>")
    ] = OutputFormat.text,
) -> None:
    """Print what a reviewer must look at between two baselines; exit 0 when they are the
    same, 1 when they differ (as diff(1)), 2 when either does not load."""
    from miles_amd.app.baselines import load
    from miles_amd.baseline.diff import diff_baselines, render_diff

    found = diff_baselines(load(old, "OLD"), load(new, "NEW"))
    typer.echo(render_diff(found, output_format.value), nl=False)
    raise typer.Exit(1 if found.differs else 0)


def _history_path(history_file: Path | None, fix: str) -> Path:
    path = opts.named_history(history_file)
    if path is None:
        fail(f"no history named; fix: pass --history PATH or set ${opts.HISTORY_ENV}")
    if not path.is_file():
        fail(f"--history {path}: no history there; fix: {fix.format(path=path)}")
    return path


def _mark(history_file: Path | None, run_id: int, *, untrusted: bool) -> None:
    from miles_amd.history.store import HistoryError, HistoryStore

    path = _history_path(history_file, "point --history at the store")
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    try:
        with HistoryStore(path) as store:
            changed = store.mark(run_id, untrusted=untrusted, now=now)
    except (HistoryError, sqlite3.Error) as exc:
        fail(f"--history {path}: {exc}; fix: `miles-amd history --history {path}` lists the ids")
    state = "untrusted" if untrusted else "trusted again"
    say(f"run {run_id} {'marked' if changed else 'was already'} {state} in {path}")


def mark_untrusted(run_id: RunIdArg, history_file: opts.HistoryOpt = None) -> None:
    """Take run ID out of the drift trend and the export's trusted runs (reversible)."""
    _mark(history_file, run_id, untrusted=True)


def mark_trusted(run_id: RunIdArg, history_file: opts.HistoryOpt = None) -> None:
    """Undo mark-untrusted for run ID (a failed gate stays untrusted)."""
    _mark(history_file, run_id, untrusted=False)


def history(
    ctx: typer.Context,
    history_file: opts.HistoryOpt = None,
    variant: Annotated[
        opts.AiterVariant | None, opt("--variant", None, opts.VARIANT_METAVAR)
    ] = None,
    baseline: Annotated[str | None, opt("--baseline", "Judged against it.", "<name>")] = None,
    limit: Annotated[int | None, opt("--limit", "The newest N runs.", INT, min=1)] = None,
    output_format: opts.FormatOpt = OutputFormat.text,
    plot: Annotated[Path | None, opt("--plot", "Write the trend PNG here.", PATH)] = None,
    export: Annotated[Path | None, opt("--export", "Upstream metric-history JSONL.", PATH)] = None,
) -> None:
    """List past gate verdicts with drift findings; plot trends; export for upstream miles."""
    from miles_amd.files import atomic_write_bytes
    from miles_amd.history import render
    from miles_amd.history.drift import by_identity
    from miles_amd.history.store import HistoryError, HistoryStore
    from miles_amd.report.plot import trend_png

    if ctx.invoked_subcommand is not None:
        return
    path = _history_path(
        history_file, "run `miles-amd gate --history {path}` first, or point --history at the store"
    )
    written = []
    try:
        with HistoryStore(path, read_only=True) as store:
            read = store.read_runs(
                variant=variant.value if variant else None, baseline=baseline, limit=limit
            )
            for line in read.skipped:  # a corrupt row is named and skipped, the rest listed
                typer.echo(escape.terminal(line), err=True)
            checked = by_identity(read.runs)
            if plot is not None:
                found = [d for group in checked for d in group.found]
                try:
                    atomic_write_bytes(plot, trend_png(read.runs, found))
                except OSError as exc:
                    fail(f"--plot {plot}: cannot write ({exc}); choose a writable path")
                written.append(f"trend plot written to {plot}")
            if export is not None:
                written.append(_export(store, export, path))
    except HistoryError as exc:
        fail(f"--history {path}: {exc}")
    show = {"text": render.render_text, "markdown": render.render_markdown, "json": render.to_json}
    typer.echo(show[output_format.value](read.runs, checked), nl=False)
    for line in written:
        say(line, err=output_format is not OutputFormat.text)


def _export(store: HistoryStore, export: Path, path: Path) -> str:
    from miles_amd.history.export import export_upstream

    try:
        done = export_upstream(store, export)
    except FileExistsError as exc:
        fail(
            f"--export: {exc}; nothing was changed; fix: name a new or empty dir, or an earlier one"
        )
    except OSError as exc:
        fail(f"--export {export}: cannot write ({exc}); choose a writable path")
    except (sqlite3.DatabaseError, ValueError) as exc:
        fail(f"--history {path}: --export cannot use the stored values ({exc})")
    left_out = (
        f"; {done.without_variant} run(s) without a recorded aiter variant left out "
        "(no upstream identity)" if done.without_variant else ""
    )  # fmt: skip
    tests = ", ".join(done.test_files) or "no test file"
    return f"exported {done.runs} run(s) to {export} (runs.jsonl, records/, {tests}){left_out}"
