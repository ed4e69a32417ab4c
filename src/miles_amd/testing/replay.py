"""``python -m miles_amd.testing.replay``: a stand-in for miles' ``train.py`` replaying a run.

- The CPU rehearsal submits the recipe's command line with only the entrypoint swapped; this
  re-emits the recorded run as miles would (job-log lines on stdout, TensorBoard scalars,
  CI history), one rollout every ``--replay-pace`` seconds, with at most one injected fault
  (``faults``), through ``miles_writer`` (default) or miles' own code (``real_writers``).
- Refused before anything is written (one line on stderr, exit 2): an argv that is not the
  recipe's exactly (``replay_argv``); ``--use-tensorboard`` without ``TENSORBOARD_DIR`` and
  ``MILES_CI_GATE_RECORD_DIR``; an untrustworthy source run (a problem, a conflict, a
  :data:`REQUIRED_KEYS` metric missing, steps not ``0..n-1`` once each) or fewer rollouts
  than ``--num-rollout``; a fault that cannot fire (``faults.check_fault_at``).
- Then a start-up line, the rollouts, exit 0; the crash fault exits 1 with a traceback, the
  hang fault sleeps until killed.

Caveats:

- Its own options are all ``--replay-*``; an unknown one is a foreign flag.
- Environment values are not printed.

Explained in ``docs/rehearsal.md`` ("The replay").
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from miles_amd.evidence.types import SeriesMap
from miles_amd.recipe.settings import Recipe, RecipeError
from miles_amd.testing.faults import (
    DEFAULT_FAULT_AT,
    FAULTS,
    KNOWN_SENTINEL_BODY,
    FaultError,
    FaultPlan,
    fatal_sentinel_body,
    final_record_cut,
    plan_fault,
    transform_series,
)
from miles_amd.testing.miles_writer import (
    SGLANG_ACTOR,
    STEP_KEYS,
    TRAINER_ACTOR,
    MilesRunWriter,
    format_log_time,
)
from miles_amd.testing.replay_argv import (
    ReplayRefused,
    check_argv,
)

# The series every baseline rules on without an "optional" (and the value faults change); the
# embedded example carries exactly these. Other series are replayed where the source has them.
REQUIRED_KEYS: tuple[str, ...] = (
    "train/train_rollout_logprob_abs_diff",
    "rollout/raw_reward",
    "train/pg_clipfrac",
)
TENSORBOARD_ENV = "TENSORBOARD_DIR"
CI_HISTORY_ENV = "MILES_CI_GATE_RECORD_DIR"
_NEEDS_TENSORBOARD = ("no-tensorboard", "truncated-event")

# The writers' common interface: pids, print_line, print_actor_line, emit_rollout, close and
# event_file (the trainer's, after close for the real writers).
Writer = Any


def output_dirs(recipe: Recipe, env: Mapping[str, str]) -> tuple[Path | None, Path | None]:
    """(TensorBoard dir, CI-history dir) from the environment, as miles reads them."""
    if not recipe.capture_metrics:
        return None, None
    missing = [name for name in (TENSORBOARD_ENV, CI_HISTORY_ENV) if not env.get(name)]
    if missing:
        raise ReplayRefused(
            f"{' and '.join(missing)} not set: --use-tensorboard and the CI history "
            "need them (the launcher sets both in the job's runtime env when given a run dir)"
        )
    return Path(env[TENSORBOARD_ENV]), Path(env[CI_HISTORY_ENV])


# ---- the source run ---------------------------------------------------------------------


def source_rollouts(source: str, series: SeriesMap) -> int:
    """How many rollouts the source has; ``ReplayRefused`` if a series is missing or gappy.

    Every series must sit at steps ``0..n-1``, each once; the count is the shortest
    required series' ``n``.
    """
    missing = [key for key in REQUIRED_KEYS if key not in series]
    if missing:
        raise ReplayRefused(f"--replay-source {source}: no {', '.join(missing)} series")
    for key, points in series.items():
        for expected, (step, _) in enumerate(points):
            if step != expected:
                raise ReplayRefused(
                    f"--replay-source {source}: {key} has step {step} where step {expected} "
                    "belongs (duplicated or missing steps); replay a complete run"
                )
    return min(len(series[key]) for key in REQUIRED_KEYS)


def load_source(source: str) -> SeriesMap:
    """The source run's series; ``ReplayRefused`` for a missing dir, a problem or a conflict."""
    from miles_amd.evidence.load import load_run

    if not Path(source).is_dir():
        raise ReplayRefused(f"--replay-source {source}: not a directory; pass a run directory")
    evidence = load_run(Path(source))
    if evidence.problems:
        raise ReplayRefused(
            f"--replay-source {source}: untrustworthy source ({len(evidence.problems)} "
            f"problem(s)), first: {evidence.problems[0]}"
        )
    if evidence.conflicts:
        first = evidence.conflicts[0]
        raise ReplayRefused(
            f"--replay-source {source}: its sources disagree ({len(evidence.conflicts)} "
            f"conflict(s)), first: {first.metric} at step {first.step}: {first.values}"
        )
    return evidence.series


def rollout_metrics(series: SeriesMap, num_rollout: int) -> list[dict[str, float]]:
    """Per rollout ``0..num_rollout-1``, every metric the source has at that step.

    miles' step keys are left out: a job-log source reports ``train/step`` as a series (it is
    in the printed dict), but it is the step, which the writer prints itself.
    """
    rollouts: list[dict[str, float]] = [{} for _ in range(num_rollout)]
    for key, points in series.items():
        if key in STEP_KEYS:
            continue
        for step, value in points[:num_rollout]:
            rollouts[step][key] = value
    return rollouts


# ---- the command ------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"replay: refused: {message}", file=sys.stderr)
        raise SystemExit(2)


def non_negative_seconds(raw: str) -> float:
    value = float(raw)
    if not math.isfinite(value) or value < 0:
        raise ValueError(raw)
    return value


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m miles_amd.testing.replay",
        description="Replay a recorded run as miles' train.py would emit it.",
        allow_abbrev=False,
    )
    parser.add_argument("--replay-source", required=True, help="run directory to replay")
    parser.add_argument(
        "--replay-pace", type=non_negative_seconds, default=0.5, help="seconds per rollout (>= 0)"
    )
    parser.add_argument(
        "--replay-fault",
        choices=sorted(FAULTS),
        default=None,
        help="inject one fault (miles_amd.testing.faults.FAULTS describes each)",
    )
    parser.add_argument(
        "--replay-fault-at",
        type=int,
        default=DEFAULT_FAULT_AT,
        help="0-based rollout the fault fires at (default %(default)s)",
    )
    parser.add_argument(
        "--replay-writers",
        choices=("imitation", "real"),
        default="imitation",
        help="who writes the evidence: miles_writer's imitation, or miles' own code (needs torch)",
    )
    parser.add_argument(
        "--replay-miles-src",
        default=None,
        help="miles checkout for --replay-writers real (default: $MILES_AMD_MILES_SRC)",
    )
    return parser


def _prepare(
    args: argparse.Namespace, argv: Sequence[str], env: Mapping[str, str]
) -> tuple[Recipe, FaultPlan, list[dict[str, float]], Path | None, Path | None]:
    recipe = check_argv(argv)
    tensorboard_dir, ci_dir = output_dirs(recipe, env)
    if args.replay_fault in _NEEDS_TENSORBOARD and tensorboard_dir is None:
        raise ReplayRefused(f"--replay-fault {args.replay_fault}: needs --use-tensorboard")
    plan = plan_fault(args.replay_fault, args.replay_fault_at, recipe.num_rollout)
    series = load_source(args.replay_source)
    available = source_rollouts(args.replay_source, series)
    if recipe.num_rollout > available:
        raise ReplayRefused(
            f"--num-rollout {recipe.num_rollout}: the source run has {available} rollouts; "
            f"replay at most {available}"
        )
    series = transform_series(args.replay_fault, args.replay_fault_at, series)
    if not plan.write_tensorboard:
        tensorboard_dir = None
    return recipe, plan, rollout_metrics(series, recipe.num_rollout), tensorboard_dir, ci_dir


def _miles_src(args: argparse.Namespace) -> Path:
    from miles_amd.testing.real_writers import MilesSourceError, resolve_miles_src

    try:
        return resolve_miles_src(args.replay_miles_src, os.environ)
    except MilesSourceError as exc:
        raise ReplayRefused(str(exc)) from None


def _crash(rollout: int) -> NoReturn:
    raise RuntimeError(f"replay fault 'crash': the trainer died before rollout {rollout}")


def replay(
    plan: FaultPlan, rollouts: Sequence[Mapping[str, float]], writer: Writer, pace: float
) -> None:
    """Emit the planned rollouts through ``writer``; crash or hang as the plan says."""
    if plan.known_sentinel_at_start:
        for rank in range(len(writer.pids.trainers)):
            writer.print_actor_line(TRAINER_ACTOR, KNOWN_SENTINEL_BODY, rank)
    for rollout in range(plan.emit_rollouts):
        time.sleep(pace)
        if plan.crash_before == rollout:
            _crash(rollout)
        if plan.fatal_sentinel_at == rollout:
            writer.print_actor_line(SGLANG_ACTOR, fatal_sentinel_body(time.time()))
        writer.emit_rollout(rollout, rollouts[rollout])
        if plan.hang_after == rollout:
            threading.Event().wait()  # the hang fault: until the driver kills the job
    writer.close()
    if plan.truncate_event_file:
        if writer.event_file is None:
            raise RuntimeError("replay fault 'truncated-event': cannot tell which file to cut")
        cut = final_record_cut(writer.event_file.read_bytes())
        os.truncate(writer.event_file, cut)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the replay; 0 when every planned rollout was emitted, 2 when refused."""
    args, rest = _parser().parse_known_args(argv)
    try:
        recipe, plan, rollouts, tensorboard_dir, ci_dir = _prepare(args, rest, os.environ)
        miles_src = _miles_src(args) if args.replay_writers == "real" else None
    except (ReplayRefused, RecipeError, FaultError) as exc:
        print(f"replay: refused: {exc}", file=sys.stderr)
        return 2
    fault = f", fault {args.replay_fault} (K={args.replay_fault_at})" if args.replay_fault else ""
    writer: Writer
    if miles_src is not None:
        from miles_amd.testing.real_writers import RealRunWriter

        writer = RealRunWriter(miles_src, tensorboard_dir, ci_dir)
        start = ""
    else:
        writer = MilesRunWriter(tensorboard_dir, ci_dir, sys.stdout)
        start = f"{format_log_time(time.time())} replay.py:1 - "
    writer.print_line(
        f"{start}miles_amd replay of {Path(args.replay_source).name}: "
        f"{recipe.num_rollout} rollouts, {args.replay_pace} s each{fault} "
        f"({args.replay_writers} writers)"
    )
    replay(plan, rollouts, writer, args.replay_pace)
    return 0


if __name__ == "__main__":
    sys.exit(main())
