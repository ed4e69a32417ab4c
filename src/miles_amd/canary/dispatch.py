"""aiter's custom all-reduce dispatch at one size: which kernel, its grid, its stage-1 trip counts.

Pure functions of (bytes, world size, dtype size, full peer links, constants), read in ROCm/aiter
at commit e4048607, ``csrc/include/custom_all_reduce.cuh`` (``use_new`` path).

Decides:

- the kernel (:func:`dispatch`): ``1stage`` (size test: :func:`one_stage`), ``2stage``, naive
  or not, or ``none`` without full peer links at world size > 2;
- its grid: threads per GPU slot, blocks, stride;
- each lane's stage-1 trip count (:func:`trip_counts`) and whether a block's lanes agree;
- whether a size is :attr:`Dispatch.affected`, the suspect class: non-naive 2-stage with
  non-uniform trip counts;
- whether aiter's custom all-reduce takes a size at all (:func:`uses_custom_ar`);
- the hardware reading (:func:`wave_class`): barriers count waves of ``wave`` lanes (64 on
  CDNA), so only an early-leaving wave that still has stage-2 reads can return a stale sum
  (``exposed``).

Caveat: the constants come as :class:`DispatchConstants` (:data:`PINNED`: this commit's;
``canary.source`` reads the installed aiter's). ``tests/unit/test_canary_dispatch.py`` holds
the model to aiter's lines (``tests/unit/data/aiter_dispatch_e4048607.txt``).
``docs/node.md`` ("The dispatch model (``canary/dispatch.py``)").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kernel = Literal["1stage", "2stage", "none"]
WaveClass = Literal["exposed", "early-no-read", "waves-agree", "uniform", "not-2stage"]
PACK_BYTES = 16
CDNA_WAVE = 64


@dataclass(frozen=True)
class DispatchConstants:
    """The numbers the dispatch uses; :data:`PINNED` holds commit e4048607's."""

    thread_num: int
    max_blocks: int
    one_stage_limits: tuple[tuple[int, int], ...]  # (world size <=, bytes <) pairs, in order
    car_max_size: int  # Python side: custom AR for bytes <= this (AITER_CUSTOM_AR_MAX_SIZE)
    source: str

    def as_dict(self) -> dict[str, object]:
        return {
            "thread_num": self.thread_num,
            "max_blocks": self.max_blocks,
            "one_stage_limits": [list(pair) for pair in self.one_stage_limits],
            "car_max_size": self.car_max_size,
            "source": self.source,
        }


AITER_REPO = "ROCm/aiter"
AITER_COMMIT = "e4048607a535ace3a2b51ded31b1c8c2d45c0879"
CUH_PATH = "csrc/include/custom_all_reduce.cuh"
PY_PATH = "aiter/dist/device_communicators/custom_all_reduce.py"
PINNED = DispatchConstants(
    thread_num=512,
    max_blocks=80,
    one_stage_limits=((4, 160 * 1024), (8, 80 * 1024)),
    car_max_size=8192 * 8192,
    source=f"{AITER_REPO}@{AITER_COMMIT[:8]} {CUH_PATH}, {PY_PATH}",
)


@dataclass(frozen=True)
class Dispatch:
    """What the dispatch launches for one all-reduce, and its stage-1 trip counts."""

    kernel: Kernel
    naive: bool
    packs: int
    part: int
    threads_per_gpu: int
    blocks: int
    stride: int
    uniform_trip_count: bool

    @property
    def affected(self) -> bool:
        """The suspect class: non-naive 2-stage whose block's lanes loop unequally often."""
        return self.kernel == "2stage" and not self.naive and not self.uniform_trip_count


def uses_custom_ar(nbytes: int, constants: DispatchConstants = PINNED) -> bool:
    """aiter's ``_fits_custom_ar_size`` with default env: 16-byte multiple, <= max size."""
    return nbytes > 0 and nbytes % PACK_BYTES == 0 and nbytes <= constants.car_max_size


def one_stage(nbytes: int, world_size: int, constants: DispatchConstants = PINNED) -> bool:
    """The size test of the full-peer-links branch (``docs/node.md``, the dispatch model)."""
    return any(world_size <= ws and nbytes < limit for ws, limit in constants.one_stage_limits)


def dispatch(
    nbytes: int,
    world_size: int,
    dtype_size: int,
    full_peer_links: bool = True,
    constants: DispatchConstants = PINNED,
) -> Dispatch:
    """The kernel and grid for an all-reduce of ``nbytes`` (``docs/node.md``); ValueError for a size
    the launcher refuses (not a multiple of 16 bytes) or a world size it does not support."""
    if world_size not in (2, 4, 6, 8):
        raise ValueError(f"world size {world_size}: aiter supports 2, 4, 6, 8")
    if dtype_size not in (2, 4) or nbytes <= 0 or nbytes % PACK_BYTES:
        raise ValueError(f"{nbytes} bytes of {dtype_size}-byte elements: not whole 16-byte packs")
    packs = nbytes // PACK_BYTES
    tnum = constants.thread_num // world_size
    part = packs // world_size
    if world_size == 2 or (full_peer_links and one_stage(nbytes, world_size, constants)):
        blocks = min(constants.max_blocks, -(-packs // tnum))
        return Dispatch("1stage", False, packs, part, tnum, blocks, blocks * tnum, True)
    if not full_peer_links:
        return Dispatch("none", False, packs, part, tnum, 0, 0, True)
    blocks = min(constants.max_blocks, -(-part // tnum))
    naive = nbytes % (world_size * PACK_BYTES) != 0 or world_size == 6
    spans = {part, part + packs % world_size}
    if naive:  # blockDim.x threads per block, no barrier in its loop
        uniform = all(span % constants.thread_num == 0 for span in spans)
        stride = blocks * constants.thread_num
    else:
        uniform = all(span % tnum == 0 for span in spans)
        stride = blocks * tnum
    return Dispatch("2stage", naive, packs, part, tnum, blocks, stride, uniform)


def trip_counts(span: int, stride: int, first_tid: int, lanes: int) -> list[int]:
    """Stage-1 trip count of each lane ``first_tid .. first_tid + lanes - 1`` over ``span``
    packs (``ceil((span - tid) / stride)``, 0 past the span): the check the tests run."""
    return [max(0, -(-(span - tid) // stride)) for tid in range(first_tid, first_tid + lanes)]


def early_waves(
    d: Dispatch, span: int, threads: int, wave: int = CDNA_WAVE
) -> tuple[int, dict[int, bool]]:
    """For a rank's stage-1 ``span``: the first tid of the one block whose lanes loop unequally
    often, and its early waves (wave index -> whether it still has a stage-2 read)."""
    tnum = d.threads_per_gpu
    largest = d.part + d.packs % (threads // tnum)
    first = (span % d.stride) // tnum * tnum
    # a wave loops as often as its smallest lane (trip counts fall as tid grows)
    low = [0 if w // tnum != (w + wave - 1) // tnum else w % tnum for w in range(0, threads, wave)]
    trips = [trip_counts(span, d.stride, first + lane, 1)[0] for lane in low]
    return first, {
        w: first + lane < largest
        for w, (lane, t) in enumerate(zip(low, trips, strict=True))
        if t < max(trips)
    }


def wave_class(d: Dispatch, world_size: int, wave: int = CDNA_WAVE) -> WaveClass:
    """The size's class when barriers count waves of ``wave`` lanes (``docs/node.md``, "The
    hardware reading"): ``exposed`` when a wave of some block runs fewer stage-1 iterations than
    another wave of it and still reads peer data in stage 2 (a stale read: a wrong sum);
    ``early-no-read`` when the early wave has nothing to read; ``waves-agree`` when lanes differ
    but every wave runs the same barriers; ``uniform``; ``not-2stage`` (1-stage, naive, none)."""
    if d.kernel != "2stage" or d.naive:
        return "not-2stage"
    if d.uniform_trip_count:
        return "uniform"
    threads = d.threads_per_gpu * world_size
    reads = [
        read
        for span in {d.part, d.part + d.packs % world_size}
        for read in early_waves(d, span, threads, wave)[1].values()
    ]
    if not reads:
        return "waves-agree"
    return "exposed" if any(reads) else "early-no-read"
