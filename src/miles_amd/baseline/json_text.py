"""A baseline file's text, both ways: the one layout ``baseline record`` writes, strict reading.

Decides the text only. Writing (:func:`baseline_json_text`): 2-space indent, a list of
numbers or strings on one line (a series reads as one row), strict JSON (a non-finite number
raises ``ValueError``), UTF-8 kept as written, a final newline; the shipped files follow the
same layout. Reading (:func:`loads_finite`): JSON whose every number is finite. Python's
``json`` accepts ``NaN``/``Infinity`` literals and turns a float literal beyond the float
range (``1e999``, ``-2e308``) into an infinity; both are refused, naming the JSON path of the
first one (``$.rules[3].threshold``). What the document holds is
``miles_amd.baseline.record``'s and ``.model``'s; writing it to disk is ``miles_amd.files``'.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["NonFiniteNumberError", "baseline_json_text", "loads_finite"]

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class NonFiniteNumberError(ValueError):
    """``str()``: ``<JSON path>: non-finite number <literal as written> ...``."""


def baseline_json_text(doc: Mapping[str, Any]) -> str:
    """The document as a baseline file: 2-space indent, number lists on one line, UTF-8."""
    return _dump(doc, 0) + "\n"


def _dump(value: Any, level: int) -> str:
    pad, end = "  " * (level + 1), "  " * level
    if isinstance(value, Mapping) and value:
        items = [f"{pad}{json.dumps(k)}: {_dump(v, level + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    if isinstance(value, list) and any(isinstance(v, (Mapping, list)) for v in value):
        items = [f"{pad}{_dump(v, level + 1)}" for v in value]
        return "[\n" + ",\n".join(items) + "\n" + end + "]"
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


class _NonFinite(str):
    """A non-finite number, kept as written until its JSON path is known."""


def _float(text: str) -> float | _NonFinite:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text)


def loads_finite(text: str) -> Any:
    """``json.loads`` refusing every non-finite number (:class:`NonFiniteNumberError`)."""
    raw = json.loads(text, parse_constant=_NonFinite, parse_float=_float)
    _reject_non_finite(raw, "$")
    return raw


def _reject_non_finite(value: object, where: str) -> None:
    if isinstance(value, _NonFinite):
        raise NonFiniteNumberError(f"{where}: non-finite number {value} (not a finite float)")
    if isinstance(value, dict):
        for key, item in value.items():
            inner = f"{where}.{key}" if _PLAIN_KEY.match(key) else f"{where}[{key!r}]"
            _reject_non_finite(item, inner)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _reject_non_finite(item, f"{where}[{index}]")
