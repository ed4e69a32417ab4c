"""Options that several ``miles-amd`` commands share, declared once, and their validation.

Decides each shared flag's name, default, help and the check of its value; commands take
them as annotated parameters. Every check runs while the command line is parsed, so a bad
value exits 2 (``miles_amd.cli.errors``) naming the flag before anything starts:

- counts (``--num-gpus``, ``--num-rollouts``) are integers >= 1;
- ``--timeout`` is a finite number of seconds > 0 (``nan``, ``inf`` and ``-5`` are refused);
- every directory is made absolute against the current directory (``os.path.abspath``, no
  symlink resolution), because the job runs in another process and directory.

Defaults of the recipe's directories are :class:`miles_amd.recipe.settings.Recipe`'s; the run
dir default is shared by ``preflight`` and ``train``, so the preflight's ``env.json`` lands
in the dir the run writes and ``baseline record --run-dir`` reads.

Old spellings stay as hidden aliases (``--num-rollout``, ``--gpus``): they parse but are not
shown in help; :func:`resolve_alias` merges one into its flag.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Annotated

import typer

from miles_amd.cli.errors import fail
from miles_amd.recipe import settings

DEFAULT_MODEL_DIR = Path(settings.DEFAULT_MODEL_DIR)
DEFAULT_DATA_DIR = Path(settings.DEFAULT_DATA_DIR)
DEFAULT_MILES_DIR = Path(settings.DEFAULT_MILES_DIR)
DEFAULT_MEGATRON_DIR = Path(settings.DEFAULT_MEGATRON_DIR)
DEFAULT_RUN_DIR = Path("runs/gpt-oss-20b-lora")
DEFAULT_HARDWARE = settings.Recipe.hardware.value
DEFAULT_NUM_GPUS = settings.Recipe.num_gpus
DEFAULT_NUM_ROLLOUTS = settings.Recipe.num_rollout
DEFAULT_TIMEOUT_S = 5400.0  # the published 20-rollout runs took about 66 minutes


def new_app(help_text: str) -> typer.Typer:
    """A typer app with plain help (no ``<bool>`` placeholder on flags, no boxes)."""
    return typer.Typer(
        help=help_text,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
        rich_markup_mode=None,
    )


def absolute_path(value: Path) -> Path:
    """``value`` made absolute against the current directory, ``..`` folded, links kept."""
    return Path(os.path.abspath(value))


def finite_positive_seconds(value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise typer.BadParameter(f"{value}: must be a finite number of seconds > 0, e.g. 5400")
    return value


def resolve_alias(value: int, alias: int | None, *, default: int, names: tuple[str, str]) -> int:
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


HardwareOpt = Annotated[
    str, typer.Option("--hardware", help="MI355X, MI350X, or auto (detect from the GPUs).")
]
NumGpusOpt = Annotated[int, typer.Option("--num-gpus", min=1, help="GPUs on the node.")]
GpusAliasOpt = Annotated[int | None, typer.Option("--gpus", min=1, hidden=True)]
ModelDirOpt = Annotated[Path, _dir_option("--model-dir", "Holds gpt-oss-20b-bf16/.")]
DataDirOpt = Annotated[Path, _dir_option("--data-dir", "Holds dapo-math-17k/dapo-math-17k.jsonl.")]
MilesDirOpt = Annotated[Path, _dir_option("--miles-dir", "miles checkout (train.py).")]
MegatronDirOpt = Annotated[Path, _dir_option("--megatron-dir", "Megatron-LM checkout.")]
RunDirOpt = Annotated[
    Path,
    _dir_option(
        "--run-dir",
        "The run's directory: preflight writes env.json here, train its evidence "
        "(job.log, job.json, tensorboard/, ci_history/, report/). Use the same dir for both.",
    ),
]
NumRolloutsOpt = Annotated[
    int, typer.Option("--num-rollouts", min=1, help="Rollouts (= optimizer steps).")
]
NumRolloutAliasOpt = Annotated[int | None, typer.Option("--num-rollout", min=1, hidden=True)]
ExtraArgsOpt = Annotated[
    str,
    typer.Option(
        "--extra-args",
        help="Extra train args, appended last (shell-split). Credentials (--wandb-key, "
        "--hf-token, --*-api-key, --*-token) are refused: use WANDB_API_KEY / HF_TOKEN.",
    ),
]
OverridePinnedOpt = Annotated[
    bool, typer.Option("--override-pinned", help="Let --extra-args replace pinned flags.")
]
GateOpt = Annotated[
    str | None,
    typer.Option(
        "--gate",
        help="After the run, gate it against this baseline: stock, patched, or a baseline "
        "JSON file (checked before anything runs).",
    ),
]
TimeoutOpt = Annotated[
    float,
    typer.Option(
        "--timeout",
        callback=finite_positive_seconds,
        help="Overall timeout of the job, seconds (finite, > 0).",
    ),
]
RequireEnvOpt = Annotated[
    bool,
    typer.Option(
        "--require-env",
        help="Fail a run dir without env.json (the hardware path: the mi355x test and CI); "
        "without it the environment check is not measured there.",
    ),
]
RayAddressOpt = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        help="Run on this existing Ray cluster (its Jobs API, e.g. http://head:8265; "
        "overrides RAY_ADDRESS): the job takes one whole node with miles_amd_mi355x_node "
        "and 8 GPUs, its evidence is pulled back (README: Run on a Ray cluster).",
    ),
]
NodeRootOpt = Annotated[
    str,
    typer.Option(
        "--node-root",
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
        help="Cluster mode: run these aiter variants at once, one node each (e.g. "
        "stock,patched), each in --run-dir/<variant> gated against its baseline, then the "
        "A/B comparison. The patched job gets AITER_PATCHED_DIR on its PYTHONPATH.",
    ),
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Print the plan; run nothing.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="With --dry-run: print the plan as JSON.")]
NoHistoryOpt = Annotated[
    bool, typer.Option("--no-history", help="Do not append the verdict to the run history.")
]
