"""A JSON reader for files someone handed us: strict, bounded, located errors.

:func:`loads` refuses a duplicate key, nesting deeper than ``max_depth``, an integer outside
64 bits, a float beyond its range, a non-finite constant (unless ``non_finite``), a lone
surrogate; a :class:`StrictJsonError` is one line, ``<JSON path>: <reason>``. Why:
``docs/cli.md`` ("Strict JSON").
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_DEPTH = 32
_INT64 = 1 << 63
_MAX_INT_DIGITS = 19  # len(str(2**63)); longer literals are refused before int() sees them
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SURROGATE = re.compile("[\ud800-\udfff]")
_CONSTANTS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class StrictJsonError(ValueError):
    """A document :func:`loads` refuses; ``where`` is its JSON path (``$`` for the whole)."""

    def __init__(self, where: str, reason: str) -> None:
        self.where, self.reason = where, reason
        super().__init__(f"{where}: {reason}")


class _Refused(str):
    """A value refused while parsing, kept until the walk knows its JSON path."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any] | _Refused:
    result = dict(pairs)
    if len(result) == len(pairs):
        return result
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            break
        seen.add(key)
    return _Refused(f"duplicate key {key!r} (keys must be unique)")


def _int(text: str) -> int | _Refused:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS or not -_INT64 <= int(text) < _INT64:
        shown = text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"
        return _Refused(f"integer {shown} does not fit 64 bits")
    return int(text)


def _float(text: str) -> float | _Refused:
    value = float(text)
    if math.isfinite(value):
        return value
    shown = text if len(text) <= 24 else f"{text[:24]}..."
    return _Refused(f"non-finite number {shown} (beyond the float range)")


def loads(text: str | bytes, *, non_finite: bool = False, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value of ``text``, strictly (see the module doc); :class:`StrictJsonError`."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise StrictJsonError("$", "not UTF-8 text") from None

    def constant(name: str) -> float | _Refused:
        if non_finite:
            return _CONSTANTS[name]
        return _Refused(f"non-finite number {name} (not a finite float)")

    try:
        value = json.loads(
            text,
            object_pairs_hook=_object,
            parse_int=_int,
            parse_float=_float,
            parse_constant=constant,
        )
    except json.JSONDecodeError as error:
        raise StrictJsonError(
            f"line {error.lineno} column {error.colno}", f"invalid JSON ({error.msg})"
        ) from None
    except RecursionError:
        raise StrictJsonError("$", f"nested deeper than {max_depth} levels") from None
    _check(value, max_depth)
    return value


def json_path(where: str, key: str | int) -> str:
    """``where`` extended by an object key or a list index: ``$.a``, ``$['a b']``, ``$[3]``."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if _PLAIN_KEY.match(key) else f"{where}[{key!r}]"


def _check(value: Any, max_depth: int) -> None:
    stack: list[tuple[Any, str, int]] = [(value, "$", 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, _Refused):
            raise StrictJsonError(where, str(item))
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise StrictJsonError(where, "string holds a lone surrogate (not Unicode text)")
            continue
        if not isinstance(item, (dict, list)):
            continue
        if depth >= max_depth:
            raise StrictJsonError(where, f"nested deeper than {max_depth} levels")
        if isinstance(item, dict):
            children = []
            for key, child in item.items():
                if _SURROGATE.search(key):
                    raise StrictJsonError(where, "a key holds a lone surrogate (not Unicode text)")
                children.append((child, json_path(where, key), depth + 1))
        else:
            children = [(child, json_path(where, i), depth + 1) for i, child in enumerate(item)]
        stack.extend(reversed(children))
