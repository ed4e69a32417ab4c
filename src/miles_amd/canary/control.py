"""The canary's positive control: a two-stage all-reduce of aiter's protocol, built at run time.

Decides:

- the builds (:data:`BUILDS`): ``control`` (correct) and ``control-broken`` (end_sync's wait
  removed: stage 2 may read a peer's tmp before that peer's stage 1, i.e. stale data), both
  from ``control_kernel.cu`` compiled by torch's extension loader (nvcc; on ROCm torch
  hipifies the same file), once per build in torch's extensions dir;
- a rank's reducer (:func:`reducer`): one buffer sized for the spec's largest input, the IPC
  handles exchanged over the TP group's gloo group;
- the control's run before the canary's on the node (:func:`run_control`): the plan's suspect
  sizes, at most :data:`CONTROL_CALLS` calls each (:func:`control_plan`), and what
  ``canary.json`` carries of it as ``control`` (:func:`control_result`), with the fingerprint
  of its first wrong element
  (:func:`fingerprint`: the segment's owning rank, the block and lane of the control kernel
  that reduced it, expected - seen in input steps).

A broken build the canary does not catch means it could not see this class of race on this
machine (:data:`NOT_SEEN`). torch is imported only inside :func:`load` and :func:`reducer`.
``docs/node.md`` ("The positive control").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from miles_amd.canary import harness
from miles_amd.canary.plan import ARMS, Plan
from miles_amd.records.canary import CanaryRecord, ControlRecord, Mismatch

BUILDS = {"control": False, "control-broken": True}
CONTROL_CALLS = 200
KERNEL_SOURCE = Path(__file__).with_name("control_kernel.cu")
THREADS, MAX_BLOCKS, PACK_BYTES = 512, 80, 16  # control_kernel.cu's kThreads, kMaxBlocks, uint4
ARM = ARMS[0]  # back to back
NOT_SEEN = "the canary could not see this class of race here"


def load(implementation: str) -> Any:
    """The compiled extension of ``implementation``'s build (cached by torch per name)."""
    from torch.utils import cpp_extension

    broken = BUILDS[implementation]
    return cpp_extension.load(
        name="miles_amd_control_broken" if broken else "miles_amd_control",
        sources=[str(KERNEL_SOURCE)],
        extra_cuda_cflags=["-O3", *(["-DMILES_AMD_CONTROL_BROKEN"] if broken else [])],
        verbose=False,
    )


def reducer(implementation: str, spec: dict[str, Any], cpu_group: Any) -> Callable[[Any], Any]:
    """``implementation``'s all-reduce for this rank of ``cpu_group`` (module doc)."""
    import torch
    import torch.distributed as dist

    itemsize = torch.empty((), dtype=getattr(torch, spec["tensor_dtype"])).element_size()
    max_bytes = max(e["tokens"] for e in spec["entries"]) * spec["hidden"] * itemsize
    control = load(implementation).Control(
        dist.get_rank(cpu_group), dist.get_world_size(cpu_group), max_bytes
    )
    handles = [torch.empty_like(control.handle()) for _ in range(dist.get_world_size(cpu_group))]
    dist.all_gather(handles, control.handle(), group=cpu_group)
    control.open(handles)
    dist.barrier(group=cpu_group)
    return control.all_reduce


def control_plan(plan: Plan, calls: int = CONTROL_CALLS) -> Plan:
    """The broken build's plan: ``plan``'s suspect sizes (either model), at most ``calls``
    back-to-back calls each."""
    entries = tuple(
        dataclasses.replace(e, arms=((ARM, min(e.calls, calls)),), implementation="control-broken")
        for e in plan.entries
        if e.affected or e.exposed
    )
    return dataclasses.replace(plan, entries=entries)


def fingerprint(first: Mismatch, tokens: int, hidden: int, tp: int, itemsize: int) -> str:
    """Where the control kernel put ``first``'s element, and how far off it was (module doc)."""
    if first.index is None or first.expected is None or first.seen is None:
        return f"N={tokens} call {first.call}: returned {first.returned}"
    lanes = PACK_BYTES // itemsize
    size = tokens * hidden // lanes
    part = size // tp
    packed = first.index // lanes
    owner = min(packed // part, tp - 1) if part else tp - 1
    rel = packed - owner * part
    slot = THREADS // tp
    blocks = min(MAX_BLOCKS, max(1, math.ceil(part / slot)))
    off = first.expected - first.seen  # a rank's input steps by 1 a call, the sum by tp
    steps = f"{off:g} rank input step(s), {off / tp:g} of the sum's"
    reader = first.rank % tp
    return (
        f"N={tokens} call {first.call}: rank {reader} read rank {owner}'s segment "
        f"({'its own' if owner == reader else 'a peer'}), block {(rel // slot) % blocks} "
        f"lane {rel % slot}; expected {first.expected:g}, seen {first.seen:g}: {steps}"
    )


def control_result(record: CanaryRecord, hidden: int, tp: int, itemsize: int) -> ControlRecord:
    """``canary.json``'s ``control`` from the broken build's run."""
    bad = record.first_bad()
    first = bad.first_mismatch if bad is not None else None
    return ControlRecord(
        implementation=record.implementation,
        calls=sum(r.calls for r in record.results),
        mismatched_calls=record.mismatches,
        caught=record.mismatches > 0,
        fingerprint=(
            fingerprint(first, bad.tokens, hidden, tp, itemsize)
            if bad is not None and first is not None
            else None
        ),
    )


def run_control(plan: Plan, setup: harness.Setup, timeout_s: float) -> ControlRecord:
    """The broken build over :func:`control_plan` in ``setup``'s ranks; ``launch.HarnessError``
    when they cannot run it."""
    broken = dataclasses.replace(setup, implementation="control-broken", repeats=1, control=None)
    record = harness.run(control_plan(plan), broken, timeout_s)
    shape = plan.shape
    return control_result(record, shape.hidden, shape.tp, shape.dtype_size)
