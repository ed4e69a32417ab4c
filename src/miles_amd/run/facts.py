"""What a preflight probe is given and what it reports, shared by every probe module.

A probe reports a ``records.env.Fact`` (the fact env.json records). Decides the shape of
:class:`PreflightConfig` (where the recipe's pieces are and what the node must be). The
probes live in ``probes_node`` (GPUs, ROCm, torch) and ``probes_stack`` (packages,
checkouts, aiter, inputs, disk); the table of probes, running them and ``env.json`` in
``preflight``. Decides nothing about a particular fact.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from miles_amd.recipe.settings import CHECKPOINT_NAME, DATASET_DIR_NAME, DATASET_FILE_NAME

if TYPE_CHECKING:
    from miles_amd.recipe.settings import Recipe


IMAGE = "rocm/sgl-dev:miles-rocm720-mi35x"


@dataclass(frozen=True)
class PreflightConfig:
    """Where the recipe's pieces are and what the node must be."""

    model_dir: Path
    data_dir: Path
    miles_dir: Path
    megatron_dir: Path
    run_dir: Path
    expected_gpus: int = 8
    expected_arch: str = "gfx950"
    expected_rocm: str = "7.2"
    aiter_variant: str | None = None
    min_free_gib: float = 20.0  # TensorBoard events, CI history and job.log of one run
    rocm_root: Path = Path("/opt/rocm")

    @property
    def checkpoint_dir(self) -> Path:
        return self.model_dir / CHECKPOINT_NAME

    @property
    def dataset_file(self) -> Path:
        return self.data_dir / DATASET_DIR_NAME / DATASET_FILE_NAME

    def recipe(self) -> Recipe:
        """The recipe with these dirs and GPU count (for a probe that needs its argv)."""
        from miles_amd.recipe.settings import Recipe

        return Recipe(
            num_gpus=self.expected_gpus,
            model_dir=str(self.model_dir),
            data_dir=str(self.data_dir),
            miles_dir=str(self.miles_dir),
            megatron_dir=str(self.megatron_dir),
        )

    def as_dict(self) -> dict[str, object]:
        """JSON-ready, paths as strings (for ``env.json``)."""
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


def find_spec(module: str) -> importlib.machinery.ModuleSpec | None:
    """``importlib.util.find_spec`` that answers None instead of raising when a parent
    package is absent.

    Finding ``a.b`` imports ``a`` (cheap for the namespace package ``megatron``); ``a.b``
    itself is not imported.
    """
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
