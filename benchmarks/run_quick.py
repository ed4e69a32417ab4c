"""Every benchmark in its quick mode, checked: CI's ``benchmarks`` check (``.ci/run``).

Decides which scripts run (``BENCHMARKS``: every ``bench_*.py`` here, a test keeps the two
equal) and what a passing benchmark run is: exit 0 within ``TIMEOUT_S``, and a last stdout
line of figures, ``key=value`` pairs separated by single spaces, every key a name and no value
a non-finite number (a NaN figure measured nothing). Each script's exit code is its own pass
condition (no false green, the readers agree, every point read, ...). It does not judge the
figures: speed is printed, never asserted. Each runs as ``python <script> --quick``.

Run: ``python benchmarks/run_quick.py [NAME ...]`` (default: all). The last line reads
``benchmarks=<n> passed=<n> failed=<n> skipped=<n> total_s=<seconds>``; exit 1 when any failed.
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Every benchmark script, in run order, with the reason it is skipped (None: it runs).
BENCHMARKS: dict[str, str | None] = {
    "bench_gate.py": None,
    "bench_log.py": None,
    "bench_rehearsal.py": None,
    "bench_cluster.py": None,
    "bench_drift.py": None,
    "bench_calibration.py": None,
    "bench_canary.py": None,
    "bench_canary_gpu.py": 'needs a CUDA or ROCm GPU (docs/node.md, "What a GPU run showed")',
}
# A hang guard, not a speed target: the quick modes take seconds to about a minute each.
TIMEOUT_S = 600.0
FIGURE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)")


@dataclass(frozen=True)
class Outcome:
    """One benchmark's quick run: ``problem`` is None when it passed."""

    name: str
    seconds: float
    problem: str | None


def figures_problem(line: str) -> str | None:
    """Why ``line`` is not a figures line; None when it is."""
    if not line.strip():
        return "the last line is empty (no figures printed)"
    for token in line.split(" "):
        match = FIGURE.fullmatch(token)
        if match is None:
            return f"{token!r} is not key=value"
        try:
            number = float(match.group(2))
        except ValueError:
            continue  # a non-numeric figure (">160") is a figure too
        if not math.isfinite(number):
            return f"figure {match.group(1)} is {match.group(2)}"
    return None


def run_benchmark(script: Path, timeout_s: float = TIMEOUT_S) -> Outcome:
    """Run ``script --quick``, echo its output, and say whether it passed."""
    started = time.monotonic()
    try:
        child = subprocess.run(
            [sys.executable, str(script), "--quick"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return Outcome(script.name, time.monotonic() - started, f"no exit after {timeout_s:.0f} s")
    seconds = time.monotonic() - started
    print(child.stdout, end="", flush=True)
    lines = child.stdout.rstrip("\n").splitlines()
    if child.returncode != 0:
        print(child.stderr[-4000:], end="", file=sys.stderr, flush=True)
        return Outcome(script.name, seconds, f"exit {child.returncode}")
    return Outcome(script.name, seconds, figures_problem(lines[-1] if lines else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"of {', '.join(BENCHMARKS)}")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    names = args.names or list(BENCHMARKS)
    outcomes: list[Outcome] = []
    skipped = 0
    for name in names:
        reason = BENCHMARKS[name]
        if reason is not None:
            print(f"BENCH {name}: skipped: {reason}", flush=True)
            skipped += 1
            continue
        print(f"BENCH {name} --quick", flush=True)
        outcome = run_benchmark(HERE / name)
        status = "ok" if outcome.problem is None else f"FAILED: {outcome.problem}"
        print(f"BENCH {name}: {status} ({outcome.seconds:.1f} s)", flush=True)
        outcomes.append(outcome)
    failed = [o.name for o in outcomes if o.problem is not None]
    if failed:
        print(f"BENCH failed: {', '.join(failed)}", file=sys.stderr)
    total = sum(o.seconds for o in outcomes)
    print(
        f"benchmarks={len(names)} passed={len(outcomes) - len(failed)} failed={len(failed)} "
        f"skipped={skipped} total_s={total:.1f}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
