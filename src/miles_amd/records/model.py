"""How a record's dataclass is read and described: pydantic v2 on its type hints, strict (no
string for a number, no float for an integer, no non-finite number), a record's cross-field
``_check`` after (:data:`checked`), the first refusal one ``ValueError`` naming its path; and
the JSON Schema each shipped schema file holds. pydantic is imported on first use only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar, cast

T = TypeVar("T")
# a record's ``__pydantic_config__``: its attributes' docstrings describe them in its schema
CONFIG = {"use_attribute_docstrings": True}

# pydantic's error types, as this project's reasons ("must be ..."); ctx fills the braces
_REASONS = {
    "missing": "must be present",
    "int_type": "must be an integer",
    "int_from_float": "must be an integer",
    "float_type": "must be a finite number",
    "finite_number": "must be a finite number",
    "string_type": "must be a string",
    "string_too_short": "must be a non-empty string",
    "bool_type": "must be true or false",
    "literal_error": "must be one of {expected}",
    "greater_than_equal": "must be >= {ge}",
    "greater_than": "must be > {gt}",
    "less_than": "must be < {lt}",
    "less_than_equal": "must be <= {le}",
    "dataclass_type": "must be an object",
    "dict_type": "must be an object",
    "tuple_type": "must be a list",
}


def _checked_schema(cls: type, source: type, handler: Any) -> Any:
    from pydantic_core import core_schema

    def check(record: Any) -> Any:
        problem = record._check()
        if problem:
            raise ValueError(problem)
        return record

    return core_schema.no_info_after_validator_function(check, handler(source))


# a record's ``__get_pydantic_core_schema__`` when its ``_check()`` returns the reason its
# fields disagree (or None): its fields' checks first, then that one
checked: classmethod[Any, [Any, Any], Any] = classmethod(_checked_schema)


@dataclass(frozen=True)
class As:
    """``Annotated`` metadata: read and describe the field as ``type`` (a ``Literal``, a
    ``TypedDict``) while its Python hint stays the wider one its writers use (``str``, ``dict``)."""

    type: Any

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        return handler.generate_schema(self.type)


@cache
def _adapter(cls: Any) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(cls)


def _reason(error: Mapping[str, Any]) -> str:
    loc = error["loc"]
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    if error["type"] == "value_error":  # a record's own check: its reason names its fields
        reason = str(error["ctx"]["error"])  # '"field" ...' or a reason about the whole
        if not where:
            return reason
        return f'"{where}.{reason[1:]}' if reason.startswith('"') else f'"{where}": {reason}'
    template = _REASONS.get(error["type"])
    what = template.format(**error.get("ctx", {})) if template else error["msg"].lower()
    if error["type"] == "missing":
        return f'"{where}" {what}, found nothing'
    return f'"{where}" {what}, found {error["input"]!r:.80}'


def parse(cls: type[T], data: Mapping[str, Any]) -> T:
    """``data`` (a JSON object) as record ``cls``; ``ValueError`` naming the first bad field."""
    from pydantic import ValidationError

    try:
        text = json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"not a JSON object of finite numbers ({error})") from None
    try:
        record: T = _adapter(cast(Any, cls)).validate_json(text, strict=True)
        return record
    except ValidationError as error:
        raise ValueError(_reason(error.errors(include_url=False)[0])) from None


def json_schema(cls: type, title: str) -> str:
    """Record ``cls``'s JSON Schema (Draft 2020-12), titled ``title``, as a shipped file's
    text: a value on one line when it fits 100 columns."""
    from pydantic.json_schema import GenerateJsonSchema

    class _Untitled(GenerateJsonSchema):
        def field_title_should_be_set(self, schema: Any) -> bool:
            return False

    schema = _adapter(cls).json_schema(schema_generator=_Untitled)
    return _compact({"$schema": GenerateJsonSchema.schema_dialect, **schema, "title": title}) + "\n"


def _compact(value: Any, indent: int = 0) -> str:
    flat = json.dumps(value)
    if indent + len(flat) <= 100 or not isinstance(value, (dict, list)) or not value:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k)}: {_compact(v, indent + 2)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + _compact(v, indent + 2) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
