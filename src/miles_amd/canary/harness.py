"""A canary run end to end: the plan handed to the ranks, their results merged into a record.

Decides the run's shape and the merge (the ranks' work is ``canary.worker``, their processes
``canary.launch``):

- ``world_size`` ranks in TP groups of the plan's TP, side by side: each group makes
  ``ceil(calls / groups)`` of each size's calls per arm;
- :func:`tasks`: the order of the work: each size's arms in turn, the ``spread`` arm cut into
  slices interleaved over the whole run;
- :class:`Setup` says where: ``cpu`` (gloo, float32; a small GEMM and a 1 ms skew) or ``cuda``
  (nccl = RCCL, the recipe's dtype, a hidden x hidden GEMM, a 20 us skew);
- the merge: per size and arm, ``mismatches`` sums the groups' counts of calls wrong on at
  least one of their ranks, blocks and blocks with a mismatch likewise; ``wrong_elements``
  sums every rank's; the kept mismatches are the earliest ``KEEP`` over ranks, each checked
  against the stale-read fingerprint (``canary.fingerprint``); ``latency_us`` is the mean over
  ranks of the calls' seconds per call, ``cost_us`` of the whole blocks' (inputs and check).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from miles_amd.canary import power
from miles_amd.canary.fingerprint import Layout, matches
from miles_amd.canary.launch import HarnessError, run_ranks
from miles_amd.canary.plan import SKEW_S, Plan
from miles_amd.records.canary import (
    SCHEMA_VERSION,
    STALE_READ,
    ArmResult,
    CanaryRecord,
    ControlRecord,
    Mismatch,
    PowerRecord,
    SizeResult,
)

CPU_MEM_BUDGET = 64 * 1024 * 1024
GPU_MEM_BUDGET = 1024 * 1024 * 1024
KEEP = 16
SPREAD_SLICES = 8
CPU_GEMM_WIDTH = 16
CPU_SKEW_S = 1e-3


@dataclass(frozen=True)
class Setup:
    """Where the ranks run and what they reduce with."""

    world_size: int
    device: str  # cpu or cuda
    implementation: str
    reducer: str | None = None
    variant: str | None = None
    repeats: int = 1
    aiter_version: str | None = None
    aiter_commit: str | None = None
    rate_source: str = "given: --detect-rate"
    control: ControlRecord | None = None
    collective: str | None = None  # the device groups' backend; default nccl on cuda, else gloo

    @property
    def backend(self) -> str:
        return self.collective or ("nccl" if self.device == "cuda" else "gloo")


def tensor_dtype(plan: Plan, setup: Setup) -> str:
    return plan.shape.dtype if setup.device == "cuda" else "float32"


def tasks(plan: Plan, groups: int) -> list[dict[str, Any]]:
    """Each size's arms in order; the ``spread`` arm's calls cut into :data:`SPREAD_SLICES`
    slices placed evenly over the run (module doc)."""
    steady, spread = [], []
    for i, entry in enumerate(plan.entries):
        for arm, calls in entry.arms:
            share = math.ceil(calls / groups)
            if arm != "spread":
                steady.append({"entry": i, "arm": arm, "calls": share})
                continue
            cut = min(SPREAD_SLICES, share)
            spread += [
                (k, {"entry": i, "arm": arm, "calls": share // cut + (1 if k < share % cut else 0)})
                for k in range(cut)
            ]
    queue = [task for _, task in sorted(spread, key=lambda item: item[0])]
    order: list[dict[str, Any]] = []
    placed = 0
    for k, task in enumerate(steady):
        order.append(task)
        due = (k + 1) * len(queue) // max(1, len(steady))
        order += queue[placed:due]
        placed = max(placed, due)
    return [*order, *queue[placed:]]


def spec(plan: Plan, setup: Setup) -> dict[str, Any]:
    """What every rank reads (``canary.worker``)."""
    groups = setup.world_size // plan.shape.tp
    gpu = setup.device == "cuda"
    return {
        "world_size": setup.world_size,
        "tp": plan.shape.tp,
        "hidden": plan.shape.hidden,
        "backend": setup.backend,
        "device": setup.device,
        "tensor_dtype": tensor_dtype(plan, setup),
        "implementation": setup.implementation,
        "reducer": setup.reducer,
        "repeats": setup.repeats,
        "mem_budget": GPU_MEM_BUDGET if gpu else CPU_MEM_BUDGET,
        "keep": KEEP,
        "gemm_width": plan.shape.hidden if gpu else CPU_GEMM_WIDTH,
        "skew_s": SKEW_S if gpu else CPU_SKEW_S,
        "entries": [{"tokens": e.tokens} for e in plan.entries],
        "tasks": tasks(plan, groups),
    }


def run(plan: Plan, setup: Setup, timeout_s: float) -> CanaryRecord:
    """Run the plan on the ranks and merge their results; ``launch.HarnessError`` otherwise."""
    started = time.time()
    ranks = run_ranks(spec(plan, setup), timeout_s)
    try:
        return merge(plan, setup, ranks, started, time.time())
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise HarnessError(f"the ranks' results do not fit the plan ({exc!r})") from None


def _kept(plan: Plan, ranks: list[dict[str, Any]], i: int) -> tuple[Mismatch, ...]:
    tokens, tp = plan.entries[i].tokens, plan.shape.tp
    layout = Layout(
        tokens, plan.shape.hidden, tp, plan.shape.dtype_size, plan.wave_size, plan.constants
    )
    found = sorted(
        ((m, r["rank"]) for r in ranks for m in r["entries"][i]["kept"]),
        key=lambda item: (item[0]["repeat"], item[0]["call"], item[1], item[0]["index"] or 0),
    )[:KEEP]
    return tuple(
        Mismatch(
            repeat=m["repeat"],
            call=m["call"],
            arm=m["arm"],
            rank=rank,
            index=m["index"],
            expected=m["expected"],
            seen=m["seen"],
            returned=m["returned"],
            matches=m["returned"] is None
            and matches(layout, rank % tp, m["index"], m["expected"], m["seen"]),
        )
        for m, rank in found
    )


def _size(
    plan: Plan, ranks: list[dict[str, Any]], leaders: list[dict[str, Any]], i: int
) -> SizeResult:
    entry = plan.entries[i]
    arms = []
    for arm, _ in entry.arms:
        mine = [r["entries"][i]["arms"].get(arm) for r in leaders]
        arms.append(
            ArmResult(
                arm=arm,
                calls=sum(m["calls"] for m in mine if m),
                mismatches=sum(m["bad"] for m in mine if m),
                blocks=sum(m["blocks"] for m in mine if m),
                blocks_with_mismatch=sum(m["block_hits"] for m in mine if m),
            )
        )
    calls = sum(a.calls for a in arms)
    mismatches = sum(a.mismatches for a in arms)
    blocks = sum(a.blocks for a in arms)
    block_hits = sum(a.blocks_with_mismatch for a in arms)
    kept = _kept(plan, ranks, i)
    made = [r["entries"][i]["arms"].values() for r in ranks]
    latency = [sum(a["seconds"] for a in m) / sum(a["calls"] for a in m) for m in made if any(m)]
    cost = [sum(a["wall"] for a in m) / sum(a["calls"] for a in m) for m in made if any(m)]
    return SizeResult(
        tokens=entry.tokens,
        kernel=entry.kernel,
        affected=entry.affected,
        wave_class=entry.wave_class,
        exposed=entry.exposed,
        calls=calls,
        mismatches=mismatches,
        wrong_elements=sum(r["entries"][i]["wrong_elements"] for r in ranks),
        blocks=blocks,
        blocks_with_mismatch=block_hits,
        arms=tuple(arms),
        mismatches_kept=kept,
        fingerprint=None if not kept else STALE_READ if all(m.matches for m in kept) else "other",
        latency_us=1e6 * sum(latency) / len(latency) if latency else None,
        cost_us=1e6 * sum(cost) / len(cost) if cost else None,
        rate_upper_99=power.rate_upper_bound(calls) if mismatches == 0 else None,
        block_rate_upper_99=power.rate_upper_bound(blocks) if block_hits == 0 else None,
    )


def merge(
    plan: Plan, setup: Setup, ranks: list[dict[str, Any]], started: float, ended: float
) -> CanaryRecord:
    """The record of ``ranks``' results (module doc)."""
    tp = plan.shape.tp
    leaders = [r for r in ranks if r["rank"] % tp == 0]  # one per group: their counts agree
    results = tuple(_size(plan, ranks, leaders, i) for i in range(len(plan.entries)))
    repeat_bad = [
        sum(
            r["entries"][i]["mismatches_per_repeat"][k]
            for r in leaders
            for i in range(len(results))
        )
        for k in range(setup.repeats)
    ]
    exposed_calls = sum(r.calls for r in results if r.exposed) // setup.repeats
    return CanaryRecord(
        schema_version=SCHEMA_VERSION,
        implementation=setup.implementation,
        reducer=setup.reducer,
        variant=setup.variant,
        aiter_version=setup.aiter_version,
        aiter_commit=setup.aiter_commit,
        dispatch_source=plan.constants.source,
        shape=plan.shape.as_dict(),
        wave_size=plan.wave_size,
        plan=tuple(e.as_dict() for e in plan.entries),
        results=results,
        power=PowerRecord(
            detect_rate=plan.detect_rate,
            rate_source=setup.rate_source,
            confidence=power.CONFIDENCE,
            exposed_calls=exposed_calls,
            probability=power.detection_probability(plan.detect_rate, exposed_calls),
            estimated_seconds=plan.estimated_seconds,
            latency_source=plan.latency.source,
        ),
        repeats=setup.repeats,
        repeats_with_mismatch=sum(1 for bad in repeat_bad if bad),
        start_time=started,
        end_time=ended,
        world_size=setup.world_size,
        groups=setup.world_size // tp,
        backend=setup.backend,
        device=setup.device,
        tensor_dtype=tensor_dtype(plan, setup),
        control=setup.control,
    )
