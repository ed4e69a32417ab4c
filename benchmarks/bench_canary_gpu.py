"""Benchmark on a CUDA (or ROCm) machine: the positive control's detection and the harness's cost.

1. **Control** (``canary.control``): the broken build, then the correct one, over ``--tokens``
   with ``--control-calls`` calls each, in the canary's own ranks (``canary.harness`` spec,
   ``canary.launch``, ``canary.worker``); per size the calls, the calls caught wrong, their
   rate and the fingerprint of the first wrong element; checked: the broken build caught,
   the correct one clean.
2. **Harness** (``canary.worker`` with ``EXACT``, a reducer that makes the exact sum locally,
   so the figure is the harness's): per size the per-call time of a block (``latency_us``).
3. **Device time**: one process, the same per-call work (input ``a + b``, the local sum, the
   check's stack and compare) under torch's profiler: the GPU's busy time per call against
   the wall time per call; the rest is the host's.

When the world is larger than the GPUs (``--world-size 4`` on one GPU) the ranks share the
GPUs and the spec's backend is gloo (NCCL refuses two ranks on one GPU); kernels of different
processes then time-slice, so the control's race window is wider than on separate GPUs.

Last line: ``control_caught=<0|1> control_clean=<0|1> harness_us_n<N>=<x> ...``; exit 1 when
the broken build is not caught or the correct one is not clean.

Run: ``python benchmarks/bench_canary_gpu.py --world-size 4 --tokens 1,32,127,255,1023``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from miles_amd.canary import control
from miles_amd.canary.harness import Setup, merge, spec
from miles_amd.canary.launch import HarnessError, run_ranks
from miles_amd.canary.plan import Plan, build_plan, recipe_shape
from miles_amd.recipe.settings import Recipe

TIMEOUT_S = 240.0
EXACT = """import torch
import torch.distributed as dist
from miles_amd.canary.worker import A_MOD, A_OFFSET

_CACHE = {}


def exact_sum(t, tp, r):
    key = (t.shape, t.dtype)
    if key not in _CACHE:
        index = torch.arange(t.numel(), device=t.device).view(t.shape)
        terms = [((5 * index + 3 * k) % A_MOD - A_OFFSET).float() for k in range(tp)]
        _CACHE[key] = (terms[r], sum(terms) - terms[r])
    own, others = _CACHE[key]
    b = t.flatten()[0].float() - own.flatten()[0]
    return (t.float() + others + (tp - 1) * b).to(t.dtype)


def exact(t, group):
    return exact_sum(t, dist.get_world_size(group), dist.get_rank(group))
"""


def _plan(tokens: list[int], implementation: str, calls: int) -> Plan:
    plan = build_plan(recipe_shape(Recipe()), "aiter", 0.5, tokens=tokens)
    entries = tuple(
        dataclasses.replace(e, calls=calls, implementation=implementation) for e in plan.entries
    )
    return dataclasses.replace(plan, entries=entries)


def _run(plan: Plan, setup: Setup, share_gpu: bool, timeout_s: float) -> Any:
    data = spec(plan, setup)
    if share_gpu:
        data["backend"] = "gloo"
    started = time.time()
    ranks = run_ranks(data, timeout_s)
    return merge(plan, setup, ranks, started, time.time())


def control_section(tokens: list[int], calls: int, world: int, share: bool) -> dict[str, str]:
    shape = recipe_shape(Recipe())
    figures = {}
    for build in ("control-broken", "control"):
        began = time.perf_counter()
        setup = Setup(world_size=world, device="cuda", implementation=build)
        record = _run(_plan(tokens, build, calls), setup, share, TIMEOUT_S)
        print(f"\n1. {build} ({time.perf_counter() - began:.0f} s with the build)")
        print("| N | calls | wrong calls | rate | us/call | fingerprint of the first |")
        print("|---|---|---|---|---|---|")
        for r in record.results:
            first = r.first_mismatch
            mark = (
                control.fingerprint(first, r.tokens, shape.hidden, shape.tp, shape.dtype_size)
                if first
                else "-"
            )
            print(
                f"| {r.tokens} | {r.calls} | {r.mismatches} | {r.mismatches / r.calls:.3f} "
                f"| {r.latency_us:.0f} | {mark} |"
            )
        result = control.control_result(record, shape.hidden, shape.tp, shape.dtype_size)
        print(json.dumps(dataclasses.asdict(result)))
        key = "control_caught" if build == "control-broken" else "control_clean"
        figures[key] = "1" if result.caught == (build == "control-broken") else "0"
    return figures


def harness_section(tokens: list[int], calls: int, world: int, share: bool) -> dict[str, str]:
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "exact.py"
        path.write_text(EXACT, encoding="utf-8")
        setup = Setup(world, "cuda", "reducer", reducer=f"{path}:exact")
        record = _run(_plan(tokens, "reducer", calls), setup, share, TIMEOUT_S)
    print(f"\n2. Harness per call ({world} ranks, exact local sum)")
    print("| N | calls | wrong calls | us/call |")
    print("|---|---|---|---|")
    for r in record.results:
        print(f"| {r.tokens} | {r.calls} | {r.mismatches} | {r.latency_us:.1f} |")
        figures[f"harness_us_n{r.tokens}"] = f"{r.latency_us:.0f}"
    return figures


def device_section(tokens: list[int], calls: int) -> dict[str, str]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    namespace: dict[str, Any] = {}
    exec(EXACT, namespace)  # the reducer's own text: the same work as in the ranks
    exact_sum = namespace["exact_sum"]
    hidden, dtype = recipe_shape(Recipe()).hidden, torch.bfloat16
    print("\n3. One process: GPU busy time per call against wall time per call")
    print("| N | calls | wall us/call | GPU busy us/call |")
    print("|---|---|---|---|")
    for n in tokens:
        a = torch.randint(-7, 8, (n, hidden), device="cuda").to(dtype)
        block = max(1, min(calls, (1 << 30) // (4 * a.numel() * a.element_size())))
        expected = exact_sum(a, 4, 0)
        for _ in range(2):  # the first pass warms the allocator and the kernels' caches
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                torch.cuda.synchronize()
                began = time.perf_counter()
                outs = [exact_sum(a + (b % 49 - 24), 4, 0) for b in range(block)]
                torch.stack(outs).ne(expected).flatten(1).any(1).cpu()  # the check's work
                torch.cuda.synchronize()
                wall = time.perf_counter() - began
        busy = sum(e.self_device_time_total for e in prof.key_averages())
        print(f"| {n} | {block} | {1e6 * wall / block:.1f} | {busy / block:.1f} |")
    return {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--tokens", default="1,32,127,255,1023")
    parser.add_argument("--control-calls", type=int, default=control.CONTROL_CALLS)
    parser.add_argument("--harness-calls", type=int, default=2000)
    parser.add_argument("--skip", default="", help="sections to skip: control,harness,device")
    args = parser.parse_args()
    import torch

    tokens = [int(t) for t in args.tokens.split(",")]
    share = args.world_size > torch.cuda.device_count()
    skip = set(args.skip.split(","))
    figures: dict[str, str] = {}
    sections = {
        "control": lambda: control_section(tokens, args.control_calls, args.world_size, share),
        "harness": lambda: harness_section(tokens, args.harness_calls, args.world_size, share),
        "device": lambda: device_section(tokens, min(args.harness_calls, 512)),
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
