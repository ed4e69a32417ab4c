"""Does a wrong element look like ROCm/aiter#5694's stale read, or like another fault?

Decides, purely, from the size's dispatch (``canary.dispatch``) and one kept mismatch, whether
it fits the fingerprint the hardware reading predicts (``docs/node.md``, "The hardware
reading"): the size is ``exposed``; the element lies in a segment another rank of the group
owns (stage 2 reads the owner's buffer); its pack's thread is in an early wave of the block
whose lanes loop unequally often; and ``expected - seen`` is a whole input step (a non-zero
multiple of the TP size: the canary's inputs change by an integer per call, so an earlier
call's sum differs by ``tp`` times it). A result of another shape or dtype is another fault.
``tests/unit/test_canary_fingerprint.py`` holds it to the kernel's layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from miles_amd.canary.dispatch import (
    CDNA_WAVE,
    PACK_BYTES,
    PINNED,
    DispatchConstants,
    dispatch,
    early_waves,
    wave_class,
)

MATCHES = "matches ROCm/aiter#5694's stale read"
OTHER = "another fault"


@dataclass(frozen=True)
class Layout:
    """What places an element in the kernel: the size, the group and the hardware."""

    tokens: int
    hidden: int
    tp: int
    dtype_size: int
    wave: int = CDNA_WAVE
    constants: DispatchConstants = PINNED


def matches(
    layout: Layout, rank: int, index: int | None, expected: float | None, seen: float | None
) -> bool:
    """Whether the wrong element ``index`` (of the ``(N, hidden)`` result on group rank
    ``rank``) fits the stale-read fingerprint (module doc)."""
    if index is None or expected is None or seen is None:
        return False
    step = expected - seen
    if step == 0 or step != int(step) or int(step) % layout.tp:
        return False
    d = dispatch(
        layout.tokens * layout.hidden * layout.dtype_size,
        layout.tp,
        layout.dtype_size,
        True,
        layout.constants,
    )
    if wave_class(d, layout.tp, layout.wave) != "exposed" or d.part == 0:
        return False
    pack = index // (PACK_BYTES // layout.dtype_size)
    owner = min(pack // d.part, layout.tp - 1)
    if owner == rank % layout.tp:
        return False
    idx = pack - owner * d.part
    span = d.part + (d.packs % layout.tp if owner == layout.tp - 1 else 0)
    first, early = early_waves(d, span, d.threads_per_gpu * layout.tp, layout.wave)
    tid = idx % d.stride
    if tid // d.threads_per_gpu != first // d.threads_per_gpu:
        return False
    slot = (owner - rank) % layout.tp
    thread = slot * d.threads_per_gpu + tid % d.threads_per_gpu
    return early.get(thread // layout.wave, False)
