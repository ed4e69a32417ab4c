"""Options that several ``miles-amd`` commands share, declared once, and their validation.

Decides:

- each shared flag's name, default, help and the check of its value, run while the command
  line is parsed, so a bad value exits 2 naming the flag before anything starts;
- the checks: counts >= 1 (rollouts at most :data:`MAX_ROLLOUTS`, GPUs :data:`MAX_GPUS`),
  ``--timeout`` finite, > 0 and at most :data:`MAX_TIMEOUT_S`, every directory made absolute;
- one flag name per concept, old spellings kept as hidden aliases (:func:`resolve_alias`);
- the output format, the run history flags and the aiter-variant choices
  (:data:`AiterVariant`, :data:`BaselineVariant`).

The recipe's directory defaults are ``Recipe``'s (``miles_amd.recipe.settings``).

Explained in ``docs/cli.md`` ("Shared options").
"""

from __future__ import annotations

import math
import os
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from miles_amd.cli.errors import fail
from miles_amd.recipe import settings
from miles_amd.variants import AITER_VARIANTS, BASELINE_VARIANTS

if TYPE_CHECKING:
    from miles_amd.rules.model import Baseline

DEFAULT_MODEL_DIR = Path(settings.DEFAULT_MODEL_DIR)
DEFAULT_DATA_DIR = Path(settings.DEFAULT_DATA_DIR)
DEFAULT_MILES_DIR = Path(settings.DEFAULT_MILES_DIR)
DEFAULT_MEGATRON_DIR = Path(settings.DEFAULT_MEGATRON_DIR)
DEFAULT_RUN_DIR = Path("runs/gpt-oss-20b-lora")
DEFAULT_HARDWARE = settings.Recipe.hardware.value
DEFAULT_NUM_GPUS = settings.Recipe.num_gpus
DEFAULT_NUM_ROLLOUTS = settings.Recipe.num_rollout
DEFAULT_TIMEOUT_S = 5400.0  # the published 20-rollout runs took about 66 minutes
# Bounds of what a command line may ask for: past them a run, its bands and its looks are not
# a verdict anyone waits for (100,000 rollouts at 66 min per 20 is 7.5 months of a node), and
# an unbounded count exhausts memory in the gate's bands (10**12 rollouts: MemoryError) and a
# timeout past time_t overflows the driver's waits.
MAX_ROLLOUTS = 100_000
MAX_GPUS = max(settings.GPUS_PER_NODE.values())  # the recipe runs on one node
MAX_TIMEOUT_S = 30 * 24 * 3600.0  # 30 days
HISTORY_ENV = "MILES_AMD_HISTORY"
T = TypeVar("T", int, int | None)
BASELINE_METAVAR = "<stock|patched|path>"
INT = "<int>"


class OutputFormat(str, Enum):
    """What a report-printing command writes to stdout."""

    text = "text"
    json = "json"
    markdown = "markdown"


# The choices of every aiter-variant flag, built from the one declaration of the variants.
AiterVariant = Enum(  # type: ignore[misc]
    "AiterVariant", {name: name for name in AITER_VARIANTS}, type=str
)
# The variants a baseline can be recorded for (the rccl control arm has none).
BaselineVariant = Enum(  # type: ignore[misc]
    "BaselineVariant", {name: name for name in BASELINE_VARIANTS}, type=str
)
VARIANT_METAVAR = "<" + "|".join(AITER_VARIANTS) + ">"
BASELINE_VARIANT_METAVAR = "<" + "|".join(BASELINE_VARIANTS) + ">"


def new_app(help_text: str, *, completion: bool = False) -> typer.Typer:
    """A typer app with plain help (no ``<bool>`` placeholder on flags, no boxes);
    ``completion``: the root app's ``--install-completion`` / ``--show-completion``."""
    return typer.Typer(
        help=help_text,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=completion,
        rich_markup_mode=None,
    )


def absolute_path(param: typer.CallbackParam, value: Path) -> Path:
    """``value`` made absolute against the current directory, ``..`` folded, links kept; a
    path holding a control or format character (a newline, ESC, a bidi override, a zero-width
    mark: ``miles_amd.escape.unsafe_chars``) is refused, since it would reach the job's argv."""
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


def load_baseline_option(spec: str, flag: str) -> Baseline:
    """The baseline ``spec`` (stock, patched or a path) names, loaded once; else exit 2."""
    from miles_amd.app.baselines import load
    from miles_amd.app.errors import AppError

    try:
        return load(spec, flag)
    except AppError as exc:
        fail(str(exc))


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


def new_run_dir(path: Path, flag: str = "--run-dir") -> Path:
    """``path`` if it is a directory or absent (a run creates it); a file exits 2."""
    if path.exists() and not path.is_dir():
        fail(f"{flag} {path}: is a file, not a directory; fix: name a directory for the run")
    return path


def named_history(given: Path | None, no_history: bool = False) -> Path | None:
    """The history to append to: ``--history``, else ``$MILES_AMD_HISTORY``, else none."""
    if no_history:
        return None
    if given is not None:
        return given
    from_env = os.environ.get(HISTORY_ENV)
    return Path(from_env) if from_env else None


def resolve_alias(value: T, alias: T | None, *, default: T, names: tuple[str, str]) -> T:
    """The value of a flag given either as ``names[0]`` or its hidden old spelling ``names[1]``.

    The old spelling wins unless the flag was also set to a different value (an error).
    """
    if alias is None:
        return value
    if value != default and value != alias:
        fail(f"{names[0]} {value} and {names[1]} {alias} disagree; pass only {names[0]}")
    return alias


def _dir_option(flag: str, help_text: str) -> typer.models.OptionInfo:
    return typer.Option(flag, help=help_text, callback=absolute_path)


# The flag of each recipe option is the one its Recipe field declares (``Setting.cli``).
RECIPE_FLAG = settings.FIELD_FLAGS


HardwareOpt = Annotated[
    str,
    typer.Option(
        RECIPE_FLAG["hardware"],
        metavar="<MI355X|MI350X|auto>",
        help="MI355X, MI350X, or auto (detect from the GPUs).",
    ),
]
NumGpusOpt = Annotated[
    int,
    typer.Option(
        RECIPE_FLAG["num_gpus"],
        min=1,
        max=MAX_GPUS,
        metavar=INT,
        help=f"GPUs on the node (1 to {MAX_GPUS}).",
    ),
]
GpusAliasOpt = Annotated[int | None, typer.Option("--gpus", min=1, max=MAX_GPUS, hidden=True)]
ModelDirOpt = Annotated[Path, _dir_option(RECIPE_FLAG["model_dir"], "Holds gpt-oss-20b-bf16/.")]
DataDirOpt = Annotated[
    Path, _dir_option(RECIPE_FLAG["data_dir"], "Holds dapo-math-17k/dapo-math-17k.jsonl.")
]
MilesDirOpt = Annotated[Path, _dir_option(RECIPE_FLAG["miles_dir"], "miles checkout (train.py).")]
MegatronDirOpt = Annotated[Path, _dir_option(RECIPE_FLAG["megatron_dir"], "Megatron-LM checkout.")]
RunDirOpt = Annotated[
    Path,
    _dir_option(
        "--run-dir",
        "The run's directory: preflight writes env.json here, train its evidence "
        "(job.log, job.json, tensorboard/, ci_history/, report/). Use the same dir for both.",
    ),
]
NumRolloutsOpt = Annotated[
    int,
    typer.Option(
        RECIPE_FLAG["num_rollout"],
        min=1,
        max=MAX_ROLLOUTS,
        metavar=INT,
        help=f"Rollouts (= optimizer steps, 1 to {MAX_ROLLOUTS}).",
    ),
]
NumRolloutAliasOpt = Annotated[
    int | None, typer.Option("--num-rollout", min=1, max=MAX_ROLLOUTS, hidden=True)
]
ExtraArgsOpt = Annotated[
    str,
    typer.Option(
        RECIPE_FLAG["extra_args"],
        metavar="<args>",
        help="Extra train args, appended last (shell-split). Credentials (--wandb-key, "
        "--hf-token, --*-api-key, --*-token) are refused: use WANDB_API_KEY / HF_TOKEN.",
    ),
]
OverridePinnedOpt = Annotated[
    bool,
    typer.Option(RECIPE_FLAG["override_pinned"], help="Let --extra-args replace pinned flags."),
]
GateOpt = Annotated[
    str | None,
    typer.Option(
        "--gate",
        metavar=BASELINE_METAVAR,
        help="After the run, gate it against this baseline: stock, patched, or a baseline "
        "JSON file (checked before anything runs).",
    ),
]
TimeoutOpt = Annotated[
    float,
    typer.Option(
        "--timeout",
        metavar="<seconds>",
        callback=finite_positive_seconds,
        help="Overall timeout of the job, seconds (finite, > 0); stopping it and writing "
        "its end take at most 60 s more.",
    ),
]
RequireEnvOpt = Annotated[
    bool,
    typer.Option(
        "--require-env",
        help="Fail a run dir without env.json or job.json (the hardware path: the mi355x "
        "test and CI); without it the environment check is not measured there.",
    ),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        metavar="<url>",
        help="Run on this existing Ray cluster (its Jobs API, e.g. http://head:8265; "
        "overrides RAY_ADDRESS): the job takes one whole node with miles_amd_mi355x_node "
        "and 8 GPUs, its evidence is pulled back (docs/cluster.md).",
    ),
]
NodeRootOpt = Annotated[
    str,
    typer.Option(
        "--node-root",
        metavar="<path>",
        help="Cluster mode: the dir on the job's node under which it writes its evidence, "
        "pulled back into --run-dir (may use ${VAR} of the node's environment).",
    ),
]
SharedFsOpt = Annotated[
    bool,
    typer.Option(
        "--shared-fs",
        help="Cluster mode: the job's node sees --run-dir at the same path (shared "
        "storage); it writes the evidence there and nothing is pulled back.",
    ),
]
VariantsOpt = Annotated[
    str | None,
    typer.Option(
        "--variants",
        metavar="<stock,patched|stock,rccl>",
        help="Cluster mode: run these aiter variants at once, one node each (e.g. "
        "stock,patched), each in --run-dir/<variant> gated against its baseline (rccl: the "
        "stock baseline's baseline-free checks), then the A/B comparison (patched or rccl "
        "against stock). The patched job gets AITER_PATCHED_DIR on its PYTHONPATH.",
    ),
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the plan; run nothing.")]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="With --dry-run (only): print the plan as JSON.")
]


def check_json_needs_dry_run(as_json: bool, dry_run: bool) -> None:
    """``--json`` describes a plan; without ``--dry-run`` nothing would print one (exit 2)."""
    if as_json and not dry_run:
        fail("--json prints the plan and needs --dry-run; fix: add --dry-run, or drop --json")


FormatOpt = Annotated[
    OutputFormat,
    typer.Option("--format", metavar="<text|json|markdown>", help="What to print to stdout."),
]
HistoryOpt = Annotated[
    Path | None,
    typer.Option(
        "--history",
        metavar="<path>",
        help=f"The run history (SQLite; default ${HISTORY_ENV}; none when neither is set).",
    ),
]
NoHistoryOpt = Annotated[
    bool,
    typer.Option(
        "--no-history", help=f"Do not append the verdict to a history (not even ${HISTORY_ENV})."
    ),
]
AiterVariantOpt = Annotated[
    AiterVariant | None,
    typer.Option(
        "--aiter-variant",
        metavar=VARIANT_METAVAR,
        help="The run's aiter: stock, patched (ROCm/aiter#5694), or rccl (the control arm: "
        "aiter as installed, SGLANG_USE_AITER_AR=0, SGLang's own all-reduce). Sets the job's "
        "SGLANG_USE_AITER / SGLANG_USE_AITER_AR; patched puts AITER_PATCHED_DIR, when set, "
        "first on the PYTHONPATH of the canary and the job.",
    ),
]
