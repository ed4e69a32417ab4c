"""The JSON Schema check of a baseline file, with one-line errors.

Decides how a schema violation is reported: the best-matching error (descending into
``if``/``then`` branches so the message names the innermost field) as
``<file>: <JSON path>: <message>; fix: <what to do>``. What the schema demands is
``baseline.schema.json`` (Draft 2020-12, beside this module); the checks beyond it are
``miles_amd.baseline.model``'s. ``jsonschema`` is imported on first use.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

SCHEMA_PATH = Path(__file__).resolve().parent / "baseline.schema.json"


class SchemaError(ValueError):
    """``str()`` is one line: ``<file>: <JSON path>: <message>; fix: <what to do>``."""


@cache
def _validator():
    import jsonschema

    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


_FIXES = {
    "required": "add the missing field",
    "additionalProperties": "remove the field or correct its spelling",
    "type": "use the type the schema names",
    "enum": "use one of the allowed values",
    "const": "use the value the schema names",
    "pattern": "match the pattern the schema names",
    "minItems": "add values",
    "maxItems": "remove values",
    "minimum": "use a larger value",
    "maximum": "use a smaller value",
    "exclusiveMinimum": "use a larger value",
    "minLength": "write a non-empty value",
    "not": "remove the field (this kind takes none)",
    "dependentRequired": "add the field it depends on",
}


def validate(raw: object, path: str) -> None:
    """Raise the best-matching schema error as one line: file, JSON path, message, fix."""
    import jsonschema

    errors = list(_validator().iter_errors(raw))
    if not errors:
        return
    error = jsonschema.exceptions.best_match(errors)
    # Descend into if/then branches so the message names the innermost field.
    while error.context:
        error = jsonschema.exceptions.best_match(error.context)
    fix = _FIXES.get(str(error.validator), "see src/miles_amd/baseline/baseline.schema.json")
    message = " ".join(error.message.split())
    forbidden = error.validator_value.get("required") if error.validator == "not" else None
    if forbidden:
        message = f"this kind takes no {', '.join(repr(f) for f in forbidden)}"
    if len(message) > 200:
        message = message[:197] + "..."
    raise SchemaError(f"{path}: {error.json_path}: {message}; fix: {fix}")
