"""The benchmark runner (``benchmarks/run_quick.py``): every script registered with a quick
mode, and what it counts as a pass (the figures line; a real child's exit and last line)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from benchmarks.run_quick import BENCHMARKS, HERE, figures_problem, run_benchmark


def declares_quick(script: Path) -> bool:
    """Whether the script's argparse declares ``--quick`` (read from its source, not run)."""
    for node in ast.walk(ast.parse(script.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
            and any(isinstance(a, ast.Constant) and a.value == "--quick" for a in node.args)
        ):
            return True
    return False


def test_every_benchmark_is_registered_and_has_a_quick_mode_unless_a_skip_says_why() -> None:
    scripts = {p.name for p in HERE.glob("*.py")} - {"run_quick.py", "__init__.py"}
    assert scripts and scripts == set(BENCHMARKS), sorted(scripts ^ set(BENCHMARKS))
    for name, skip_reason in BENCHMARKS.items():
        assert declares_quick(HERE / name) == (skip_reason is None), (
            f"{name}: a --quick option and a skip reason in run_quick.BENCHMARKS go together"
        )


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("gate_s=0.189 accumulator_s=0.408 ratio=0.463", None),
        ("runs=3 false_green=0 rollouts_for_95pct=>160", None),
        ("", "the last line is empty (no figures printed)"),
        ("done in 3 s", "'done' is not key=value"),
        ("gate_s=0.1  ratio=0.4", "'' is not key=value"),
        ("gate_s=", "'gate_s=' is not key=value"),
        ("2x=1", "'2x=1' is not key=value"),
        ("runs=3 failfast_median_s=nan", "figure failfast_median_s is nan"),
        ("ratio=inf", "figure ratio is inf"),
    ],
)
def test_figures_line_format(line: str, problem: str | None) -> None:
    assert figures_problem(line) == problem


def script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "bench_fake.py"
    path.write_text("import sys, time\n" + body)
    return path


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("assert sys.argv[1:] == ['--quick']\nprint('setting up')\nprint('a=1 b=2.5')\n", None),
        ("print('a=1')\nsys.exit(1)\n", "exit 1"),
        ("print('a=1')\nprint('finished')\n", "'finished' is not key=value"),
    ],
)
def test_a_script_passes_only_on_exit_0_with_figures(
    tmp_path: Path, body: str, problem: str | None
) -> None:
    outcome = run_benchmark(script(tmp_path, body))
    assert (outcome.problem, outcome.name) == (problem, "bench_fake.py")


def test_a_script_that_does_not_exit_fails(tmp_path: Path) -> None:
    outcome = run_benchmark(script(tmp_path, "time.sleep(60)\n"), timeout_s=1.0)
    assert outcome.problem == "no exit after 1 s"
