"""The shipped JSON Schemas are the ones the records' models generate, and reading a record
is typed without the snapshot suite paying for pydantic (``miles_amd.records.model``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from miles_amd.records.schema import SHIPPED, generated

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("path", sorted(SHIPPED), ids=lambda p: p.name)
def test_each_shipped_schema_is_the_one_its_model_generates(path: Path) -> None:
    assert path.read_text(encoding="utf-8") == generated(path), (
        f"{path.name} is stale: run `python -m miles_amd.records.schema` and commit it"
    )


def test_importing_the_records_and_their_reader_leaves_pydantic_unimported() -> None:
    code = (
        "import sys\n"
        "import miles_amd.evidence.load, miles_amd.records.canary, miles_amd.records.job\n"
        "import miles_amd.records.env, miles_amd.records.plan, miles_amd.records.schema\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
