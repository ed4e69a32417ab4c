"""The canary's positive control: a two-stage all-reduce of aiter's protocol, built at run time.

Decides:

- the builds and a rank's reducer live in ``canary.control_build`` (what a rank imports);
- the control's run before the canary's on the node (:func:`run_control`): the plan's suspect
  sizes, at most :data:`CONTROL_CALLS` calls each (:func:`control_plan`), and what
  ``canary.json`` carries of it as ``control`` (:func:`control_result`), with the fingerprint
  of its first wrong element
  (:func:`fingerprint`: the segment's owning rank, the block and lane of the control kernel
  that reduced it, expected - seen in input steps).

A broken build the canary does not catch means it could not see this class of race on this
machine (:data:`NOT_SEEN`). torch is imported only inside ``control_build``'s functions.
``docs/node.md`` ("The positive control").
"""

from __future__ import annotations

import dataclasses
import math

from miles_amd.canary import harness
from miles_amd.canary.plan import ARMS, Plan
from miles_amd.records.canary import CanaryRecord, ControlRecord, Mismatch

CONTROL_CALLS = 200
THREADS, MAX_BLOCKS, PACK_BYTES = 512, 80, 16  # control_kernel.cu's kThreads, kMaxBlocks, uint4
ARM = ARMS[0]  # back to back
NOT_SEEN = "the canary could not see this class of race here"


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
