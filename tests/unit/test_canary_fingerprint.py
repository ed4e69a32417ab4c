"""The stale-read fingerprint (``canary.fingerprint``) against the kernel's layout at N=127, TP 4,
bf16: part = 11430 packs, stride 80 x 128 = 10240, the unequal block 9 (tids 1152..1279) whose
lanes 0..37 loop twice and 38..127 once, so the upper wave (lanes 64..127) leaves early."""

from __future__ import annotations

import pytest

from miles_amd.canary.fingerprint import Layout, matches

LAYOUT = Layout(tokens=127, hidden=2880, tp=4, dtype_size=2)
PART, FIRST = 11430, 1152


def element(owner: int, lane: int, offset: int = 0) -> int:
    """The flat index of element ``offset`` of the pack block 9's ``lane`` reads in ``owner``'s
    segment (8 bf16 per 16-byte pack)."""
    return 8 * (owner * PART + FIRST + lane) + offset


@pytest.mark.parametrize("lane", [64, 100, 127])
def test_the_upper_waves_lanes_in_a_peers_segment_one_step_off_match(lane: int) -> None:
    assert matches(LAYOUT, 0, element(1, lane, 5), 10.0, 6.0)
    assert matches(LAYOUT, 2, element(3, lane), 10.0, 202.0)  # the phase wrap: -48 steps


@pytest.mark.parametrize(
    ("rank", "index", "expected", "seen", "why"),
    [
        (0, element(1, 63), 10.0, 6.0, "the lower wave loops to the end"),
        (0, element(1, 10), 10.0, 6.0, "a lane that loops twice"),
        (1, element(1, 70), 10.0, 6.0, "the rank's own segment"),
        (0, element(1, 70) - 8 * 128, 10.0, 6.0, "another block"),
        (0, element(1, 70), 10.0, 7.0, "not a whole input step"),
        (0, element(1, 70), 10.0, 10.5, "not an integer step"),
        (0, None, None, None, "another shape"),
    ],
)
def test_anything_else_is_another_fault(rank, index, expected, seen, why) -> None:
    assert not matches(LAYOUT, rank, index, expected, seen), why


def test_a_size_where_waves_agree_never_matches() -> None:
    layout = Layout(tokens=129, hidden=2880, tp=4, dtype_size=2)  # r = 90: waves agree
    assert not any(matches(layout, 0, 8 * (11610 + k), 10.0, 6.0) for k in range(0, 10240, 7))
