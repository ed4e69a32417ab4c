"""Which reviewed baseline judges a run: the key (recipe shape, GPU model, aiter variant).

:func:`run_key` reads a run's key from what it recorded (shape from plan.json's GPU count,
else env.json's; model from env.json's ``gpu_model``; the variant), a missing piece a
:class:`RunKeyError` naming it; :func:`reviewed_path` is the key's reviewed baseline or None
(record-only: evidence checks judge, statistical rules are recorded); :func:`template_for`
the baseline whose rules judge a record-only run (the rccl control arm takes stock's). A
baseline of one GPU model never judges another. Explained in ``docs/ci.md`` ("Baselines per
shape and GPU").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from miles_amd.baseline.model import RECIPE_DIR, baselines_root
from miles_amd.recipe.settings import shape_of
from miles_amd.variants import BASELINE_VARIANTS

if TYPE_CHECKING:
    from miles_amd.evidence.types import RunEvidence


class RunKeyError(ValueError):
    """A run whose key cannot be read; ``str()`` names what is missing and the fix."""


@dataclass(frozen=True)
class BaselineKey:
    """A reviewed baseline's key; ``str()`` is its path below the recipe's dir."""

    shape: str
    gpu: str
    variant: str

    def __str__(self) -> str:
        return f"{self.shape}/{self.gpu.lower()}/{self.variant}"


def run_key(evidence: RunEvidence) -> BaselineKey:
    """The key of the run ``evidence`` was read from (module doc)."""
    where = evidence.run_dir
    gpus = evidence.plan.recipe.get("num_gpus") if evidence.plan is not None else None
    if gpus is None and evidence.env is not None:
        gpus = evidence.env.gpu_count
    if not isinstance(gpus, int):
        raise RunKeyError(
            f"{where}: records no GPU count (plan.json's recipe, env.json's gpus fact); "
            "fix: gate a run dir that miles-amd preflight and train wrote, or pass "
            "--baseline stock|patched|PATH"
        )
    model = evidence.env.value("gpu_model") if evidence.env is not None else ""
    if not model:
        raise RunKeyError(
            f"{where}: env.json records no gpu_model (the GPU is unknown); fix: run "
            f"`miles-amd preflight --run-dir {where}` on the node, or pass --baseline PATH"
        )
    variant = evidence.variant
    if variant is None:
        raise RunKeyError(
            f"{where}: records no aiter variant (env.json, plan.json); fix: run preflight "
            "with --aiter-variant, or pass --baseline stock|patched|PATH"
        )
    return BaselineKey(shape_of(gpus), model.split()[0], template_for(variant))


def reviewed_path(key: BaselineKey) -> Path | None:
    """The reviewed baseline file of ``key``; None when there is none (record-only)."""
    path = baselines_root() / RECIPE_DIR / f"{key}.json"
    return path if path.is_file() else None


def template_for(variant: str) -> str:
    """The shipped baseline whose rules judge ``variant`` when its key has none (module doc)."""
    return variant if variant in BASELINE_VARIANTS else "stock"
