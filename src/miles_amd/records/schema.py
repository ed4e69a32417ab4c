"""The JSON Schemas that ship, generated from the records' models: which file holds which.

``python -m miles_amd.records.schema`` (re)writes them; ``tests/unit/test_record_schemas.py``
holds each shipped file equal to what its model generates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from miles_amd.records.model import json_schema

__all__ = ["SHIPPED", "generated"]

_PACKAGE = Path(__file__).resolve().parent.parent
# shipped file (package data) -> (its model's module, class, title)
SHIPPED: dict[Path, tuple[str, str, str]] = {
    _PACKAGE / "canary" / "canary.schema.json": (
        "miles_amd.records.canary",
        "CanaryRecord",
        "canary.json: the all-reduce canary's record (miles_amd.records.canary.CanaryRecord)",
    ),
}


def generated(path: Path) -> str:
    """The text the shipped schema ``path`` must hold."""
    import importlib

    module, name, title = SHIPPED[path]
    schema: dict[str, Any] = json_schema(getattr(importlib.import_module(module), name), title)
    return json.dumps(schema, indent=2) + "\n"


if __name__ == "__main__":
    for shipped in SHIPPED:
        shipped.write_text(generated(shipped), encoding="utf-8")
        print(shipped)
