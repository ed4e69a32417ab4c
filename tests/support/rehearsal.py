"""The CPU rehearsal: the hardware path end to end with the training replaced by a replay.

Decides how a rehearsal run is put together and what it must end in. The plan is the
recipe's, built by the same ``build_train_plan`` the node uses, with only the entrypoint
swapped for ``python -m miles_amd.testing.replay`` (which checks the argv is the recipe's); the
driver, watcher, sentinels and gate are the real ones. :func:`expectation_problems` is the
rule both the rehearsal tests and ``benchmarks/bench_rehearsal.py`` apply: a healthy replay
(or the harmless known sentinel) must PASS; every other fault must not, with the gate checks
and the driver stop its catalogue entry (``miles_amd.testing.faults``) names.

Explained for people in ``docs/rehearsal.md``.
"""

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

# The embedded jvvnhop9 run, shipped as package data (``miles_amd.package_data``): the
# replay reads the copy an installed package has.
EXAMPLE_RUN = package_path("miles_amd.testing", "example-run")


def replay_prefix(
    source: Path,
    *,
    pace_s: float,
    fault: str | None = None,
    at: int = DEFAULT_FAULT_AT,
    writers: str = "imitation",
    miles_src: str | None = None,
) -> tuple[str, ...]:
    """The entrypoint that replaces ``python3 <miles>/train.py`` in a rehearsal.

    ``writers="real"`` has miles' own writer code (in ``miles_src``) write the evidence.
    """
    prefix: tuple[str, ...] = (
        sys.executable, "-m", "miles_amd.testing.replay", "--replay-source", str(source)
    )  # fmt: skip
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
    baseline: str = "patched",
    source: Path = EXAMPLE_RUN,
    state_dir: str | None = None,
    writers: str = "imitation",
    miles_src: str | None = None,
    aiter_variant: str | None = None,
) -> TrainResult:
    """One replayed run through the real driver and gate; ``env`` may name a Ray cluster;
    ``aiter_variant`` labels the job as ``train --aiter-variant`` does (no canary)."""
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
        gate=load(baseline, "--gate"),
        watch_interval_s=watch_interval_s,
        state_dir=state_dir,
        echo=lambda _line: None,
    )


def failed_checks(run_dir: Path) -> set[str]:
    report = json.loads((RunDir(run_dir).report / "report.json").read_text())
    return {c["name"] for c in report["checks"] if c["status"] in ("fail", "error")}


def expectation_problems(fault: str | None, result: TrainResult) -> list[str]:
    """Why ``result`` is not what ``fault`` must produce; empty when it is."""
    outcome = result.outcome
    expected = FAULTS[fault] if fault is not None else None
    if expected is None or not expected.fails_run:
        if result.verdict != "pass":
            failing = sorted(failed_checks(outcome.run_dir))
            return [f"expected PASS, got {result.verdict} (failing: {', '.join(failing)})"]
        return []
    problems = []
    if result.verdict == "pass":
        problems.append("FALSE GREEN: the gate passed a faulty run")
    missing = set(expected.gate_checks) - failed_checks(outcome.run_dir)
    if missing:
        problems.append(f"checks that should have failed did not: {sorted(missing)}")
    if outcome.stopped_by != expected.driver_stop:
        problems.append(f"driver stop {outcome.stopped_by!r}, expected {expected.driver_stop!r}")
    return problems


def alive_pids(pids: list[int]) -> list[int]:
    """The pids still running (a zombie or a process gone while looked at is not)."""
    import psutil

    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            pass
    return alive
