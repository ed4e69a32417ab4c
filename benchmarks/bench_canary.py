"""Benchmark: the canary's detection-power table and its CPU harness's throughput.

1. **Power table** (pure, ``miles_amd.canary.power`` and ``canary.plan``): for each per-call
   corruption rate p, the affected calls that catch it at 99 % (``ceil(ln 0.01 / ln(1-p))``),
   the node plan's total calls and its estimated node time (the published-latency model of
   ``canary.plan.NODE_LATENCY``, two TP-4 groups side by side), and the probability the plan
   buys; checked: every plan reaches 0.99.
2. **CPU throughput** (needs torch): ``miles-amd canary --reducer`` with gloo's all-reduce in
   4 processes over a few sizes; calls/s per N from the record's per-call latency (the wall
   time of blocks of calls, the check outside); checked: the run is clean (exit 0). Without
   torch in this interpreter the section says so and the figures say ``throughput=needs_torch``.

Last line: ``power_ok=<1|0> calls_1e-6=<n> node_s_1e-6=<s> cpu_calls_per_s_n1=<x>
cpu_calls_per_s_n29=<x> cpu_calls_per_s_n127=<x>`` (or ``throughput=needs_torch``); exit 1
when a plan misses 0.99 or the gloo run is not clean.

Run: ``python benchmarks/bench_canary.py [--quick]`` (the plan of ``--tokens 1,29,127
--detect-rate 0.5``, 7 affected calls, repeated 8 times in quick mode, 85 in full; quick: about
8 s with torch on 2 cores, mostly 4 torch imports).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from miles_amd.canary import power
from miles_amd.canary.plan import build_plan, recipe_shape
from miles_amd.recipe.settings import Recipe

RATES = (1e-3, 1e-4, 1e-5, 1e-6, 1e-7)
SIZES = (1, 29, 127)
GLOO = """import torch.distributed as dist


def gloo(tensor, group):
    dist.all_reduce(tensor, group=group)
    return tensor
"""


def power_table() -> tuple[bool, dict[str, str]]:
    shape = recipe_shape(Recipe())
    print("1. Power: affected calls for 99 %, the node plan (2 TP-4 groups), its time")
    print("| p | affected calls needed | plan calls | est. node s | probability |")
    print("|---|---|---|---|---|")
    ok, figures = True, {}
    for rate in RATES:
        plan = build_plan(shape, "aiter", rate, groups=2)
        total = sum(e.calls for e in plan.entries)
        ok &= plan.probability >= power.CONFIDENCE
        print(
            f"| {rate:g} | {power.calls_needed(rate)} | {total} | {plan.estimated_seconds:.1f} "
            f"| {plan.probability:.4f} |"
        )
        if rate == 1e-6:
            figures = {"calls_1e-6": str(total), "node_s_1e-6": f"{plan.estimated_seconds:.0f}"}
    return ok, figures


def throughput(repeats: int) -> tuple[bool, dict[str, str]]:
    print()
    print("2. CPU harness throughput (gloo, 4 processes)")
    if importlib.util.find_spec("torch") is None:
        print(
            "torch is not importable here: the throughput needs torch (pip install torch==2.13.0)"
        )
        return True, {"throughput": "needs_torch"}
    with tempfile.TemporaryDirectory() as tmp:
        reducer = Path(tmp) / "gloo.py"
        reducer.write_text(GLOO, encoding="utf-8")
        # 0.5 buys 7 affected calls (29 and 127 share them; 1 is a control); repeats scale.
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "miles_amd.cli",
                "canary",
                "--reducer",
                f"{reducer}:gloo",
                "--tokens",
                ",".join(map(str, SIZES)),
                "--detect-rate",
                "0.5",
                "--repeats",
                str(repeats),
                "--json",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=900,
        )
    if done.returncode != 0:
        print(f"the gloo canary exited {done.returncode}: {done.stderr.strip()[-300:]}")
        return False, {"throughput": "failed"}
    record = json.loads(done.stdout)
    figures = {}
    print("| N | calls | latency ms | calls/s |")
    print("|---|---|---|---|")
    for result in record["results"]:
        per_s = 1e6 / result["latency_us"]
        latency_ms = result["latency_us"] / 1000
        print(f"| {result['tokens']} | {result['calls']} | {latency_ms:.2f} | {per_s:.0f} |")
        figures[f"cpu_calls_per_s_n{result['tokens']}"] = f"{per_s:.0f}"
    return True, figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 repeats of the plan (CI)")
    args = parser.parse_args()
    power_ok, figures = power_table()
    run_ok, more = throughput(8 if args.quick else 85)
    print()
    line = {"power_ok": "1" if power_ok else "0", **figures, **more}
    print(" ".join(f"{k.replace('-', '_').replace('.', '_')}={v}" for k, v in line.items()))
    return 0 if power_ok and run_ok else 1


if __name__ == "__main__":
    sys.exit(main())
