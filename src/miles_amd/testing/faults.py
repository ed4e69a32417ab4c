"""The replay's fault catalogue: one entry per failure the gate and the watcher must catch.

Decides: what each fault does to a replayed run, as data (:data:`FAULTS`) and pure
functions: :func:`plan_fault` (what to emit and when to stop, crash or hang),
:func:`transform_series` (which values change), the sentinel lines a fault prints and where
a truncated event file is cut (:func:`final_record_cut`). Each entry names the reason the gate
or the watcher is expected to give, so the rehearsal tests can assert the mapping.

Does not decide: how a run is judged (the gate), and performs no I/O (``replay`` does).

Rules:

- ``at`` is a 0-based rollout index and must be ``< num_rollout`` for every fault that uses
  it (:func:`check_fault_at`); a fault that cannot fire makes a rehearsal that passes
  without testing anything.
- Value faults change only the series they name; every other value is replayed unchanged.
- ``wrong-batch-shape`` ignores ``at``: a batch shape is fixed for a whole run, so every
  ``rollout/raw_reward`` becomes a multiple of 1/48 that is no multiple of 1/64.

Explained for people in ``docs/rehearsal.md``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from miles_amd.evidence.types import Series, SeriesMap
from miles_amd.testing.miles_writer import (
    SGLANG_ACTOR,
    TRAINER_ACTOR,
    ActorPids,
    format_log_time,
    ray_line,
)

ABS_DIFF = "train/train_rollout_logprob_abs_diff"
RAW_REWARD = "rollout/raw_reward"
KL = "train/train_rollout_kl"
# jvvnhop9's published KL mean (baselines/gpt_oss_20b_lora/8gpu/mi355x/patched.json, the summary of
# train/train_rollout_kl): the level of a healthy KL the replay makes for a source that has
# no KL series (the embedded example)
PUBLISHED_KL_MEAN = 8.79e-4
SPIKE_VALUE = 0.5  # a spike is train_rollout_logprob_abs_diff > 0.15 (RECIPE.md)
WRONG_BATCH_SAMPLES = 48  # rewards as fractions of 48 samples instead of the recipe's 64
RECIPE_BATCH_SAMPLES = 64
DEFAULT_FAULT_AT = 3

FATAL_SENTINEL_TEXT = "Current LoRA backend does not support LoRA on MoE layers; skipping MoE layer"
KNOWN_SENTINEL_TEXT = (
    "Using a large number of experts (e.g. >=32) without fp32 routing. "
    "Consider enabling moe_router_dtype for better numerical stability."
)
# Megatron emits the warning with warnings.warn from TransformerConfig.__post_init__; Python
# prints it as "<file>:<line>: UserWarning: <text>" (the line number varies by version).
_KNOWN_SENTINEL_ORIGIN = (
    "/root/Megatron-LM/megatron/core/transformer/transformer_config.py:1003: UserWarning:"
)
# SGLang's logger: "[YYYY-MM-DD HH:MM:SS TP<rank>] <message>", forwarded by Ray.
_FATAL_SENTINEL_FORMAT = "[{time} TP0] {text}"


class FaultError(ValueError):
    """A fault option that cannot be applied; the message names the option and the fix."""


@dataclass(frozen=True)
class Fault:
    """One injectable failure and the verdict it must produce.

    ``expected`` is the reason the gate (or the driver/watcher, for ``hang``) must give, in
    words; ``gate_checks`` are the gate's check names that must fail for it and
    ``driver_stop`` how the driver must have ended the job (``fail-fast`` for a fault the
    watcher catches at once while the run goes, ``look`` for one a rule's statistic decides
    at a look before the last rollout, ``timeout`` for a hang, None when the job ends by
    itself); ``fails_run`` is False only for the tracked, harmless known sentinel.
    """

    kind: str
    description: str
    expected: str
    gate_checks: tuple[str, ...] = ()
    driver_stop: str | None = None
    fails_run: bool = True
    uses_at: bool = True


FAULTS: dict[str, Fault] = {
    fault.kind: fault
    for fault in (
        Fault(
            "spike",
            f"{ABS_DIFF} = {SPIKE_VALUE} at rollout K (a spike is > 0.15)",
            f"spike: {ABS_DIFF} above 0.15 at rollout K",
            ("logprob_abs_diff.spikes",),
            "fail-fast",
        ),
        Fault(
            "nan",
            f"{ABS_DIFF} = NaN at rollout K",
            f"non-finite value: {ABS_DIFF} is NaN at rollout K",
            ("logprob_abs_diff.finite",),
            "fail-fast",
        ),
        Fault(
            "crash",
            "exit 1 with a Python traceback before rollout K (rollouts 0..K-1 emitted)",
            "job failed: the Ray job ends FAILED; too few rollouts",
            ("job.status", "logprob_abs_diff.steps"),
        ),
        Fault(
            "hang",
            "emit rollouts 0..K, then sleep forever",
            "timeout: the driver stops the job after its time limit",
            ("job.status",),
            "timeout",
        ),
        Fault(
            "short",
            "emit only K rollouts, then exit 0",
            "too few rollouts: K of --num-rollout",
            ("logprob_abs_diff.steps", "raw_reward.steps"),
        ),
        Fault(
            "fatal-sentinel",
            "print SGLang's 'skipping MoE layer' LoRA warning at rollout K, then continue",
            "fatal sentinel: sglang_lora_skips_moe",
            ("sentinel.sglang_lora_skips_moe",),
            "fail-fast",
        ),
        Fault(
            "known-sentinel",
            "print Megatron's fp32-routing warning once per trainer rank at start",
            "known sentinel megatron_moe_router_not_fp32 counted (8), run still passes",
            fails_run=False,
            uses_at=False,
        ),
        Fault(
            "no-tensorboard",
            "write no TensorBoard event file (log and CI history as usual)",
            "missing evidence: no TensorBoard event file",
            ("evidence.readable",),
            uses_at=False,
        ),
        Fault(
            "truncated-event",
            "at the end, cut the event file in the middle of its final record",
            "source problem: truncated TensorBoard event file",
            ("evidence.readable",),
            uses_at=False,
        ),
        Fault(
            "reward-collapse",
            f"{RAW_REWARD} = 0.0 from rollout K on (still a multiple of 1/64)",
            f"reward collapse: {RAW_REWARD} mean below its band at the first look after K",
            ("raw_reward.mean",),
            "look",
        ),
        Fault(
            "wrong-batch-shape",
            f"every {RAW_REWARD} a multiple of 1/{WRONG_BATCH_SAMPLES}, "
            f"none a multiple of 1/{RECIPE_BATCH_SAMPLES}",
            f"batch shape: {RAW_REWARD} is not a multiple of 1/{RECIPE_BATCH_SAMPLES}",
            ("raw_reward.batch_fingerprint",),
            "fail-fast",
            uses_at=False,
        ),
        Fault(
            "kl-doubled",
            f"{KL} twice a healthy KL from rollout K on: the source's KL, or for a source "
            f"without one {PUBLISHED_KL_MEAN:g} (jvvnhop9's published mean) x (the rollout's "
            "logprob gap / the run's mean gap)², the KL's relation to the gap",
            f"KL doubled: {KL}'s log-scale level beyond its bound at a look before the last",
            ("train_rollout_kl.mean",),
            "look",
        ),
    )
}


@dataclass(frozen=True)
class FaultPlan:
    """What the replay does, derived from the fault: the orchestration reads only this.

    ``emit_rollouts`` rollouts are emitted (0-based ``0..emit_rollouts-1``) unless the run
    crashes before rollout ``crash_before`` or hangs after rollout ``hang_after``.
    """

    emit_rollouts: int
    crash_before: int | None = None
    hang_after: int | None = None
    fatal_sentinel_at: int | None = None
    known_sentinel_at_start: bool = False
    write_tensorboard: bool = True
    truncate_event_file: bool = False


def check_fault_at(kind: str | None, at: int, num_rollout: int) -> None:
    """``FaultError`` unless the fault is known and fires within ``num_rollout`` rollouts."""
    if kind is None:
        return
    if kind not in FAULTS:
        raise FaultError(f"--replay-fault {kind}: unknown fault; known: {', '.join(FAULTS)}")
    if FAULTS[kind].uses_at and not 0 <= at < num_rollout:
        raise FaultError(
            f"--replay-fault-at {at}: fault {kind} must fire at a rollout in "
            f"0..{num_rollout - 1} (--num-rollout {num_rollout}), or it tests nothing"
        )


def plan_fault(kind: str | None, at: int, num_rollout: int) -> FaultPlan:
    """The plan for ``kind`` at rollout ``at`` of ``num_rollout`` (``None``: a healthy run)."""
    check_fault_at(kind, at, num_rollout)
    plans = {
        None: FaultPlan(num_rollout),
        "crash": FaultPlan(num_rollout, crash_before=at),
        "hang": FaultPlan(num_rollout, hang_after=at),
        "short": FaultPlan(at),
        "fatal-sentinel": FaultPlan(num_rollout, fatal_sentinel_at=at),
        "known-sentinel": FaultPlan(num_rollout, known_sentinel_at_start=True),
        "no-tensorboard": FaultPlan(num_rollout, write_tensorboard=False),
        "truncated-event": FaultPlan(num_rollout, truncate_event_file=True),
    }
    return plans.get(kind, FaultPlan(num_rollout))


def _replace_at(series: Series, step: int, value: float) -> Series:
    return tuple((s, value if s == step else v) for s, v in series)


def _replace_from(series: Series, step: int, value: float) -> Series:
    return tuple((s, value if s >= step else v) for s, v in series)


def off_batch_reward(value: float) -> float:
    """A multiple ``n/48`` of 1/48 in [0, 1], within 1/48 of ``value``, no multiple of 1/64.

    ``n`` is ``value * 48`` rounded and clamped to 0..48. ``n/48`` is a multiple of 1/64 iff
    ``64 n / 48 = 4 n / 3`` is an integer, i.e. iff ``3 | n``; such an ``n`` moves up by one
    (48, with no room above, moves down: 1 -> 47/48). A NaN stays NaN.
    """
    if math.isnan(value):
        return value
    n = min(WRONG_BATCH_SAMPLES, max(0, round(value * WRONG_BATCH_SAMPLES)))
    if n % 3 == 0:
        n = n + 1 if n < WRONG_BATCH_SAMPLES else n - 1
    return n / WRONG_BATCH_SAMPLES


_VALUE_FAULT_TARGETS = {
    "spike": ABS_DIFF,
    "nan": ABS_DIFF,
    "reward-collapse": RAW_REWARD,
    "wrong-batch-shape": RAW_REWARD,
    "kl-doubled": ABS_DIFF,  # the gap a KL is made from when the source has none
}


def transform_series(kind: str | None, at: int, series: Mapping[str, Series]) -> SeriesMap:
    """``series`` with the fault's value changes applied; a new map, the input is unchanged.

    ``FaultError`` if the series the fault changes is missing.
    """
    out: SeriesMap = dict(series)
    target = _VALUE_FAULT_TARGETS.get(kind or "")
    if target is None:
        return out
    if kind == "kl-doubled" and KL in out:
        out[KL] = tuple((s, 2 * v if s >= at else v) for s, v in out[KL])
        return out
    if target not in out:
        raise FaultError(f"--replay-fault {kind}: the source run has no {target} series")
    if kind == "kl-doubled":
        out[KL] = tuple((s, 2 * v if s >= at else v) for s, v in healthy_kl(out[target]))
    elif kind == "spike":
        out[target] = _replace_at(out[target], at, SPIKE_VALUE)
    elif kind == "nan":
        out[target] = _replace_at(out[target], at, math.nan)
    elif kind == "reward-collapse":
        out[target] = _replace_from(out[target], at, 0.0)
    else:
        out[target] = tuple((s, off_batch_reward(v)) for s, v in out[target])
    return out


def healthy_kl(gap: Series) -> Series:
    """A healthy train/rollout KL for a source without one: :data:`PUBLISHED_KL_MEAN` times
    each rollout's logprob gap over the run's mean gap, squared (the KL of two close
    distributions is about half the mean squared log-probability difference)."""
    finite = [v for _, v in gap if math.isfinite(v)]
    mean = math.fsum(finite) / len(finite) if finite else math.nan
    return tuple((s, PUBLISHED_KL_MEAN * (v / mean) ** 2) for s, v in gap)


def fatal_sentinel_body(epoch_seconds: float) -> str:
    """SGLang's MoE-LoRA warning as the engine process prints it (before Ray's prefix)."""
    stamp = format_log_time(epoch_seconds)[1:20]  # SGLang logs seconds, no milliseconds
    return _FATAL_SENTINEL_FORMAT.format(time=stamp, text=FATAL_SENTINEL_TEXT)


def fatal_sentinel_line(pids: ActorPids, epoch_seconds: float) -> str:
    """SGLang's MoE-LoRA warning as the job log shows it (forwarded from the engine actor)."""
    return ray_line(SGLANG_ACTOR, pids.sglang_engine, fatal_sentinel_body(epoch_seconds))


KNOWN_SENTINEL_BODY = f"{_KNOWN_SENTINEL_ORIGIN} {KNOWN_SENTINEL_TEXT}"


def known_sentinel_lines(pids: ActorPids) -> list[str]:
    """Megatron's fp32-routing warning once per trainer rank, each with its rank's pid."""
    return [ray_line(TRAINER_ACTOR, pid, KNOWN_SENTINEL_BODY) for pid in pids.trainers]


_LENGTH = struct.Struct("<Q")
_FRAME_OVERHEAD = 8 + 4 + 4  # length, CRC of the length, CRC of the data


def final_record_cut(data: bytes) -> int:
    """The byte offset in the middle of the final TFRecord of ``data`` (an event file).

    A record is ``uint64 length | uint32 crc | data[length] | uint32 crc``; only the lengths
    are walked (CRCs are the reader's business). ``ValueError`` if ``data`` has no record or
    does not end on a record boundary (it is already truncated or not an event file).
    """
    offset = 0
    last_start: int | None = None
    while offset < len(data):
        if offset + _LENGTH.size > len(data):
            raise ValueError(f"event data ends inside a record header at byte {offset}")
        (length,) = _LENGTH.unpack_from(data, offset)
        last_start, offset = offset, offset + _FRAME_OVERHEAD + length
    if last_start is None or offset != len(data):
        raise ValueError("event data has no complete final record")
    return last_start + (offset - last_start) // 2
