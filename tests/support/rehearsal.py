"""The CPU rehearsal: the recipe's plan with ``train.py`` replaced by the replay, through the
real driver, watcher and gate; and :func:`expectation_problems`, the rule the rehearsal tests
and ``benchmarks/bench_rehearsal.py`` apply (docs/rehearsal.md)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

from miles_amd.app.baselines import load
from miles_amd.app.train import TrainResult, run_and_gate
from miles_amd.package_data import package_path
from miles_amd.recipe.plan import build_train_plan
from miles_amd.recipe.settings import Recipe
from miles_amd.run_dir import RunDir
from miles_amd.testing.faults import DEFAULT_FAULT_AT, FAULTS

EXAMPLE_RUN = package_path("miles_amd.testing", "example-run")  # jvvnhop9, as installed


def replay_prefix(
    source: Path,
    *,
    pace_s: float,
    fault: str | None = None,
    at: int = DEFAULT_FAULT_AT,
    writers: str = "imitation",
    miles_src: str | None = None,
) -> tuple[str, ...]:
    """The entrypoint that replaces ``python3 <miles>/train.py``."""
    prefix: tuple[str, ...] = (sys.executable, "-m", "miles_amd.testing.replay")
    prefix += ("--replay-source", str(source))
    prefix += ("--replay-pace", str(pace_s))
    if fault is not None:
        prefix += ("--replay-fault", fault, "--replay-fault-at", str(at))
    if writers != "imitation":
        prefix += ("--replay-writers", writers)
    if miles_src is not None:
        prefix += ("--replay-miles-src", miles_src)
    return prefix


def rehearse(
    env: Mapping[str, str],
    run_dir: Path,
    *,
    fault: str | None = None,
    at: int = DEFAULT_FAULT_AT,
    pace_s: float = 0.1,
    num_rollout: int = 20,
    watch_interval_s: float = 1.0,
    timeout_s: float = 120.0,
    source: Path = EXAMPLE_RUN,
    state_dir: str | None = None,
    writers: str = "imitation",
    miles_src: str | None = None,
    aiter_variant: str | None = None,
) -> TrainResult:
    """One replayed run gated against ``patched``; ``env`` may name a Ray cluster."""
    prefix = replay_prefix(
        source, pace_s=pace_s, fault=fault, at=at, writers=writers, miles_src=miles_src
    )
    plan = build_train_plan(
        Recipe(num_rollout=num_rollout),
        env,
        run_dir=str(run_dir),
        entrypoint_prefix=prefix,
        aiter_variant=aiter_variant,
    )
    return run_and_gate(
        plan,
        timeout_s=timeout_s,
        gate=load("patched", "--gate"),
        watch_interval_s=watch_interval_s,
        state_dir=state_dir,
        echo=lambda _line: None,
    )


def failed_checks(run_dir: Path) -> set[str]:
    report = json.loads((RunDir(run_dir).report / "report.json").read_text())
    return {c["name"] for c in report["checks"] if c["status"] in ("fail", "error")}


def expectation_problems(fault: str | None, result: TrainResult) -> list[str]:
    """Why ``result`` is not what ``fault``'s ``FAULTS`` entry (or health) must produce."""
    expected = FAULTS[fault] if fault is not None else None
    if expected is None or not expected.fails_run:
        if result.verdict != "pass":
            failing = ", ".join(sorted(failed_checks(result.outcome.run_dir)))
            return [f"expected PASS, got {result.verdict} (failing: {failing})"]
        return []
    problems = []
    if result.verdict == "pass":
        problems.append("FALSE GREEN: the gate passed a faulty run")
    missing = set(expected.gate_checks) - failed_checks(result.outcome.run_dir)
    if missing:
        problems.append(f"checks that should have failed did not: {sorted(missing)}")
    if result.outcome.stopped_by != expected.driver_stop:
        stop = result.outcome.stopped_by
        problems.append(f"driver stop {stop!r}, expected {expected.driver_stop!r}")
    return problems


def alive_pids(pids: list[int]) -> list[int]:
    import psutil

    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            pass
    return alive
