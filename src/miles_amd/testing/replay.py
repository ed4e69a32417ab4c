"""``python -m miles_amd.testing.replay``: miles' ``train.py`` replaced by a recorded run,
re-emitted as miles would (job log, TensorBoard, CI history) with at most one fault. Refused
(one line, exit 2) before anything is written: an argv not exactly the recipe's (the flag
named), missing output dirs, an untrustworthy or too short source, a fault that cannot fire.
docs/rehearsal.md ("The replay").
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, get_origin, get_type_hints

from miles_amd.evidence.types import SeriesMap
from miles_amd.recipe.settings import SETTINGS, Recipe, RecipeError
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

# What every baseline rules on without an "optional"; the embedded example has exactly these.
REQUIRED_KEYS = ("train/train_rollout_logprob_abs_diff", "rollout/raw_reward", "train/pg_clipfrac")
TENSORBOARD_ENV = "TENSORBOARD_DIR"
CI_HISTORY_ENV = "MILES_CI_GATE_RECORD_DIR"
MILES_SRC_ENV = "MILES_AMD_MILES_SRC"
Flag = tuple[str, tuple[str, ...]]
Writer = Any  # MilesRunWriter or real_writers.RealRunWriter: the same methods


class ReplayRefused(ValueError):
    """The message names the flag, variable or file and the fix."""


def split_flags(argv: Sequence[str]) -> list[Flag]:
    """``["--a", "1", "--b"]`` -> ``[("--a", ("1",)), ("--b", ())]``."""
    flags: list[tuple[str, list[str]]] = []
    for token in argv:
        if token.startswith("--"):
            flags.append((token, []))
        elif not flags:
            raise ReplayRefused(f"{token}: a value before any flag; pass the recipe's argv")
        else:
            flags[-1][1].append(token)
    return [(flag, tuple(values)) for flag, values in flags]


def recipe_from_argv(argv: Sequence[str]) -> Recipe:
    """The recipe whose ``argv()`` ``argv`` would be, read from each setting's first flag."""
    flags: dict[str, tuple[str, ...]] = {}
    for flag, values in split_flags(argv):
        if flag in flags:
            raise ReplayRefused(f"{flag}: given twice; the recipe passes it once")
        flags[flag] = values
    types = get_type_hints(Recipe)
    fields: dict[str, object] = {}
    for name, declared in SETTINGS.items():
        if not declared.argv:
            continue
        flag, kind = declared.argv[0], types[name]
        if kind is bool:
            fields[name] = (flag in flags) != declared.negated
            continue
        if flag not in flags:
            continue
        if len(flags[flag]) != 1:
            raise ReplayRefused(f"{flag}: takes one value, got {len(flags[flag])}")
        raw = flags[flag][0]
        if get_origin(kind) is tuple:
            fields[name] = tuple(raw.split(","))
        elif declared.under:  # the directory ``under`` levels above the value
            for _ in range(declared.under.count("/") + 1):
                raw = raw.rpartition("/")[0]
            fields[name] = raw
        else:
            try:
                fields[name] = kind(raw)
            except ValueError:
                raise ReplayRefused(f"{flag} {raw}: not a valid {kind.__name__}") from None
    return Recipe(**fields)  # type: ignore[arg-type]


def check_argv(argv: Sequence[str]) -> Recipe:
    """The recipe of ``argv`` if ``argv`` is exactly its ``argv()``; else the first difference."""
    try:
        recipe = recipe_from_argv(argv)
    except RecipeError as exc:
        raise ReplayRefused(f"the recipe rejects this argv: {exc}") from None
    want, got = split_flags(recipe.argv()), split_flags(argv)
    want_flags, got_flags = {f for f, _ in want}, {f for f, _ in got}
    for w, g in itertools.zip_longest(want, got):
        if w == g:
            continue
        if g is not None and g[0] not in want_flags:
            raise ReplayRefused(f"{g[0]}: not a flag of the recipe; the replay takes its argv only")
        if w is not None and w[0] not in got_flags:
            raise ReplayRefused(f"{w[0]}: missing; the recipe passes {' '.join((w[0], *w[1]))}")
        assert w is not None and g is not None
        if w[0] != g[0]:
            raise ReplayRefused(f"{g[0]}: out of the recipe's order (it passes {w[0]} here)")
        raise ReplayRefused(
            f"{' '.join((g[0], *g[1]))}: the recipe passes {' '.join((w[0], *w[1]))} "
            "(only recipe options change argv values)"
        )
    return recipe


def load_source(source: str) -> SeriesMap:
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


def source_rollouts(source: str, series: SeriesMap) -> int:
    """Rollouts in the source: every series at steps ``0..n-1`` once, ``n`` the shortest."""
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


def resolve_miles_src(given: str | None, env: Mapping[str, str]) -> Path:
    raw = given or env.get(MILES_SRC_ENV)
    if not raw:
        raise ReplayRefused(
            f"--replay-writers real needs miles' source: pass --replay-miles-src DIR or set "
            f"{MILES_SRC_ENV} (a node has /root/miles; CI unpacks ../shared/upstream/)"
        )
    if not (Path(raw) / "miles" / "utils" / "tracking_utils" / "tracking.py").is_file():
        raise ReplayRefused(f"--replay-miles-src {Path(raw)}: no miles/ package there")
    return Path(raw)


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
    parser = _Parser(prog="python -m miles_amd.testing.replay", allow_abbrev=False)
    add = parser.add_argument
    add("--replay-source", required=True, help="run directory to replay")
    add("--replay-pace", type=non_negative_seconds, default=0.5, help="seconds per rollout")
    add("--replay-fault", choices=sorted(FAULTS), default=None, help="inject one fault")
    add("--replay-fault-at", type=int, default=DEFAULT_FAULT_AT, help="its 0-based rollout")
    add("--replay-writers", choices=("imitation", "real"), default="imitation")
    add("--replay-miles-src", help=f"miles checkout for --replay-writers real (${MILES_SRC_ENV})")
    return parser


def _prepare(
    args: argparse.Namespace, argv: Sequence[str], env: Mapping[str, str]
) -> tuple[Recipe, FaultPlan, list[dict[str, float]], Path | None, Path | None]:
    recipe = check_argv(argv)
    tensorboard_dir = ci_dir = None
    if recipe.capture_metrics:  # miles reads both directories from the environment
        missing = [name for name in (TENSORBOARD_ENV, CI_HISTORY_ENV) if not env.get(name)]
        if missing:
            raise ReplayRefused(
                f"{' and '.join(missing)} not set: --use-tensorboard and the CI history "
                "need them (the launcher sets both in the job's runtime env when given a run dir)"
            )
        tensorboard_dir, ci_dir = Path(env[TENSORBOARD_ENV]), Path(env[CI_HISTORY_ENV])
    if args.replay_fault in ("no-tensorboard", "truncated-event") and tensorboard_dir is None:
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
    rollouts: list[dict[str, float]] = [{} for _ in range(recipe.num_rollout)]
    for key, points in series.items():
        if key not in STEP_KEYS:
            for step, value in points[: recipe.num_rollout]:
                rollouts[step][key] = value
    return recipe, plan, rollouts, tensorboard_dir if plan.write_tensorboard else None, ci_dir


def replay(
    plan: FaultPlan, rollouts: Sequence[Mapping[str, float]], writer: Writer, pace: float
) -> None:
    if plan.known_sentinel_at_start:
        for rank in range(len(writer.pids.trainers)):
            writer.print_actor_line(TRAINER_ACTOR, KNOWN_SENTINEL_BODY, rank)
    for rollout in range(plan.emit_rollouts):
        time.sleep(pace)
        if plan.crash_before == rollout:
            raise RuntimeError(f"replay fault 'crash': the trainer died before rollout {rollout}")
        if plan.fatal_sentinel_at == rollout:
            writer.print_actor_line(SGLANG_ACTOR, fatal_sentinel_body(time.time()))
        writer.emit_rollout(rollout, rollouts[rollout])
        if plan.hang_after == rollout:
            threading.Event().wait()  # the hang fault: until the driver kills the job
    writer.close()
    if plan.truncate_event_file:
        if writer.event_file is None:
            raise RuntimeError("replay fault 'truncated-event': cannot tell which file to cut")
        os.truncate(writer.event_file, final_record_cut(writer.event_file.read_bytes()))


def main(argv: Sequence[str] | None = None) -> int:
    args, rest = _parser().parse_known_args(argv)
    try:
        recipe, plan, rollouts, tensorboard_dir, ci_dir = _prepare(args, rest, os.environ)
        if args.replay_writers == "real":
            miles_src = resolve_miles_src(args.replay_miles_src, os.environ)
    except (ReplayRefused, RecipeError, FaultError) as exc:
        print(f"replay: refused: {exc}", file=sys.stderr)
        return 2
    fault = f", fault {args.replay_fault} (K={args.replay_fault_at})" if args.replay_fault else ""
    writer: Writer
    if args.replay_writers == "real":
        from miles_amd.testing.real_writers import RealRunWriter

        writer, start = RealRunWriter(miles_src, tensorboard_dir, ci_dir), ""
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
