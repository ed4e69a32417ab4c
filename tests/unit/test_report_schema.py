"""report.json is held to its JSON Schema (``miles_amd/report/report.schema.json``, package
data), and the reports say why a check was not measured.

The gate runs for real (``tests.cli_runs.run_cli``) on the embedded example (a pass with
optional checks not measured), a failing run written by the miles writer, and a run dir
whose evidence is unreadable (verdict ``error``); each report.json must validate with
``jsonschema`` (Draft 2020-12, as ``miles_amd.baseline.model`` uses it).
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from miles_amd import escape
from miles_amd.report.render import SCHEMA_PATH, SCHEMA_VERSION
from tests.cli_runs import flat, run_cli
from tests.constants import EXAMPLE, LOGPROB
from tests.run_dirs import published_values, write_run


def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def gated(run_dir: Path, out: Path, *extra: str) -> dict:
    result = run_cli(
        "gate", "--run-dir", str(run_dir), "--baseline", "patched", "--report-dir", str(out), *extra
    )
    assert result.returncode in (0, 1, 2), result.stderr
    return json.loads((out / "report.json").read_text())


def spiking_run(tmp_path: Path) -> Path:
    values = published_values()
    values[LOGPROB][7] = 0.5  # far above the spike threshold
    return write_run(tmp_path / "spike", values)


def unreadable_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "unreadable"
    (run_dir / "tensorboard").mkdir(parents=True)
    (run_dir / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"\x00garbage")
    return run_dir


@pytest.mark.parametrize(
    ("make", "verdict"),
    [(lambda tmp: EXAMPLE, "pass"), (spiking_run, "fail"), (unreadable_run, "error")],
)
def test_the_gates_report_json_matches_its_schema(tmp_path: Path, make, verdict: str) -> None:
    report = gated(make(tmp_path), tmp_path / "report")
    assert report["verdict"] == verdict
    assert report["schema_version"] == SCHEMA_VERSION
    errors = [f"{e.json_path}: {e.message}" for e in validator().iter_errors(report)]
    assert errors == []


def test_the_schema_refuses_a_report_of_another_shape(tmp_path: Path) -> None:
    report = gated(EXAMPLE, tmp_path / "report")
    for broken in (
        {**report, "schema_version": SCHEMA_VERSION + 1},
        {**report, "verdict": "maybe"},
        {k: v for k, v in report.items() if k != "checks"},
        {**report, "checks": [{**report["checks"][0], "status": "skipped"}]},
    ):
        assert list(validator().iter_errors(broken)) != []


def test_not_measured_says_why_in_text_and_markdown(tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = run_cli(
        "gate", "--run-dir", str(EXAMPLE), "--baseline", "patched", "--report-dir", str(out)
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    unmeasured = [c for c in report["checks"] if c["status"] == "not_measured"]
    assert unmeasured, "the example lacks the KL series: some checks are not measured"
    markdown = (out / "report.md").read_text()
    for check in unmeasured:
        assert check["detail"], check
        assert flat(escape.terminal(check["detail"])) in flat(result.stdout), check["detail"]
        assert escape.markdown(check["detail"]) in markdown, check["detail"]
    assert "not measured (optional, so they do not change the verdict):" in result.stdout
