"""``train --aiter-variant V`` runs the canary first; a red of patched's or the control arm's
all-reduce stops before the driver. The planner, the gate's check and the driver are real; the
step's command is the real ``miles-amd canary`` where a CPU can run it, else the real writer."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from miles_amd.app import AppError
from miles_amd.app.train import (
    PUBLISHED_ROLLOUTS,
    PUBLISHED_RUN_MINUTES,
    CanaryRed,
    run_and_gate,
    run_canary,
)
from miles_amd.recipe.plan import CANARY_STEP, LaunchPlan, build_train_plan
from miles_amd.recipe.settings import Recipe
from miles_amd.run.driver import DriverError
from miles_amd.run_dir import RunDir
from tests.cli_runs import run_cli
from tests.constants import SHIPPED
from tests.unit.test_canary_record import OTHER, STALE
from tests.unit.test_cli_plan import inputs
from tests.unit.test_gate_canary import canary


def plan_for(run: Path, variant: str | None, env: dict[str, str] | None = None) -> LaunchPlan:
    return build_train_plan(
        Recipe(), env or {}, run_dir=str(run), aiter_variant=variant, canary=True
    )


def writes(implementation: str, *, bad: bool, code: int, first: Mapping[str, object] = STALE):
    """A stand-in for the node canary: canary.json of ``implementation`` into its --run-dir."""
    seen: list[Sequence[str]] = []

    def command(argv: Sequence[str]) -> int:
        seen.append(argv)
        variant = argv[argv.index("--variant") + 1]
        run = Path(argv[argv.index("--run-dir") + 1])
        canary(run, implementation, bad=bad, variant=variant, first=first)
        return code

    return command, seen


def test_the_published_duration_is_the_shipped_baselines() -> None:
    for name in ("stock", "patched"):
        baseline = json.loads((SHIPPED / f"{name}.json").read_text())
        assert baseline["provenance"]["duration"] == "about 1h06m"
        assert baseline["run_shape"]["rollouts"] == PUBLISHED_ROLLOUTS
    assert PUBLISHED_RUN_MINUTES == 66


def test_the_plan_runs_the_canary_first_only_for_a_variant_on_its_own_head(tmp_path) -> None:
    plan = plan_for(tmp_path, "rccl")
    assert plan.steps[0].name == CANARY_STEP
    assert plan.steps[0].argv == (
        "miles-amd",
        "canary",
        "--variant",
        "rccl",
        "--run-dir",
        str(tmp_path),
    )
    assert CANARY_STEP in json.dumps(plan.to_dict())
    assert CANARY_STEP not in [s.name for s in plan_for(tmp_path, None).steps]
    cluster = plan_for(tmp_path, "patched", {"RAY_ADDRESS": "http://10.0.0.5:8265"})
    assert CANARY_STEP not in [s.name for s in cluster.steps]
    plain = build_train_plan(Recipe(), {}, run_dir=str(tmp_path), aiter_variant="patched")
    assert CANARY_STEP not in [s.name for s in plain.steps]


@pytest.mark.parametrize(("variant", "implementation"), [("patched", "aiter"), ("rccl", "sglang")])
def test_a_red_of_the_variants_all_reduce_stops_before_the_driver(
    tmp_path, variant, implementation
) -> None:
    run = tmp_path / "run"
    command, seen = writes(implementation, bad=True, code=1)
    plan = plan_for(run, variant)
    with pytest.raises(CanaryRed) as stopped:
        run_and_gate(plan, timeout_s=60, canary_command=command, echo=lambda _: None)
    line = str(stopped.value)
    assert line.startswith("the all-reduce canary found the kernel wrong: 2 wrong sum(s)")
    assert "N=127 (aiter's 2stage path" in line and "about 66 node-minutes saved" in line
    assert "\n" not in line and seen == [plan.steps[0].argv]
    assert sorted(p.name for p in run.iterdir()) == ["canary.json"]  # no job.log, no plan.json
    short = build_train_plan(
        Recipe(num_rollout=3),
        {},
        run_dir=str(tmp_path / "short"),
        aiter_variant=variant,
        canary=True,
    )
    with pytest.raises(CanaryRed, match="about 10 node-minutes saved"):
        run_canary(short, command=command, echo=lambda _: None)


@pytest.mark.parametrize(
    ("variant", "bad", "said"),
    [("stock", True, "canary: pass: reproduced: "), ("patched", False, "canary: pass: clean: ")],
)
def test_a_stock_red_or_a_clean_canary_goes_on_to_the_driver(tmp_path, variant, bad, said) -> None:
    run = tmp_path / "run"
    run.mkdir()
    RunDir(run).job_log.write_text("")  # an earlier run's: the driver refuses it at once
    command, _ = writes("aiter", bad=bad, code=1 if bad else 0)
    lines: list[str] = []
    with pytest.raises(DriverError, match=r"already holds job\.log"):
        run_and_gate(
            plan_for(run, variant), timeout_s=60, canary_command=command, echo=lines.append
        )
    assert lines[0].startswith("canary: miles-amd canary --variant " + variant)
    assert lines[1].startswith(said)


def test_an_unusable_or_silent_canary_is_bad_input_naming_no_canary(tmp_path) -> None:
    with pytest.raises(AppError, match="--no-canary"):
        run_canary(plan_for(tmp_path / "a", "patched"), command=lambda argv: 2, echo=lambda _: None)
    with pytest.raises(AppError, match=r"left no readable canary\.json.*--no-canary"):
        run_canary(plan_for(tmp_path / "b", "patched"), command=lambda argv: 0, echo=lambda _: None)


def test_train_on_a_cpu_runs_the_real_canary_and_exits_2_before_the_job(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``train --aiter-variant patched`` with valid inputs: the real ``miles-amd canary``
    process finds no GPU (exit 2, its line), train exits 2 naming --no-canary, no job."""
    given = inputs(tmp_path)
    (tmp_path / "miles" / "train.py").write_text("raise SystemExit('never run')\n")
    for name in ("RAY_ADDRESS", "MILES_AMD_HISTORY"):
        monkeypatch.delenv(name, raising=False)
    done = run_cli(
        "train", "--aiter-variant", "patched", *given, "--run-dir", str(tmp_path / "run")
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "canary: miles-amd canary --variant patched --run-dir" in done.stdout
    assert "--no-canary" in done.stderr
    assert "torch" in capfd.readouterr().err  # the canary's line: no GPU for torch, or no torch
    assert not (tmp_path / "run" / "job.log").exists()
    assert not (tmp_path / "run" / "plan.json").exists()


def test_a_stock_red_of_another_fault_stops_before_the_driver(tmp_path) -> None:
    run = tmp_path / "run"
    command, _ = writes("aiter", bad=True, code=1, first=OTHER)
    with pytest.raises(CanaryRed) as stopped:
        run_and_gate(
            plan_for(run, "stock"), timeout_s=60, canary_command=command, echo=lambda _: None
        )
    assert "(another fault)" in str(stopped.value)
    assert sorted(p.name for p in run.iterdir()) == ["canary.json"]
