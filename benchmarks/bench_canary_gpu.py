"""Benchmark on a CUDA (or ROCm) machine: the positive control's detection, and device time.

1. **Control** (``canary.harness.run_control``'s builds): the broken build, then the correct
   one, over ``--tokens`` with ``--control-calls`` back-to-back calls each, in the canary's own
   ranks (``canary.harness.run``); per size the calls, the calls caught wrong, their rate, the
   control's time per call and the fingerprint of the first wrong element; checked: the broken
   build caught, the correct one clean.
2. **Device time** (one process): ``bench_canary.EXACT``'s per-call work as the harness does
   it (a block of inputs ``a + b``, the local exact sum, one batched check), its GPU busy time
   per call (torch's profiler) against its wall time per call (unprofiled): the rest is the
   host's. ``bench_canary.py --device cuda`` gives the harness's own per-call cost in 4 ranks.

When the world is larger than the GPUs (``--world-size 4`` on one GPU) the ranks share the
GPUs and their device groups use gloo (NCCL refuses two ranks on one GPU); kernels of different
processes then time-slice, so the control's race window is wider than on separate GPUs.

Last line: ``control_caught=<0|1> control_clean=<0|1>``; exit 1 when the broken build is not
caught or the correct one is not clean.

Run: ``python benchmarks/bench_canary_gpu.py --world-size 4 --tokens 1,32,127,255,1023``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

from bench_canary import EXACT  # type: ignore[import-not-found]  # run as a script beside it

from miles_amd.canary.harness import HarnessError, Setup, control_fingerprint, control_result, run
from miles_amd.canary.plan import ARMS, CONTROL_CALLS, Plan, build_plan, recipe_shape
from miles_amd.recipe.settings import Recipe

TIMEOUT_S = 240.0


def _plan(tokens: list[int], implementation: str, calls: int) -> Plan:
    plan = build_plan(recipe_shape(Recipe()), "aiter", 0.5, tokens=tokens)
    entries = tuple(
        dataclasses.replace(e, arms=((ARMS[0], calls),), implementation=implementation)
        for e in plan.entries
    )
    return dataclasses.replace(plan, entries=entries)


def control_section(tokens: list[int], calls: int, world: int, share: bool) -> dict[str, str]:
    shape = recipe_shape(Recipe())
    figures = {}
    for build in ("control-broken", "control"):
        began = time.perf_counter()
        setup = Setup(world, "cuda", build, collective="gloo" if share else None)
        record = run(_plan(tokens, build, calls), setup, TIMEOUT_S)
        print(f"\n1. {build} ({time.perf_counter() - began:.0f} s with the build)")
        print("| N | calls | wrong calls | rate | us/call | fingerprint of the first |")
        print("|---|---|---|---|---|---|")
        for r in record.results:
            first = r.first_mismatch
            mark = (
                control_fingerprint(first, r.tokens, shape.hidden, shape.tp, shape.dtype_size)
                if first
                else "-"
            )
            print(
                f"| {r.tokens} | {r.calls} | {r.mismatches} | {r.mismatches / r.calls:.3f} "
                f"| {r.latency_us:.0f} | {mark} |"
            )
        result = control_result(record, shape.hidden, shape.tp, shape.dtype_size)
        print(json.dumps(dataclasses.asdict(result)))
        key = "control_caught" if build == "control-broken" else "control_clean"
        figures[key] = "1" if result.caught == (build == "control-broken") else "0"
    return figures


def _block(exact: Any, group: Any, a: Any, expected: Any, calls: int) -> None:
    """A block of calls as the harness makes them, then the batched check (one host sync)."""
    import torch

    outs = [exact(a + (b % 49 - 24), group) for b in range(calls)]
    torch.stack(outs).ne(expected).flatten(1).any(1).cpu()


def device_section(tokens: list[int], calls: int) -> dict[str, str]:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    namespace: dict[str, Any] = {}
    exec(EXACT, namespace)  # the harness benchmark's reducer, in a group of one
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    group = dist.group.WORLD
    exact = namespace["exact"]
    hidden, dtype = recipe_shape(Recipe()).hidden, torch.bfloat16
    print("\n2. One process: GPU busy time per call against wall time per call")
    print("| N | calls | wall us/call | GPU busy us/call |")
    print("|---|---|---|---|")
    for n in tokens:
        a = torch.randint(-7, 8, (n, hidden), device="cuda").to(dtype)
        block = max(1, min(calls, (1 << 30) // (4 * a.numel() * a.element_size())))
        expected = exact(a, group)
        _block(exact, group, a, expected, block)  # warm-up: the allocator, the sum's cache
        torch.cuda.synchronize()
        began = time.perf_counter()
        _block(exact, group, a, expected, block)
        wall = time.perf_counter() - began
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            _block(exact, group, a, expected, block)
        busy = sum(e.self_device_time_total for e in prof.key_averages())
        print(f"| {n} | {block} | {1e6 * wall / block:.1f} | {busy / block:.1f} |")
    dist.destroy_process_group()
    return {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--tokens", default="1,32,127,255,1023")
    parser.add_argument("--control-calls", type=int, default=CONTROL_CALLS)
    parser.add_argument("--device-calls", type=int, default=512)
    parser.add_argument("--skip", default="", help="sections to skip: control,device")
    args = parser.parse_args()
    import torch

    tokens = [int(t) for t in args.tokens.split(",")]
    share = args.world_size > torch.cuda.device_count()
    skip = set(args.skip.split(","))
    figures: dict[str, str] = {}
    sections = {
        "control": lambda: control_section(tokens, args.control_calls, args.world_size, share),
        "device": lambda: device_section(tokens, args.device_calls),
    }
    for name, section in sections.items():
        if name in skip:
            continue
        try:
            figures |= section() or {}
        except HarnessError as exc:
            print(f"{name}: {exc}")
            figures[name] = "failed"
    print()
    print(" ".join(f"{k}={v}" for k, v in figures.items()))
    ok = figures.get("control_caught") == figures.get("control_clean") == "1"
    return 0 if ok or "control" in skip else 1


if __name__ == "__main__":
    sys.exit(main())
