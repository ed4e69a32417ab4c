"""Robustness figures of the CPU rehearsal: how often the harness is right, and its cost.

Runs the healthy replay of the embedded jvvnhop9 run N times and every fault of
``miles_amd.testing.faults`` once, each through the real driver, watcher and gate on one local Ray
head (the tool's private head: loopback, token auth, ports it chose) used as an external
cluster: the head declares itself one whole fake MI355X node (8 GPUs and the whole-node
resource), as cluster mode requires of a node and as ``tests/rehearsal/conftest.py`` does. It
prints:

- runs, passes, false greens (a faulty run that passed: must be 0) and false reds (a healthy
  run, or the harmless known sentinel, that did not pass: must be 0);
- the median fail-fast latency: the driver's stop request minus the moment the fault appeared
  on the job's own clock (job.json ``failfast_latency_s``);
- the harness overhead of healthy runs: driver wall time (submit, stream, gate, report) over
  the replay's own run time (job.json ``end_time - start_time``), median.

Usage: ``python benchmarks/bench_rehearsal.py [--runs N] [--pace S] [--interval S] [--quick]``;
``--quick`` (CI, ``benchmarks/run_quick.py``) runs one healthy replay and only the faults in
``QUICK_FAULTS`` (a fail-fast stop and the harmless sentinel), watching every second. The
last line is ``runs=<n> passes=<n> false_green=<n> false_red=<n> failfast_median_s=<s>
overhead=<x>``; the exit code is 1 when either false count is not 0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

# ``python benchmarks/<name>.py`` puts benchmarks/ first on the path; tests.support needs the repo.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from miles_amd.recipe.plan import NODE_RESOURCE, ray_start_argv
from miles_amd.records.job import JobRecord
from miles_amd.run.ray_head import RayHead
from miles_amd.run_dir import RunDir
from miles_amd.testing.faults import FAULTS
from tests.support.rehearsal import expectation_problems, rehearse

# --quick: one fault the watcher stops (fail-fast latency) and the one that must still pass.
QUICK_FAULTS = ("spike", "known-sentinel")


def whole_node_head_argv() -> tuple[str, ...]:
    """A head that is one fake whole MI355X node: what cluster mode asks a node to be."""
    return (*ray_start_argv(8, "127.0.0.1"), "--resources", json.dumps({NODE_RESOURCE: 1}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="healthy replays (default 20)")
    parser.add_argument("--pace", type=float, default=0.1, help="seconds per rollout")
    parser.add_argument("--interval", type=float, default=2.0, help="watcher interval, s")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"CI: 1 healthy replay, {', '.join(QUICK_FAULTS)}; interval 1 s",
    )
    args = parser.parse_args()
    faults = list(QUICK_FAULTS) if args.quick else list(FAULTS)
    healthy_runs = 1 if args.quick else args.runs
    interval = 1.0 if args.quick else args.interval

    work = Path(tempfile.mkdtemp(prefix="bench_rehearsal_"))
    head = RayHead.start(whole_node_head_argv(), env=dict(os.environ), log_path=work / "head.log")
    env = {
        **os.environ,
        "RAY_ADDRESS": head.dashboard_url,
        "RAY_AUTH_TOKEN_PATH": str(head.token_path),
    }
    cases = [None] * healthy_runs + faults
    runs = passes = false_green = false_red = 0
    latencies: list[float] = []
    overheads: list[float] = []
    try:
        for i, fault in enumerate(cases):
            run_dir = work / f"run{i:03d}-{fault or 'healthy'}"
            started = time.monotonic()
            result = rehearse(
                env,
                run_dir,
                fault=fault,
                pace_s=args.pace
                if fault is None or FAULTS[fault].driver_stop not in ("fail-fast", "look")
                else 0.5,
                watch_interval_s=interval,
                timeout_s=10.0 if fault == "hang" else 120.0,
                state_dir=str(work / "state"),
            )
            wall = time.monotonic() - started
            job = JobRecord.from_json(RunDir(run_dir).job_json.read_text())
            runs += 1
            passes += result.verdict == "pass"
            problems = expectation_problems(fault, result)
            if problems:
                if result.verdict == "pass":
                    false_green += 1
                else:
                    false_red += 1
            if job.failfast_latency_s is not None:
                latencies.append(job.failfast_latency_s)
            if fault is None and job.end_time and job.start_time:
                overheads.append(wall / (job.end_time - job.start_time))
            print(
                f"{fault or 'healthy':18s} verdict={result.verdict:5s} "
                f"stopped_by={result.outcome.stopped_by or '-':9s} wall={wall:5.1f}s "
                + ("ok" if not problems else "WRONG: " + "; ".join(problems)),
                flush=True,
            )
    finally:
        head.stop()
        shutil.rmtree(work, ignore_errors=True)
    failfast = statistics.median(latencies) if latencies else float("nan")
    overhead = statistics.median(overheads) if overheads else float("nan")
    print(
        f"runs={runs} passes={passes} false_green={false_green} false_red={false_red} "
        f"failfast_median_s={failfast:.2f} overhead={overhead:.2f}"
    )
    return 1 if false_green or false_red else 0


if __name__ == "__main__":
    raise SystemExit(main())
