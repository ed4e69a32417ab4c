"""How many all-reduce calls catch a per-call corruption rate, and how the calls are spread.

Decides the call budget as power (pure):

- **Claim.** If every call at an affected size returns a wrong sum independently with
  probability at least ``p``, a canary of ``n`` affected calls sees no mismatch with
  probability ``(1 - p)^n``. Requiring that to be at most ``1 - c`` (``c`` = 0.99) gives
  ``n = ceil(ln(1 - c) / ln(1 - p))`` (:func:`calls_needed`); :func:`detection_probability`
  is ``1 - (1 - p)^n`` for the calls actually planned. For ``p = 1e-6`` that is 4,605,168
  calls; for ``p = 0.002``, 2,301.
- **Caveats.** Independence across calls is an assumption about the race (it is what a rate
  means); the claim covers the class as a whole: a rate reaching ``p`` at one size only is
  caught with the power of that size's own calls (``rate_upper_bound`` of them, recorded per
  size). A clean canary bounds the rate; it does not show the kernel race-free.
- **Spread** (:func:`allocate`): every affected size gets the same estimated node time,
  ``T = n / sum(1 / t_i)`` over affected sizes, so ``calls_i = ceil(T / t_i)`` and the affected
  calls add up to at least ``n``; each control size gets a share of ``T`` (``CONTROL_SHARE``,
  at least ``MIN_CONTROL_CALLS`` calls; the CPU plan gives less): controls show the check
  itself is clean and give latency.
- :func:`rate_upper_bound`: with no mismatch in ``n`` calls, the largest rate not excluded
  at confidence ``c``: ``1 - (1 - c)^(1/n)``.

The detection power is measured, not assumed, by ``tests/rehearsal/test_canary_harness.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

CONFIDENCE = 0.99
CONTROL_SHARE = 0.1
MIN_CONTROL_CALLS = 10


def _check_rate(p: float) -> None:
    if not (0.0 < p < 1.0) or not math.isfinite(p):
        raise ValueError(f"detect rate {p!r} is not in (0, 1)")


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
