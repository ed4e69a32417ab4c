"""A canary run end to end: the plan handed to the ranks, their results merged into a record.

Decides the run's shape and the merge (the ranks' work is ``canary.worker``, their processes
``canary.launch``):

- ``world_size`` ranks in TP groups of the plan's TP (two groups of four on the node's 8
  GPUs, one on the CPU harness's 4 processes), side by side: each group makes
  ``ceil(calls / groups)`` of each size's calls, so the node's groups share the budget;
- :class:`Setup` says where: ``cpu`` (gloo, float32: the dtype gloo reduces; the inputs are
  exact in it as in bf16, ``canary.worker``) or ``cuda`` (nccl = RCCL, the recipe's dtype);
- the merge: per size, ``mismatches`` sums the groups' counts of calls wrong on at least one of
  their ranks, ``wrong_elements`` sums every rank's, the first mismatch is the earliest
  (repeat, call) over ranks, with its global rank, and ``latency_us`` is the mean over ranks
  of the block-timed seconds per call; ``repeats_with_mismatch`` counts the repeats in which
  any size of any group had one.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from miles_amd.canary import power
from miles_amd.canary.launch import run_ranks
from miles_amd.canary.plan import Plan
from miles_amd.records.canary import (
    SCHEMA_VERSION,
    CanaryRecord,
    FirstMismatch,
    PowerRecord,
    SizeResult,
)

CPU_MEM_BUDGET = 64 * 1024 * 1024
GPU_MEM_BUDGET = 1024 * 1024 * 1024


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
    aiter_fix: str | None = None  # miles_amd.aiter_fix's value for the aiter the ranks import
    pythonpath: str | None = None  # the ranks' (variants.aiter_pythonpath); None: inherited

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"


def tensor_dtype(plan: Plan, setup: Setup) -> str:
    return plan.shape.dtype if setup.device == "cuda" else "float32"


def spec(plan: Plan, setup: Setup) -> dict[str, Any]:
    """What every rank reads (``canary.worker``)."""
    groups = setup.world_size // plan.shape.tp
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
        "mem_budget": GPU_MEM_BUDGET if setup.device == "cuda" else CPU_MEM_BUDGET,
        "entries": [
            {"tokens": e.tokens, "calls": math.ceil(e.calls / groups)} for e in plan.entries
        ],
    }


def run(plan: Plan, setup: Setup, timeout_s: float) -> CanaryRecord:
    """Run the plan on the ranks and merge their results; ``launch.HarnessError`` otherwise."""
    started = time.time()
    ranks = run_ranks(spec(plan, setup), timeout_s, setup.pythonpath)
    return merge(plan, setup, ranks, started, time.time())


def _first(ranks: list[dict[str, Any]], i: int) -> FirstMismatch | None:
    found = [
        (r["entries"][i]["first"], r["rank"]) for r in ranks if r["entries"][i]["first"] is not None
    ]
    if not found:
        return None
    first, rank = min(found, key=lambda item: (item[0]["repeat"], item[0]["call"], item[1]))
    return FirstMismatch(
        repeat=first["repeat"],
        call=first["call"],
        rank=rank,
        index=first["index"],
        expected=first["expected"],
        seen=first["seen"],
    )


def merge(
    plan: Plan, setup: Setup, ranks: list[dict[str, Any]], started: float, ended: float
) -> CanaryRecord:
    """The record of ``ranks``' results (module doc)."""
    tp = plan.shape.tp
    leaders = [r for r in ranks if r["rank"] % tp == 0]  # one per group: their counts agree
    results = []
    repeat_bad = [0] * setup.repeats
    affected_calls = 0
    for i, entry in enumerate(plan.entries):
        calls = sum(r["entries"][i]["calls"] for r in leaders)
        per_repeat = [
            sum(r["entries"][i]["mismatches_per_repeat"][k] for r in leaders)
            for k in range(setup.repeats)
        ]
        for k, bad in enumerate(per_repeat):
            repeat_bad[k] += bad
        mismatches = sum(per_repeat)
        latency = [
            r["entries"][i]["seconds"] / r["entries"][i]["calls"]
            for r in ranks
            if r["entries"][i]["calls"]
        ]
        if entry.affected:
            affected_calls += calls // setup.repeats
        results.append(
            SizeResult(
                tokens=entry.tokens,
                kernel=entry.kernel,
                affected=entry.affected,
                calls=calls,
                mismatches=mismatches,
                wrong_elements=sum(r["entries"][i]["wrong_elements"] for r in ranks),
                first_mismatch=_first(ranks, i),
                latency_us=1e6 * sum(latency) / len(latency) if latency else None,
                rate_upper_99=power.rate_upper_bound(calls) if mismatches == 0 else None,
            )
        )
    return CanaryRecord(
        schema_version=SCHEMA_VERSION,
        implementation=setup.implementation,
        reducer=setup.reducer,
        variant=setup.variant,
        aiter_version=setup.aiter_version,
        aiter_commit=setup.aiter_commit,
        dispatch_source=plan.constants.source,
        aiter_fix=setup.aiter_fix,
        shape=plan.shape.as_dict(),
        plan=tuple(e.as_dict() for e in plan.entries),
        results=tuple(results),
        power=PowerRecord(
            detect_rate=plan.detect_rate,
            confidence=power.CONFIDENCE,
            affected_calls=affected_calls,
            probability=power.detection_probability(plan.detect_rate, affected_calls),
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
    )
