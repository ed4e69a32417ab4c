"""A baseline file's text: the layout ``baseline record`` writes.

Decides the text only: 2-space indent, a list of numbers or strings on one line (a series
reads as one row), a mapping of numbers in a list on one line (a look's boundary), strict
JSON (a non-finite number raises ``ValueError``), UTF-8 kept as
written, a final newline; the shipped files follow the same layout. Reading a baseline is
``miles_amd.strict_json``'s (duplicate keys, non-finite and oversized numbers refused, with
the JSON path). What the document holds is ``miles_amd.baseline.record``'s and ``.model``'s;
writing it to disk is ``miles_amd.files``'.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["baseline_json_text"]


def baseline_json_text(doc: Mapping[str, Any]) -> str:
    """The document as a baseline file: 2-space indent, number lists on one line, UTF-8."""
    return _dump(doc, 0) + "\n"


def _dump(value: Any, level: int) -> str:
    pad, end = "  " * (level + 1), "  " * level
    if isinstance(value, Mapping) and value:
        items = [f"{pad}{json.dumps(k)}: {_dump(v, level + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    if isinstance(value, list) and any(isinstance(v, (Mapping, list)) for v in value):
        items = [f"{pad}{_row(v) if _numbers(v) else _dump(v, level + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + "\n" + end + "]"
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _numbers(value: Any) -> bool:
    """A mapping of numbers only (a look's boundary)."""
    return (
        isinstance(value, Mapping)
        and bool(value)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values())
    )


def _row(value: Mapping[str, Any]) -> str:
    return json.dumps(dict(value), ensure_ascii=False, allow_nan=False)
