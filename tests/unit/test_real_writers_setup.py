"""The real-writer mode's set-up, without torch: where miles' source comes from, how a moved
statement is refused, and the replay's one-line refusal when no miles tree is given."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from miles_amd.recipe.settings import Recipe
from miles_amd.testing.real_writers import (
    MILES_SRC_ENV,
    MilesSourceError,
    resolve_miles_src,
    source_line,
)
from tests.constants import EXAMPLE


def fake_miles(root: Path) -> Path:
    tracking = root / "miles" / "utils" / "tracking_utils" / "tracking.py"
    tracking.parent.mkdir(parents=True)
    tracking.write_text("def log(args, metrics, step_key):\n    pass\n")
    return root


def test_miles_src_from_the_option_then_the_env(tmp_path: Path) -> None:
    given = fake_miles(tmp_path / "given")
    from_env = fake_miles(tmp_path / "env")
    assert resolve_miles_src(str(given), {MILES_SRC_ENV: str(from_env)}) == given
    assert resolve_miles_src(None, {MILES_SRC_ENV: str(from_env)}) == from_env


def test_no_miles_src_names_the_option_and_the_env() -> None:
    with pytest.raises(MilesSourceError, match=f"--replay-miles-src DIR or set {MILES_SRC_ENV}"):
        resolve_miles_src(None, {})


def test_a_dir_without_miles_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MilesSourceError, match="no miles/ package there"):
        resolve_miles_src(str(tmp_path), {})


def test_a_moved_statement_is_refused_naming_the_file(tmp_path: Path) -> None:
    root = fake_miles(tmp_path)
    relative = "miles/utils/tracking_utils/tracking.py"
    assert source_line(str(root), relative, "def log(") == 1
    with pytest.raises(MilesSourceError, match=r"tracking\.py: no line"):
        source_line(str(root), relative, 'logger.info(f"perf {rollout_id}: {log_dict}")')


def test_the_replay_refuses_real_writers_without_miles(tmp_path: Path) -> None:
    argv = Recipe(num_rollout=3, capture_metrics=True).argv()
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"),
        "TENSORBOARD_DIR": str(tmp_path / "tb"),
        "MILES_CI_GATE_RECORD_DIR": str(tmp_path / "ci"),
    }
    replay = [sys.executable, "-m", "miles_amd.testing.replay", "--replay-source", str(EXAMPLE)]
    proc = subprocess.run(
        [*replay, "--replay-pace", "0", "--replay-writers", "real", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert f"--replay-miles-src DIR or set {MILES_SRC_ENV}" in proc.stderr
    assert proc.stdout == "" and not (tmp_path / "tb").exists()
