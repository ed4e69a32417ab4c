"""``plan.json``: the launch plan the driver executed, read into one record.

Decides:

- ``recipe``: plan.json's resolved recipe (``Recipe.as_dict``), required, an object;
- ``aiter_variant``: the variant the job's env was set for (one of
  ``miles_amd.variants.AITER_VARIANTS``), null when none was asked for;
- ``identity_digest``: the first 12 hex digits of the SHA-256 of the recipe without its
  locations and tracking switches (``recipe.settings.NOT_IDENTITY``): the run's identity in
  the history.

A plan.json that is not such an object is a ``ValueError`` naming the field (evidence/ makes
it a ``plan_json`` problem; ``records.model`` reads it). Pure.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from miles_amd.recipe.settings import NOT_IDENTITY
from miles_amd.records.model import As, parse
from miles_amd.variants import AiterVariant

__all__ = ["PlanRecord"]


@dataclass(frozen=True)
class PlanRecord:
    """plan.json, read; see the module doc."""

    recipe: Mapping[str, object]
    aiter_variant: Annotated[str, As(AiterVariant)] | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanRecord:
        return parse(cls, data)

    @property
    def identity_digest(self) -> str:
        kept = {k: v for k, v in self.recipe.items() if k not in NOT_IDENTITY}
        text = json.dumps(kept, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
