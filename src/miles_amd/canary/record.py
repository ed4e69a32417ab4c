"""Writing ``canary.json`` into a run dir, and where its JSON Schema ships.

Decides the writer's side of the record (the model is ``miles_amd.records.canary``):
:func:`write_canary` writes it whole or not at all (``miles_amd.files.atomic_write_text``);
:func:`schema_path` is ``canary/canary.schema.json`` (``tests/unit/test_canary_record.py``
holds the writer's output to it).
"""

from __future__ import annotations

from pathlib import Path

from miles_amd.files import atomic_write_text
from miles_amd.records.canary import CanaryRecord
from miles_amd.run_dir import RunDir

__all__ = ["schema_path", "write_canary"]


def schema_path() -> Path:
    """The shipped JSON Schema of ``canary.json``."""
    from miles_amd.package_data import package_path

    return package_path("miles_amd.canary", "canary.schema.json")


def write_canary(root: Path, record: CanaryRecord) -> Path:
    """Write ``record`` as ``<root>/canary.json``, whole or not at all; the path."""
    path = RunDir(root).canary_json
    atomic_write_text(path, record.to_json())
    return path
