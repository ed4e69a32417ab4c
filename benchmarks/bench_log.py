"""Benchmark: ``load_run`` on a 1 GiB job log: wall time and peak memory.

Writes, in a temporary run directory removed afterwards, a ``job.log`` of ``--gib`` GiB (default
1.00) as a long real run leaves it: the metric lines of ``--rollouts`` rollouts x ``--tags``
metrics (default 1000 x 150, miles' perf/rollout/step messages formatted by
``miles_amd.testing.miles_writer``) spread evenly through SGLang / Ray filler lines (decode
batches, prefill batches, HTTP access lines, a few known sentinels), which is what makes a real
log large. Then, in a fresh subprocess (so the figure is this read's alone), times
``load_run(run_dir)`` (the one streaming pass: metric lines and the sentinel scan) and reads
peak RSS from ``getrusage(RUSAGE_SELF).ru_maxrss``, also just before ``load_run`` (the
interpreter and imports).

The last line reads ``log_gib=<size> read_s=<wall seconds> cpu_s=<CPU seconds>
peak_rss_mib=<peak RSS> base_rss_mib=<RSS before load_run>``. Exits non-zero if the read does
not see every metric point written or finds a problem.

Peak RSS is the interpreter plus the metric points plus a few MiB of blocks, whatever the
log's size (``tests/unit/test_evidence_job_log.py`` holds the bound); most of the CPU is the
sentinel scan's substring searches. Figures it printed: docs/ci.md ("What the CPU suite and
the benchmarks measure").

Run: ``python benchmarks/bench_log.py [--gib 1.0] [--rollouts N] [--tags K]
[--quick]``; ``--quick`` (CI, ``benchmarks/run_quick.py``) is a 0.02 GiB log of 100 rollouts x
30 tags: the same completeness checks on a small log.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from miles_amd.testing.miles_writer import ActorPids, metric_log_lines

EPOCH = 1_780_000_000.0
FILLER = (
    "(SGLangEngine pid={engine}) [2026-05-28 10:{m:02d}:{s:02d} TP{tp}] Decode batch. "
    "#running-req: {req}, #token: {token}, token usage: 0.{usage:02d}, cuda graph: True, "
    "gen throughput (token/s): {tput}.{frac:02d}, #queue-req: 0",
    "(SGLangEngine pid={engine}) [2026-05-28 10:{m:02d}:{s:02d} TP{tp}] Prefill batch. "
    "#new-seq: {req}, #new-token: {token}, #cached-token: {tput}, token usage: 0.{usage:02d}, "
    "#running-req: {req}, #queue-req: 0",
    '(SGLangEngine pid={engine}) [2026-05-28 10:{m:02d}:{s:02d}] INFO:     127.0.0.1:{token} - "'
    'POST /generate HTTP/1.1" 200 OK',
    "(RolloutManager pid={engine}) [2026-05-28 10:{m:02d}:{s:02d}.{frac:03d} ] sglang_rollout.py:"
    "{req} - Abort {req} requests; {tput} samples done",
)
KNOWN = (
    "(MegatronTrainRayActor pid={engine}) shape is M:{req}, N:2880, K:4096, not found tuned "
    "config in /opt/aiter/configs/a8w8_tuned_gemm.csv, will use default config!"
)


def filler_block(seed: int, engine: int, target_bytes: int) -> str:
    """About ``target_bytes`` of varied filler lines (deterministic in ``seed``)."""
    lines, size, k = [], 0, seed
    while size < target_bytes:
        k = (k * 1103515245 + 12345) & 0x7FFFFFFF
        template = KNOWN if k % 997 == 0 else FILLER[k % len(FILLER)]
        line = template.format(
            engine=engine,
            m=k % 60,
            s=(k >> 6) % 60,
            tp=k % 8,
            req=k % 256,
            token=k % 65536,
            usage=k % 100,
            tput=k % 5000,
            frac=k % 100,
        )
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines) + "\n"


def write_log(path: Path, gib: float, rollouts: int, tags: int) -> int:
    """Write the log; returns the number of metric points in it."""
    names = [("train/", "rollout/", "perf/")[i % 3] + f"metric_{i}" for i in range(tags)]
    pids = ActorPids.around(4200)
    per_rollout = (int(gib * (1 << 30)) - 0) // rollouts
    fillers = [filler_block(seed, pids.sglang_engine, per_rollout) for seed in range(8)]
    with open(path, "w", encoding="utf-8") as log:
        for k in range(rollouts):
            metrics = {name: (k * 7 + i) / 3.0 for i, name in enumerate(names)}
            lines = metric_log_lines(k, metrics, pids, EPOCH + 300.0 * k)
            metric_text = "\n".join(lines) + "\n"
            filler = fillers[k % len(fillers)]
            room = per_rollout - len(metric_text)
            cut = filler.rfind("\n", 0, max(room, 1)) + 1
            log.write(filler[:cut])
            log.write(metric_text)
    return rollouts * tags


MEASURE = """
import json, resource, sys, time
from miles_amd.evidence.load import load_run
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
wall, cpu = time.perf_counter(), time.process_time()
evidence = load_run(sys.argv[1])
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({
    "read_s": wall, "cpu_s": cpu, "peak_kib": peak, "base_kib": base,
    "points": sum(len(s) for k, s in evidence.series.items() if k != "train/step"),
    "problems": [str(p) for p in evidence.problems],
    "sentinels": [(h.name, h.count) for h in evidence.sentinels],
}))
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="log size in GiB")
    parser.add_argument("--rollouts", type=int, default=1000)
    parser.add_argument("--tags", type=int, default=150)
    parser.add_argument(
        "--quick", action="store_true", help="CI: 0.02 GiB, 100 rollouts, 30 tags (overrides)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.gib, args.rollouts, args.tags = 0.02, 100, 30
    with tempfile.TemporaryDirectory(prefix="bench_log_") as tmp:
        run_dir = Path(tmp) / "run"
        run_dir.mkdir()
        log = run_dir / "job.log"
        points = write_log(log, args.gib, args.rollouts, args.tags)
        size = log.stat().st_size
        print(f"job.log: {size / (1 << 30):.2f} GiB, {points} metric points")
        child = subprocess.run(
            [sys.executable, "-c", MEASURE, str(run_dir)],
            capture_output=True,
            text=True,
            check=False,
        )
    if child.returncode != 0:
        print(child.stderr, file=sys.stderr)
        return 1
    result = json.loads(child.stdout)
    print(f"sentinels: {result['sentinels']}")
    failures = []
    if result["problems"]:
        failures.append(f"problems: {result['problems']}")
    if result["points"] != points:
        failures.append(f"read {result['points']} metric points of {points}")
    for failure in failures:
        print(f"ERROR: {failure}", file=sys.stderr)
    print(
        f"log_gib={size / (1 << 30):.2f} read_s={result['read_s']:.1f} "
        f"cpu_s={result['cpu_s']:.1f} peak_rss_mib={result['peak_kib'] / 1024:.0f} "
        f"base_rss_mib={result['base_kib'] / 1024:.0f}"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
