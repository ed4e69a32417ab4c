"""What the terminal renderers print fits 100 columns, wrapped, not cut (``miles_amd.wrap``).

Each command runs as a user runs it (``tests.cli_runs.run_cli``) on output whose natural lines
are wide: a red stock run with a reproduced canary (gate rows of several hundred columns), an
A/B of two different runs (compare's sentences), the two shipped baselines (``baseline diff``)
and a preflight on this CPU machine, a real "not a node" (its table and closing summary).
Every line of stdout and stderr is held to 100 columns, and the words are all still there.
Paths are given relative to the working dir, as a user types them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from miles_amd.wrap import WIDTH, wrapped
from tests.cli_runs import CliRun, flat, run_cli
from tests.constants import EXAMPLE
from tests.unit.test_gate_canary import canary, spiking_stock_run


def too_wide(result: CliRun) -> list[str]:
    lines = [*result.stdout.splitlines(), *result.stderr.splitlines()]
    assert lines, "nothing printed"
    return [line for line in lines if len(line) > WIDTH]


@pytest.fixture(scope="module")
def stock_red(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = spiking_stock_run(tmp_path_factory.mktemp("w") / "spike")
    canary(run, "aiter", bad=True, variant="stock")
    return run


def test_gate_rows_fit(stock_red: Path) -> None:
    result = run_cli(
        "gate", "--run-dir", "spike", "--baseline", "stock", "--report-dir", "report",
        cwd=stock_red.parent,
    )  # fmt: skip
    assert result.returncode == 1 and not too_wide(result), too_wide(result)
    assert "first bad element: repeat 0 call 5 rank 2 index 284099" in flat(result.stdout)


def test_compare_fits(stock_red: Path) -> None:
    result = run_cli(
        "compare", "--run-dir", str(EXAMPLE), "--run-dir", "spike", "--out-dir", "compare",
        cwd=stock_red.parent,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert not too_wide(result), too_wide(result)
    assert "with 20 paired rollouts this comparison could detect" in flat(result.stdout)


def test_baseline_diff_fits() -> None:
    result = run_cli("baseline", "diff", "stock", "patched")
    assert result.returncode == 1 and not too_wide(result), too_wide(result)
    assert "provenance and run shape:" in result.stdout


def test_the_preflight_table_and_its_summary_fit(tmp_path: Path) -> None:
    result = run_cli("preflight", "--run-dir", "run", "--aiter-variant", "patched", cwd=tmp_path)
    assert result.returncode == 1 and not too_wide(result), too_wide(result)
    assert result.stdout.startswith("preflight: FAIL - this is not an AMD GPU node")
    assert flat(result.stderr).startswith("miles-amd: preflight failed: gpus (missing), rocm")


def test_a_long_word_is_broken_not_cut_and_indentation_is_kept() -> None:
    path = "/" + "d" * 120
    lines = wrapped(f"  report written to {path} (also report.json)", indent="  ")
    assert max(len(line) for line in lines) <= WIDTH
    assert lines[0].startswith("  report written to /d")
    assert len(lines) > 1 and all(line.startswith("    ") for line in lines[1:])
    assert flat(" ".join(lines)).replace(" ", "") == f"reportwrittento{path}(alsoreport.json)"
