"""How many all-reduce calls catch a per-call corruption rate, and how the calls are spread.

Decides the call budget as power (pure):

- **The rate worth catching** (:func:`implied_rate`): a bug that spikes a fraction ``s`` of
  stock runs whose rollouts make ``E`` exposed calls has a per-call rate of at least
  ``-ln(1 - s) / E`` (:data:`SPIKE_RATE_PER_RUN`, :func:`exposed_calls_per_run`);

- **Claim.** If every call at an affected size returns a wrong sum independently with
  probability at least ``p``, a canary of ``n`` affected calls sees no mismatch with
  probability ``(1 - p)^n``. Requiring that to be at most ``1 - c`` (``c`` = 0.99) gives
  ``n = ceil(ln(1 - c) / ln(1 - p))`` (:func:`calls_needed`); :func:`detection_probability`
  is ``1 - (1 - p)^n`` for the calls actually planned. For ``p = 1e-6`` that is 4,605,168
  calls; for ``p = 0.002``, 2,301.
- **Caveats.** Calls in a block of back-to-back calls are not independent trials of a timing
  race: per size the record bounds the rate of blocks with a hit (``rate_upper_bound`` of the
  blocks) beside the per-call bound. A clean canary bounds the rate; it does not show the
  kernel race-free.
- **Spread** (:func:`allocate`): every exposed size gets the same estimated node time, so
  the exposed calls add up to at least ``n``; each control size gets a share of it.
- :func:`rate_upper_bound`: with no hit in ``n`` trials, ``1 - (1 - c)^(1/n)``.

Derivations: ``docs/node.md`` ("Statistics"); the power is measured by
``tests/rehearsal/test_canary_harness.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

CONFIDENCE = 0.99
CONTROL_SHARE = 0.1
MIN_CONTROL_CALLS = 10
# The rollouts' exposed calls per run (docs/node.md, "Statistics"): 20 rollouts x 2 engines x at
# most 4 prefill forwards per engine and rollout x 49 all-reduces per forward (24 layers x 2 and
# the vocab-parallel embedding) x 1/2 (the share of prefill sizes >= 114 whose 90·N mod 128 is in
# 1..64); and the spike rate per stock run the A/B must be able to explain.
ROLLOUTS_PER_RUN = 20
ENGINES = 2
PREFILL_FORWARDS = 4
ALL_REDUCES_PER_FORWARD = 49
EXPOSED_SHARE = 0.5
SPIKE_RATE_PER_RUN = 0.05


def _check_rate(p: float) -> None:
    if not (0.0 < p < 1.0) or not math.isfinite(p):
        raise ValueError(f"detect rate {p!r} is not in (0, 1)")


def exposed_calls_per_run() -> int:
    """The rollouts' exposed all-reduce calls in one run (the constants above)."""
    return round(
        ROLLOUTS_PER_RUN * ENGINES * PREFILL_FORWARDS * ALL_REDUCES_PER_FORWARD * EXPOSED_SHARE
    )


def implied_rate(spike_rate: float = SPIKE_RATE_PER_RUN, exposed: int | None = None) -> float:
    """The least per-call rate at which ``exposed`` calls per run hold a wrong sum in a fraction
    ``spike_rate`` of runs: ``-ln(1 - s) / E`` (module doc)."""
    _check_rate(spike_rate)
    calls = exposed_calls_per_run() if exposed is None else exposed
    return -math.log1p(-spike_rate) / calls


def calls_needed(p: float, confidence: float = CONFIDENCE) -> int:
    """``ceil(ln(1 - confidence) / ln(1 - p))`` (module doc)."""
    _check_rate(p)
    _check_rate(confidence)
    return math.ceil(math.log1p(-confidence) / math.log1p(-p))


def detection_probability(p: float, calls: int) -> float:
    """``1 - (1 - p)^calls``: the chance ``calls`` affected calls show a rate-``p`` fault."""
    _check_rate(p)
    return -math.expm1(calls * math.log1p(-p))


def rate_upper_bound(calls: int, confidence: float = CONFIDENCE) -> float | None:
    """The largest per-call rate that ``calls`` clean calls do not exclude; None for 0 calls."""
    if calls <= 0:
        return None
    return -math.expm1(math.log1p(-confidence) / calls)


def allocate(
    seconds_per_call: Sequence[float],
    affected: Sequence[bool],
    needed: int,
    control_share: float = CONTROL_SHARE,
    min_control_calls: int = MIN_CONTROL_CALLS,
) -> list[int]:
    """Calls per entry (module doc: equal time per affected size, a share for controls)."""
    if len(seconds_per_call) != len(affected) or any(t <= 0 for t in seconds_per_call):
        raise ValueError("one positive time per entry is needed")
    rates = [1.0 / t for t, hit in zip(seconds_per_call, affected, strict=True) if hit]
    if not rates:
        raise ValueError("no affected size to spend the budget on")
    share = needed / sum(rates)
    return [
        math.ceil(share / t)
        if hit
        else max(min_control_calls, math.ceil(control_share * share / t))
        for t, hit in zip(seconds_per_call, affected, strict=True)
    ]
