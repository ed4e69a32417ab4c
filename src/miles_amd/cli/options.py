"""What every ``miles-amd`` command shares: its options, its error line, its output streams.

A shared flag's value is checked while the command line is parsed (exit 2 naming the flag);
old spellings are hidden aliases. The one error line is ``miles-amd: error: <message>``
(folded, escaped, redacted), also for the errors every command maps the same
(:func:`exit_code_of`); a closed stdout or stderr changes no exit code.
"""

from __future__ import annotations

import functools
import io
import math
import os
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from miles_amd.exit_codes import EXIT_BAD_INPUT, EXIT_CODES_HELP, EXIT_FAILED
from miles_amd.recipe import settings
from miles_amd.variants import AITER_VARIANTS, BASELINE_VARIANTS

ERROR_PREFIX = "miles-amd: error: "
DEFAULT_MODEL_DIR = Path(settings.DEFAULT_MODEL_DIR)
DEFAULT_DATA_DIR = Path(settings.DEFAULT_DATA_DIR)
DEFAULT_MILES_DIR = Path(settings.DEFAULT_MILES_DIR)
DEFAULT_MEGATRON_DIR = Path(settings.DEFAULT_MEGATRON_DIR)
DEFAULT_RUN_DIR = Path("runs/gpt-oss-20b-lora")
DEFAULT_HARDWARE = settings.Recipe.hardware.value
DEFAULT_NUM_GPUS = settings.Recipe.num_gpus
DEFAULT_NUM_ROLLOUTS = settings.Recipe.num_rollout
DEFAULT_TIMEOUT_S = 5400.0  # the published 20-rollout runs took about 66 minutes
# past these an unbounded count exhausts the bands' memory, a timeout overflows time_t waits
MAX_ROLLOUTS = 100_000
MAX_GPUS = max(settings.GPUS_PER_NODE.values())  # the recipe runs on one node
MAX_TIMEOUT_S = 30 * 24 * 3600.0  # 30 days
HISTORY_ENV = "MILES_AMD_HISTORY"
BASELINE_METAVAR = "<stock|patched|path>"
INT, PATH = "<int>", "<path>"
# Bad input whichever command meets it, matched by class name (their modules are imported only
# by the commands that raise them); CanaryRed is exit 1, a DriverError carries its own code.
BAD_INPUT_ERRORS = frozenset(
    {"AppError", "ClusterError", "DashboardError", "HardwareDetectionError", "InputError",
     "RecipeError", "RecordError", "VariantsError"}
)  # fmt: skip


def error_line(message: str) -> str:
    from miles_amd.escape import terminal
    from miles_amd.redact import redact

    return ERROR_PREFIX + terminal(redact(" ".join(message.split())))


def exit_code_of(exc: BaseException) -> int | None:
    """The exit code of one of this package's errors a command lets through; else None."""
    names = {c.__name__ for c in type(exc).__mro__ if c.__module__.startswith("miles_amd.")}
    if "CanaryRed" in names:
        return EXIT_FAILED
    if "DriverError" in names:
        return int(getattr(exc, "exit_code", EXIT_FAILED))
    return EXIT_BAD_INPUT if names & BAD_INPUT_ERRORS else None


def add_command(app: typer.Typer, name: str, command: Callable[..., None]) -> None:
    """``command`` as ``name`` of ``app``: an error of :func:`exit_code_of` is one line."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            command(*args, **kwargs)
        except Exception as exc:
            code = exit_code_of(exc)
            if code is None:
                raise
            fail(str(exc), code=code)

    app.command(name, epilog=EXIT_CODES_HELP)(run)


def say(line: str, *, err: bool = False) -> None:
    """Print ``line`` (it may hold a foreign string) escaped."""
    from miles_amd.escape import terminal

    typer.echo(terminal(line), err=err)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    typer.echo(error_line(message), err=True)
    raise typer.Exit(code)


class PipeSafeWriter(io.RawIOBase):
    """Writes to ``fd``; after the first ``BrokenPipeError`` every write is dropped."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd, self.broken = fd, False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:  # a terminal stays one (the job log's Progress asks)
        return os.isatty(self.fd)

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(data).cast("B")
        size = len(view)
        while view and not self.broken:
            try:
                view = view[os.write(self.fd, view) :]
            except BrokenPipeError:
                self.broken = True
        return size


def guard_std_streams() -> None:
    """Put a :class:`PipeSafeWriter` under ``sys.stdout`` and ``sys.stderr`` (real files only)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            fd = stream.fileno()
            stream.flush()
        except (AttributeError, OSError, ValueError):
            continue  # not a real file (captured): nothing to guard
        safe = io.TextIOWrapper(
            io.BufferedWriter(PipeSafeWriter(fd)),  # type: ignore[type-var]
            encoding=stream.encoding,
            errors=stream.errors,
            line_buffering=True,
            write_through=name == "stderr",
        )
        setattr(sys, name, safe)


class OutputFormat(str, Enum):
    text = "text"
    json = "json"
    markdown = "markdown"


AiterVariant = Enum(  # type: ignore[misc]
    "AiterVariant", {name: name for name in AITER_VARIANTS}, type=str
)
BaselineVariant = Enum(  # type: ignore[misc]  # the rccl control arm has no baseline
    "BaselineVariant", {name: name for name in BASELINE_VARIANTS}, type=str
)
VARIANT_METAVAR = "<" + "|".join(AITER_VARIANTS) + ">"


def new_app(help_text: str, *, completion: bool = False) -> typer.Typer:
    """A typer app with plain help (no boxes, no ``<bool>`` placeholders)."""
    return typer.Typer(
        help=help_text,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=completion,
        rich_markup_mode=None,
    )


def absolute_path(param: typer.CallbackParam, value: Path) -> Path:
    """``value`` made absolute (links kept); a control character (it would reach the job's
    argv) is refused."""
    from miles_amd.escape import unsafe_chars

    unsafe = unsafe_chars(str(value))
    if unsafe:
        raise typer.BadParameter(
            f"the path holds {', '.join(dict.fromkeys(unsafe))} (a control or invisible "
            "character); fix: rename it or name another path",
            param=param,  # type: ignore[arg-type]
        )
    return Path(os.path.abspath(value))


def finite_positive_seconds(value: float) -> float:
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_S:
        raise typer.BadParameter(
            f"{value}: must be a number of seconds > 0 and at most {MAX_TIMEOUT_S:.0f} "
            "(30 days), e.g. 5400"
        )
    return value


def existing_run_dir(path: Path, flag: str = "--run-dir") -> Path:
    """``path`` if it is a run dir (``RunDir.is_run_dir``); else exit 2 naming ``flag``."""
    from miles_amd.run_dir import RunDir

    if path.is_file():
        fail(f"{flag} {path}: is a file, not a directory; fix: point it at a run directory")
    if not path.is_dir():
        fail(f"{flag} {path}: no such directory; fix: point it at a run directory")
    run = RunDir(path)
    if not run.is_run_dir:
        names = ", ".join(p.name + ("/" if p.suffix == "" else "") for p in run.markers)
        fail(f"{flag} {path}: not a run directory (none of {names} in it); fix: point it at one")
    return path


def new_run_dir(path: Path) -> None:
    if path.exists() and not path.is_dir():
        fail(f"--run-dir {path}: is a file, not a directory; fix: name a directory for the run")


def named_history(given: Path | None, no_history: bool = False) -> Path | None:
    """``--history``, else ``$MILES_AMD_HISTORY``, else none."""
    from_env = os.environ.get(HISTORY_ENV)
    return None if no_history else given or (Path(from_env) if from_env else None)


def resolve_alias(value: Any, alias: Any, *, default: Any, names: tuple[str, str]) -> Any:
    """A flag given as ``names[0]`` or its hidden old spelling (which wins; both set and
    different: exit 2)."""
    if alias is None:
        return value
    if value != default and value != alias:
        fail(f"{names[0]} {value} and {names[1]} {alias} disagree; pass only {names[0]}")
    return alias


def check_json_needs_dry_run(as_json: bool, dry_run: bool) -> None:
    if as_json and not dry_run:
        fail("--json prints the plan and needs --dry-run; fix: add --dry-run, or drop --json")


def opt(flag: str, help_text: str | None = None, metavar: str | None = None, **kw: Any) -> Any:
    return typer.Option(flag, help=help_text, metavar=metavar, **kw)


def _dir(field: str, help_text: str) -> Any:
    return opt(settings.FIELD_FLAGS[field], help_text, callback=absolute_path)


FLAG = settings.FIELD_FLAGS  # a recipe option's flag is its Recipe field's (Setting.cli)
HardwareOpt = Annotated[str, opt(FLAG["hardware"], "auto: detect.", "<MI355X|MI350X|auto>")]
NumGpusOpt = Annotated[int, opt(FLAG["num_gpus"], "GPUs on the node.", INT, min=1, max=MAX_GPUS)]
GpusAliasOpt = Annotated[int | None, opt("--gpus", min=1, max=MAX_GPUS, hidden=True)]
ModelDirOpt = Annotated[Path, _dir("model_dir", "Holds gpt-oss-20b-bf16/.")]
DataDirOpt = Annotated[Path, _dir("data_dir", "Holds dapo-math-17k/dapo-math-17k.jsonl.")]
MilesDirOpt = Annotated[Path, _dir("miles_dir", "miles checkout (train.py).")]
MegatronDirOpt = Annotated[Path, _dir("megatron_dir", "Megatron-LM checkout.")]
RunDirOpt = Annotated[
    Path, opt("--run-dir", "The run's evidence; preflight and train share it.", PATH,
              callback=absolute_path)
]  # fmt: skip
RolloutsOpt = Annotated[
    int, opt(FLAG["num_rollout"], "Rollouts (optimizer steps).", INT, min=1, max=MAX_ROLLOUTS)
]
RolloutAliasOpt = Annotated[int | None, opt("--num-rollout", min=1, max=MAX_ROLLOUTS, hidden=True)]
ExtraArgsOpt = Annotated[
    str, opt(FLAG["extra_args"], "Extra train args, last; no credentials.", "<args>")
]
OverridePinnedOpt = Annotated[bool, opt(FLAG["override_pinned"], "--extra-args may replace.")]
GateOpt = Annotated[str | None, opt("--gate", "Gate the run against it.", BASELINE_METAVAR)]
TimeoutOpt = Annotated[
    float, opt("--timeout", "Of the job (+60 s to stop it).", "<seconds>",
               callback=finite_positive_seconds)
]  # fmt: skip
RequireEnvOpt = Annotated[bool, opt("--require-env", "Fail without env.json or job.json.")]
RayAddressOpt = Annotated[
    str | None, opt("--ray-address", "An existing cluster's Jobs API (docs/cluster.md).", "<url>")
]
NodeRootOpt = Annotated[str, opt("--node-root", "Cluster: where the node writes.", PATH)]
SharedFsOpt = Annotated[bool, opt("--shared-fs", "Cluster: the node sees --run-dir.")]
VariantsOpt = Annotated[
    str | None,
    opt(
        "--variants",
        "Cluster: one job per variant, then A/B.",
        "<stock,patched|stock,rccl>",
    ),
]
DryRunOpt = Annotated[bool, opt("--dry-run", "Print the plan; run nothing.")]
JsonOpt = Annotated[bool, opt("--json", "With --dry-run: the plan as JSON.")]
FormatOpt = Annotated[OutputFormat, opt("--format", None, "<text|json|markdown>")]
HistoryOpt = Annotated[
    Path | None, opt("--history", f"The run history (default ${HISTORY_ENV}).", PATH)
]
NoHistoryOpt = Annotated[bool, opt("--no-history", f"Ignore --history and ${HISTORY_ENV}.")]
AiterVariantOpt = Annotated[
    AiterVariant | None, opt("--aiter-variant", "The run's aiter (docs/cli.md).", VARIANT_METAVAR)
]
