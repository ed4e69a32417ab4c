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
    _PACKAGE / "report" / "report.schema.json": (
        "miles_amd.report.schema",
        "Report",
        "miles-amd gate report (report.json)",
    ),
}


def generated(path: Path) -> str:
    """The text the shipped schema ``path`` must hold."""
    import importlib

    module, name, title = SHIPPED[path]
    schema: dict[str, Any] = json_schema(getattr(importlib.import_module(module), name), title)
    return _compact(schema) + "\n"


def _compact(value: Any, indent: int = 0) -> str:
    """``value`` as JSON, a value on one line when it fits 100 columns, else one per line."""
    flat = json.dumps(value)
    if indent + len(flat) <= 100 or not isinstance(value, (dict, list)) or not value:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k)}: {_compact(v, indent + 2)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + _compact(v, indent + 2) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


if __name__ == "__main__":
    for shipped in SHIPPED:
        shipped.write_text(generated(shipped), encoding="utf-8")
        print(shipped)
