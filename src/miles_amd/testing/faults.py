"""The replay's fault catalogue: what each fault does to a replayed run and which checks and
driver stop it must produce. A fault that cannot fire within ``--num-rollout`` is refused (it
would test nothing); value faults change only the series they name. No I/O.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from miles_amd.evidence.types import Series, SeriesMap
from miles_amd.testing.miles_writer import format_log_time

ABS_DIFF = "train/train_rollout_logprob_abs_diff"
RAW_REWARD = "rollout/raw_reward"
KL = "train/train_rollout_kl"
# jvvnhop9's published mean of train/train_rollout_kl: the level of a KL made for a source
# without one (the embedded example)
PUBLISHED_KL_MEAN = 8.79e-4
SPIKE_VALUE = 0.5  # a spike is train_rollout_logprob_abs_diff > 0.15 (RECIPE.md)
WRONG_BATCH_SAMPLES = 48  # rewards as fractions of 48 samples instead of the recipe's 64
DEFAULT_FAULT_AT = 3

FATAL_SENTINEL_TEXT = "Current LoRA backend does not support LoRA on MoE layers; skipping MoE layer"
# Megatron's warnings.warn from TransformerConfig.__post_init__, as Python prints it.
KNOWN_SENTINEL_BODY = (
    "/root/Megatron-LM/megatron/core/transformer/transformer_config.py:1003: UserWarning: "
    "Using a large number of experts (e.g. >=32) without fp32 routing. "
    "Consider enabling moe_router_dtype for better numerical stability."
)


class FaultError(ValueError):
    """A fault option that cannot be applied; the message names the option and the fix."""


@dataclass(frozen=True)
class Fault:
    """The checks that must fail; the driver's stop (fail-fast, look, timeout, None)."""

    gate_checks: tuple[str, ...] = ()
    driver_stop: str | None = None
    fails_run: bool = True
    uses_at: bool = True


FAULTS: dict[str, Fault] = {
    "spike": Fault(("logprob_abs_diff.spikes",), "fail-fast"),
    "nan": Fault(("logprob_abs_diff.finite",), "fail-fast"),
    "crash": Fault(("job.status", "logprob_abs_diff.steps")),
    "hang": Fault(("job.status",), "timeout"),
    "short": Fault(("logprob_abs_diff.steps", "raw_reward.steps")),
    "fatal-sentinel": Fault(("sentinel.sglang_lora_skips_moe",), "fail-fast"),
    "known-sentinel": Fault(fails_run=False, uses_at=False),
    "no-tensorboard": Fault(("evidence.readable",), uses_at=False),
    "truncated-event": Fault(("evidence.readable",), uses_at=False),
    "reward-collapse": Fault(("raw_reward.mean",), "look"),
    "wrong-batch-shape": Fault(("raw_reward.batch_fingerprint",), "fail-fast", uses_at=False),
    "kl-doubled": Fault(("train_rollout_kl.mean",), "look"),
}


@dataclass(frozen=True)
class FaultPlan:
    """Emit rollouts ``0..emit_rollouts-1`` unless it crashes before or hangs after one."""

    emit_rollouts: int
    crash_before: int | None = None
    hang_after: int | None = None
    fatal_sentinel_at: int | None = None
    known_sentinel_at_start: bool = False
    write_tensorboard: bool = True
    truncate_event_file: bool = False


def plan_fault(kind: str | None, at: int, num_rollout: int) -> FaultPlan:
    """The plan for ``kind`` at rollout ``at``; ``FaultError`` if it cannot fire."""
    if kind is not None and kind not in FAULTS:
        raise FaultError(f"--replay-fault {kind}: unknown fault; known: {', '.join(FAULTS)}")
    if kind is not None and FAULTS[kind].uses_at and not 0 <= at < num_rollout:
        raise FaultError(
            f"--replay-fault-at {at}: fault {kind} must fire at a rollout in "
            f"0..{num_rollout - 1} (--num-rollout {num_rollout}), or it tests nothing"
        )
    plans = {
        "crash": FaultPlan(num_rollout, crash_before=at),
        "hang": FaultPlan(num_rollout, hang_after=at),
        "short": FaultPlan(at),
        "fatal-sentinel": FaultPlan(num_rollout, fatal_sentinel_at=at),
        "known-sentinel": FaultPlan(num_rollout, known_sentinel_at_start=True),
        "no-tensorboard": FaultPlan(num_rollout, write_tensorboard=False),
        "truncated-event": FaultPlan(num_rollout, truncate_event_file=True),
    }
    return plans.get(kind or "", FaultPlan(num_rollout))


def off_batch_reward(value: float) -> float:
    """``n/48`` within 1/48 of ``value`` and no multiple of 1/64; a NaN stays NaN."""
    if math.isnan(value):
        return value
    n = min(WRONG_BATCH_SAMPLES, max(0, round(value * WRONG_BATCH_SAMPLES)))
    if n % 3 == 0:
        n = n + 1 if n < WRONG_BATCH_SAMPLES else n - 1
    return n / WRONG_BATCH_SAMPLES


def healthy_kl(gap: Series) -> Series:
    """:data:`PUBLISHED_KL_MEAN` x (each rollout's logprob gap / the mean gap)² (KL ~ gap²/2)."""
    finite = [v for _, v in gap if math.isfinite(v)]
    mean = math.fsum(finite) / len(finite) if finite else math.nan
    return tuple((s, PUBLISHED_KL_MEAN * (v / mean) ** 2) for s, v in gap)


# fault -> (the series it reads, the new value of (step, value) given the rollout ``at``)
_VALUE_FAULTS: dict[str, tuple[str, Callable[[int, float, int], float]]] = {
    "spike": (ABS_DIFF, lambda s, v, at: SPIKE_VALUE if s == at else v),
    "nan": (ABS_DIFF, lambda s, v, at: math.nan if s == at else v),
    "reward-collapse": (RAW_REWARD, lambda s, v, at: 0.0 if s >= at else v),
    "wrong-batch-shape": (RAW_REWARD, lambda s, v, at: off_batch_reward(v)),
    "kl-doubled": (ABS_DIFF, lambda s, v, at: 2 * v if s >= at else v),  # ABS_DIFF: no KL
}


def transform_series(kind: str | None, at: int, series: Mapping[str, Series]) -> SeriesMap:
    """``series`` with the fault's value changes (``kl-doubled`` doubles the source's KL, or
    :func:`healthy_kl`); ``FaultError`` if the series it reads is missing."""
    out: SeriesMap = dict(series)
    if kind not in _VALUE_FAULTS:
        return out
    target, change = _VALUE_FAULTS[kind]
    if kind == "kl-doubled" and KL in out:
        target = KL
    elif target not in out:
        raise FaultError(f"--replay-fault {kind}: the source run has no {target} series")
    values = healthy_kl(out[target]) if kind == "kl-doubled" and target != KL else out[target]
    out[KL if kind == "kl-doubled" else target] = tuple((s, change(s, v, at)) for s, v in values)
    return out


def fatal_sentinel_body(epoch_seconds: float) -> str:
    """SGLang's MoE-LoRA warning as its logger prints it (whole seconds)."""
    return f"[{format_log_time(epoch_seconds)[1:20]} TP0] {FATAL_SENTINEL_TEXT}"


def final_record_cut(data: bytes) -> int:
    """An offset inside the final TFRecord of event ``data``; ``ValueError`` if none ends it."""
    offset, last_start = 0, None
    while offset + 8 <= len(data):
        (length,) = struct.unpack_from("<Q", data, offset)
        last_start, offset = offset, offset + 16 + length  # length, its CRC, data, its CRC
    if last_start is None or offset != len(data):
        raise ValueError("event data has no complete final record")
    return last_start + (offset - last_start) // 2
