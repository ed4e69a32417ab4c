"""The kernel model (``canary.kernel``): the dispatch against aiter's own lines and a brute-force
count of every lane's stage-1 trips; the constants' reader; the stale-read fingerprint against
the kernel's layout at N=127, TP 4, bf16: part = 11430 packs, stride 80 x 128 = 10240, the
unequal block 9 (tids 1152..1279) whose lanes 0..37 loop twice and 38..127 once, so the upper
wave (lanes 64..127) leaves early."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from miles_amd.canary import kernel
from miles_amd.canary.kernel import (
    AITER_COMMIT,
    CUH_PATH,
    PINNED,
    PY_PATH,
    Layout,
    dispatch,
    matches,
    trip_counts,
    uses_custom_ar,
)
from tests.support.fake_aiter import header_text, sections

FIXTURE = Path(__file__).parent / "data" / "aiter_dispatch_e4048607.txt"
HIDDEN_BF16 = 2880 * 2  # bytes per token of the rollout all-reduce


def fixture_sections() -> dict[str, str]:
    """The e4048607 fixture's excerpts joined per source path (its header names the commit)."""
    assert f"# commit: {AITER_COMMIT}" in FIXTURE.read_text(encoding="utf-8")
    found = sections(FIXTURE.name)
    assert set(found) == {CUH_PATH, PY_PATH}
    return found


def test_the_pinned_constants_are_aiters_and_the_fixed_kernels_stage1_runs_whole_tiles() -> None:
    """e4048607's lines give the pinned constants; ROCm/aiter#5694's kernel (01f53100) the same
    ones, with stage 1 in whole tiles."""
    parts = fixture_sections()
    stock = kernel.parse_constants(parts[CUH_PATH], parts[PY_PATH], "fixture")
    fixed = kernel.parse_constants(header_text(fixed=True), parts[PY_PATH], "fixed")
    assert (stock.thread_num, stock.max_blocks, stock.car_max_size) == (512, 80, 64 << 20)
    assert stock.one_stage_limits == ((4, 160 * 1024), (8, 80 * 1024))
    for parsed in (stock, fixed):
        assert parsed == replace(PINNED, source=parsed.source, stage1_whole_tiles=parsed is fixed)


def _no_stage1_barrier(cuh: str) -> str:
    kernel_at = cuh.index("cross_device_reduce_2stage(RankData")
    head, stage1 = cuh[:kernel_at], cuh[kernel_at:]
    return head + stage1.replace("__syncthreads();", "", 2)  # both barriers of stage 1's loop


def _swap(old: str, new: str):
    def edit(cuh: str) -> str:
        assert old in cuh
        return cuh.replace(old, new)

    return edit


# (an edit of the header, the named reason): an absurd constant is refused where it is parsed
# (a zero thread count divided the plan by zero before), the plan names it for the pinned ones
REFUSED = [
    (_no_stage1_barrier, "__syncthreads"),
    (_swap("bytes % (ngpus * 16) == 0", "bytes % 32 == 0"), "naive test"),
    (_swap("#define THREAD_NUM 512", "#define THREAD_NUM 0"), "THREAD_NUM is 0, outside 8..1024"),
    (_swap("#define THREAD_NUM 512", "#define THREAD_NUM 500"), "not a multiple of 8"),
    (_swap("kMaxBlocks = 80;", "kMaxBlocks = 0;"), "kMaxBlocks is 0, outside 1..4096"),
    (_swap("bytes < 160 * 1024", "bytes < 0 * 1024"), "the 1-stage byte limit is 0"),
]


@pytest.mark.parametrize("fixed", [True, False])
@pytest.mark.parametrize(("edit", "named"), REFUSED)
def test_the_reader_refuses_a_kernel_of_another_shape_or_one_aiter_cannot_launch(
    fixed, edit, named
) -> None:
    py = fixture_sections()[PY_PATH]
    with pytest.raises(ValueError, match=re.escape(named)):
        kernel.parse_constants(edit(header_text(fixed=fixed)), py, "edited")
    with pytest.raises(ValueError, match="_DEFAULT_CAR_MAX_SIZE"):
        kernel.parse_constants(header_text(fixed=fixed), "x = 1\n", "edited")


def test_aiter_custom_ar_max_size_is_read_as_aiter_reads_it() -> None:
    """Where the constants come from (installed header, or the pinned commit and why):
    tests/unit/test_canary_cli.py."""
    for value, size in (("1048576", 1 << 20), ("0", 0), ("-5", 7), ("lots", 7), (str(2 << 30), 7)):
        assert kernel.car_max_size(7, {"AITER_CUSTOM_AR_MAX_SIZE": value}) == size
    env = ("AITER_CUSTOM_AR_MAX_SIZE", "1048576")
    sized = kernel.installed_constants(dict([env]), None, None, "x")
    assert sized.car_max_size == 1 << 20
    assert sized.source.endswith(
        "(pinned: no aiter on the python path); AITER_CUSTOM_AR_MAX_SIZE=1048576"
    )


def test_the_threshold_branches() -> None:
    assert dispatch(160 * 1024 - 16, 4, 2).kernel == "1stage"
    assert dispatch(160 * 1024, 4, 2).kernel == "2stage"
    assert dispatch(80 * 1024 - 16, 8, 2).kernel == "1stage"
    assert dispatch(80 * 1024, 8, 2).kernel == "2stage"
    assert dispatch(10 * 1024 * 1024, 2, 2).kernel == "1stage"  # world size 2: always
    assert dispatch(1024 * 1024, 4, 2, full_peer_links=False).kernel == "none"
    assert dispatch(160 * 1024 + 32, 4, 2).naive  # not a multiple of 4 * 16 bytes
    assert dispatch(6 * 16 * 4096, 6, 2).naive  # world size 6 is always naive
    assert not dispatch(6 * 16 * 4096, 6, 2).affected  # the naive loop holds no barrier
    with pytest.raises(ValueError):
        dispatch(100, 4, 2)
    with pytest.raises(ValueError):
        dispatch(1024, 3, 2)


def test_the_recipe_shapes_the_issue_names() -> None:
    for tokens in range(1, 29):
        assert dispatch(tokens * HIDDEN_BF16, 4, 2).kernel == "1stage", tokens
    for tokens in range(29, 300):
        d = dispatch(tokens * HIDDEN_BF16, 4, 2)
        assert d.kernel == "2stage" and not d.naive
        assert d.part == 90 * tokens and d.threads_per_gpu == 128
        assert d.uniform_trip_count == (tokens % 64 == 0), tokens
    assert uses_custom_ar(11650 * HIDDEN_BF16) and not uses_custom_ar(11651 * HIDDEN_BF16)


@pytest.mark.parametrize("world", [4, 8])
def test_uniformity_matches_every_lanes_trip_count(world: int) -> None:
    """The closed form (``span % tnum_gpu``) against each block's lanes counted one by one."""
    for packs_per_rank in [*range(500, 700, 7), 5760, 11520, 90 * 29, 90 * 11650]:
        nbytes = packs_per_rank * world * 16
        d = dispatch(nbytes, world, 2)
        if d.kernel != "2stage":
            continue
        uniform = all(
            len(set(trip_counts(d.part, d.stride, block * d.threads_per_gpu, d.threads_per_gpu)))
            == 1
            for block in range(d.blocks)
        )
        assert d.uniform_trip_count == uniform, packs_per_rank


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
