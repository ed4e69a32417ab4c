"""The two aiter builds the recipe is validated with, declared once.

``stock`` is the aiter the image ships; ``patched`` is ROCm/aiter with the kernel fix of
pull request 5694 (intermittent ``train/train_rollout_logprob_abs_diff`` spikes). Each has
its own shipped baseline of the same name. Decides the names and their descriptions only.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["AITER_VARIANTS", "AiterVariant", "describe"]

AiterVariant = Literal["stock", "patched"]
AITER_VARIANTS: tuple[AiterVariant, ...] = ("stock", "patched")
_DESCRIPTIONS: dict[str, str] = {
    "stock": "stock (as shipped in the image, without ROCm/aiter#5694)",
    "patched": "patched (with the kernel fix ROCm/aiter#5694)",
}


def describe(variant: str) -> str:
    """One line for reports and recorded provenance; ``KeyError`` for an unknown name."""
    return _DESCRIPTIONS[variant]
