"""``plan.json``: the launch plan the driver executed (``recipe``, ``aiter_variant``), and
its identity in the history: the first 12 hex digits of the SHA-256 of the recipe without
its locations and tracking switches (``recipe.settings.NOT_IDENTITY``).
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
