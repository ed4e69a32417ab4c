"""The shipped JSON Schemas are the ones their models generate (``records.model``), and
reading a record is typed without the snapshot suite paying for pydantic.

``python -m tests.unit.test_record_schemas`` rewrites the shipped files from the models.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from miles_amd.records.model import json_schema

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "miles_amd"


def shipped() -> dict[Path, str]:
    """Each shipped schema file and the text its model generates."""
    from miles_amd.records.canary import CanaryRecord
    from miles_amd.report.schema import Report

    return {
        PACKAGE / "canary" / "canary.schema.json": json_schema(
            CanaryRecord,
            "canary.json: the all-reduce canary's record (miles_amd.records.canary.CanaryRecord)",
        ),
        PACKAGE / "report" / "report.schema.json": json_schema(
            Report, "miles-amd gate report (report.json)"
        ),
    }


@pytest.mark.parametrize("name", ["canary.schema.json", "report.schema.json"])
def test_each_shipped_schema_is_the_one_its_model_generates(name: str) -> None:
    ((path, text),) = [(p, t) for p, t in shipped().items() if p.name == name]
    assert path.read_text(encoding="utf-8") == text, (
        f"{name} is stale: run `python -m tests.unit.test_record_schemas` and commit it"
    )


def test_importing_the_records_and_their_reader_leaves_pydantic_unimported() -> None:
    code = (
        "import sys\n"
        "import miles_amd.evidence.load, miles_amd.records.canary, miles_amd.records.job\n"
        "import miles_amd.records.env, miles_amd.records.plan, miles_amd.report.render\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'pydantic_core')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


if __name__ == "__main__":
    for path, text in shipped().items():
        path.write_text(text, encoding="utf-8")
        print(path)
