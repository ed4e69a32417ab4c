"""Who may import and read what: the layering ``miles_amd.app``'s and ``miles_amd.run_dir``'s
docstrings state, held to the code.

- ``run/`` (the driver, the watcher, ...) runs and records: it imports neither ``judge/``,
  ``report/`` nor ``app/``; ``judge/`` and ``report/`` do not import ``app/``.
- A run dir's JSON records (job.json, env.json, plan.json, canary.json) are opened for reading
  only by ``evidence/``: no other module reads a ``RunDir`` record path.

Imports are every ``import`` anywhere in a module (inside functions too), by ``ast``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.unit.test_import_cycles import SRC, imports_of, module_names

MODULES = module_names(SRC)
FORBIDDEN = {
    "miles_amd.run": ("miles_amd.judge", "miles_amd.report", "miles_amd.app"),
    "miles_amd.judge": ("miles_amd.app",),
    "miles_amd.report": ("miles_amd.app",),
}
RECORDS = r"(?:job_json|env_json|plan_json|canary_json)"
READ = r"(?:read_text|read_bytes|open|read_regular|open_regular|loads)"
RECORD_READ = re.compile(
    rf"\.{RECORDS}\b[^\n]*\.{READ}\(|\b{READ}\([^\n]*\.{RECORDS}\b", re.MULTILINE
)


def inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(layer: str) -> None:
    wrong = {
        name: sorted(
            i
            for i in imports_of(name, path, MODULES)
            if any(inside(i, above) for above in FORBIDDEN[layer])
        )
        for name, path in MODULES.items()
        if inside(name, layer)
    }
    assert {k: v for k, v in wrong.items() if v} == {}


def test_only_evidence_reads_a_run_dir_record() -> None:
    readers = [
        name
        for name, path in MODULES.items()
        if not inside(name, "miles_amd.evidence")
        and RECORD_READ.search(path.read_text(encoding="utf-8"))
    ]
    assert readers == []


def test_the_record_scan_finds_a_plain_read(tmp_path: Path) -> None:
    """The scan sees the read the history did before records (``read_plan``)."""
    code = "plan = strict_json.loads(RunDir(run_dir).plan_json.read_bytes())\n"
    assert RECORD_READ.search(code)
    assert RECORD_READ.search("data = read_regular(layout.env_json, ENV_JSON)\n")
    assert not RECORD_READ.search("atomic_write_text(run_dir.job_json, record.to_json())\n")
