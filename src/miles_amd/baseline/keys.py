"""Which reviewed baseline judges a run: its key (shape from plan.json's GPU count, else
env.json's; env.json's ``gpu_model``; the aiter variant), a missing piece a
:class:`RunKeyError`. A key without a reviewed baseline is record-only, judged by its
template's (the rccl control arm: stock's) baseline-free checks; a baseline of one GPU model
never judges another (``docs/ci.md``).
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
    """``str()`` is the key's path below the recipe's dir."""

    shape: str
    gpu: str
    variant: str

    def __str__(self) -> str:
        return f"{self.shape}/{self.gpu.lower()}/{self.variant}"


def run_key(evidence: RunEvidence) -> BaselineKey:
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
    path = baselines_root() / RECIPE_DIR / f"{key}.json"
    return path if path.is_file() else None


def template_for(variant: str) -> str:
    return variant if variant in BASELINE_VARIANTS else "stock"
