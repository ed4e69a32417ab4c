"""Benchmark: the canary's power and node time, and its harness's own cost per call.

1. **Power and node time** (pure, ``miles_amd.canary.plan``): for the rate
   the spikes imply (``plan.implied_rate``) and a few others, the exposed calls that catch it
   at 99 %, the node plan's calls and estimated node time per variant (two TP-4 groups side by
   side; the kernel from published latencies, the harness from the H200 measurement); checked:
   every plan reaches 0.99.
2. **Harness cost per call** (needs torch): the real harness (``canary.harness.run``: 4 worker
   processes, blocks, the batched check, the group-wide flags) with a reducer that makes the
   exact sum locally, so the figure is the harness alone (the issue's H200 method); back-to-back
   arm only. On CPU over gloo; with ``--device cuda`` the 4 ranks share cuda:0, the device
   groups over gloo as in the H200 measurement. Checked: the run is clean. Without torch the
   section says so and the figures say ``harness=needs_torch``.

Last line: ``power_ok=<1|0> implied_rate=<p> calls_implied=<n> node_s_implied=<s>
<device>_harness_us_n<N>=<us> ...``; exit 1 when a plan misses 0.99 or the run is not clean.

Run: ``python benchmarks/bench_canary.py [--quick] [--device cpu|cuda]`` (quick: 3 sizes and 64
calls each on CPU, about 20 s on 2 cores, mostly 4 torch imports).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from miles_amd.canary import plan as power
from miles_amd.canary.plan import CPU, NODE, build_plan, recipe_shape
from miles_amd.recipe.settings import Recipe

RATES = (1e-3, 1e-4, 1e-5, 1e-6)
# The exact sum of canary.worker's inputs, made from this rank's own input: no communication,
# so what is timed is the harness (out of place, as aiter's all-reduce is).
EXACT = """
import torch
import torch.distributed as dist

A_MOD, A_OFFSET = 15, 7
_sums = {}


def exact(tensor, group):
    tp, rank = dist.get_world_size(group), dist.get_rank(group)
    key = tuple(tensor.shape)
    if key not in _sums:
        index = torch.arange(tensor.numel(), device=tensor.device).view(key)
        total = sum((5 * index + 3 * k) % A_MOD - A_OFFSET for k in range(tp))
        _sums[key] = total.to(tensor.dtype)
    phase = tensor.view(-1)[:1] - ((3 * rank) % A_MOD - A_OFFSET)
    return _sums[key] + tp * phase
"""


def power_table() -> tuple[bool, dict[str, str]]:
    shape = recipe_shape(Recipe())
    implied = power.implied_rate()
    print("1. Power and node time per variant (2 TP-4 groups side by side)")
    print("| p | exposed calls needed | plan calls | est. node s | probability |")
    print("|---|---|---|---|---|")
    ok, figures = True, {"implied_rate": f"{implied:.3g}"}
    for rate in (implied, *RATES):
        plan = build_plan(shape, "aiter", rate, groups=2)
        total = sum(e.calls for e in plan.entries)
        ok &= plan.probability >= power.CONFIDENCE
        label = f"{rate:.3g} (implied)" if rate == implied else f"{rate:g}"
        print(
            f"| {label} | {power.calls_needed(rate)} | {total} | {plan.estimated_seconds:.1f} "
            f"| {plan.probability:.4f} |"
        )
        if rate == implied:
            figures |= {
                "calls_implied": str(total),
                "node_s_implied": f"{plan.estimated_seconds:.0f}",
            }
    return ok, figures


def harness_cost(device: str, quick: bool) -> tuple[bool, dict[str, str]]:
    from miles_amd.canary.harness import HarnessError, Setup, run

    print()
    print(f"2. Harness cost per call ({device}, 4 ranks, a reducer that sums locally)")
    if importlib.util.find_spec("torch") is None:
        print("torch is not importable here: this needs torch (pip install torch==2.13.0)")
        return True, {"harness": "needs_torch"}
    sizes = (1, 32, 127) if device == "cpu" else (1, 32, 127, 255, 1023, 4095, 11650)
    calls = (64 if quick else 512) if device == "cpu" else (256 if quick else 2048)
    target = CPU if device == "cpu" else NODE
    plan = build_plan(
        recipe_shape(Recipe()), "reducer", 0.5, target=target, tokens=sizes, arms=("back_to_back",)
    )
    plan = replace(
        plan, entries=tuple(replace(e, arms=(("back_to_back", calls),)) for e in plan.entries)
    )
    with tempfile.TemporaryDirectory() as tmp:
        reducer = Path(tmp) / "exact.py"
        reducer.write_text(EXACT, encoding="utf-8")
        setup = Setup(4, device, "reducer", reducer=f"{reducer}:exact", collective="gloo")
        try:
            record = run(plan, setup, timeout_s=900)
        except HarnessError as exc:
            print(f"the harness failed: {exc}")
            return False, {"harness": "failed"}
    print("| N | calls | calls alone, us per call | whole blocks (inputs, check), us per call |")
    print("|---|---|---|---|")
    figures = {}
    for result in record.results:
        print(
            f"| {result.tokens} | {result.calls} | {result.latency_us:.1f} | {result.cost_us:.1f} |"
        )
        figures[f"{device}_harness_us_n{result.tokens}"] = f"{result.cost_us:.1f}"
    return record.clean, figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and calls (CI)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    power_ok, figures = power_table()
    run_ok, more = harness_cost(args.device, args.quick)
    print()
    line = {"power_ok": "1" if power_ok else "0", **figures, **more}
    print(" ".join(f"{k.replace('-', '_').replace('.', '_')}={v}" for k, v in line.items()))
    return 0 if power_ok and run_ok else 1


if __name__ == "__main__":
    sys.exit(main())
