"""aiter's custom all-reduce as the canary models it (ROCm/aiter e4048607): the kernel and
grid a size gets, each lane's stage-1 trip count, the wave reading of the barriers, the dispatch
constants (pinned, or read from the installed aiter) and whether a wrong element fits
ROCm/aiter#5694's stale read. ``docs/node.md`` ("The dispatch model", "The hardware reading").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from miles_amd import aiter_fix

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
    stage1_whole_tiles: bool = False  # ROCm/aiter#5694's kernel (same suspect sizes)


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
    """What the dispatch launches for one all-reduce."""

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
        """The lane model's suspect class: a 2-stage block whose lanes loop unequally often."""
        return self.kernel == "2stage" and not self.naive and not self.uniform_trip_count


def uses_custom_ar(nbytes: int, constants: DispatchConstants = PINNED) -> bool:
    """aiter's ``_fits_custom_ar_size``."""
    return nbytes > 0 and nbytes % PACK_BYTES == 0 and nbytes <= constants.car_max_size


def one_stage(nbytes: int, world_size: int, constants: DispatchConstants = PINNED) -> bool:
    """The size test of the full-peer-links branch."""
    return any(world_size <= ws and nbytes < limit for ws, limit in constants.one_stage_limits)


def dispatch(
    nbytes: int,
    world_size: int,
    dtype_size: int,
    full_peer_links: bool = True,
    constants: DispatchConstants = PINNED,
) -> Dispatch:
    """ValueError for a size the launcher refuses or a world size it does not support."""
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
    """Stage-1 trip count (``ceil((span - tid) / stride)``) of lanes ``first_tid`` on."""
    return [max(0, -(-(span - tid) // stride)) for tid in range(first_tid, first_tid + lanes)]


def early_waves(
    d: Dispatch, span: int, threads: int, wave: int = CDNA_WAVE
) -> tuple[int, dict[int, bool]]:
    """The first tid of the block of ``span`` whose lanes loop unequally often, and its early
    waves (wave index -> whether it still has a stage-2 read)."""
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
    """The size's class when barriers count waves; ``exposed``: a stale read is possible."""
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


CAR_MAX_SIZE_ENV = "AITER_CUSTOM_AR_MAX_SIZE"
AITER_POOL_BYTES = 1024 * 1024 * 1024  # CustomAllreduce(max_size=1 GiB), the registered pool
_THREAD_NUM = re.compile(r"#define\s+THREAD_NUM\s+(\d+)")
_MAX_BLOCKS = re.compile(r"constexpr\s+int\s+kMaxBlocks\s*=\s*(\d+)\s*;")
_NEW_BRANCH = re.compile(r"use new version of allreduce kernel(.*?)#define KL", re.S)
_LIMIT = re.compile(r"world_size_\s*<=\s*(\d+)\s*&&\s*bytes\s*<\s*(\d+)\s*\*\s*(\d+)")
_CAR_MAX = re.compile(r"^_DEFAULT_CAR_MAX_SIZE\s*=\s*(\d+)\s*\*\s*(\d+)", re.M)
# What aiter can launch: up to HIP's 1024 threads a block, a grid its Signal arrays can index,
# limits within the registered pool.
BOUNDS = {
    "#define THREAD_NUM": (8, 1024),
    "constexpr int kMaxBlocks": (1, 4096),
    "the 1-stage world size": (2, 8),
    "the 1-stage byte limit": (1, AITER_POOL_BYTES),
    "_DEFAULT_CAR_MAX_SIZE": (16, AITER_POOL_BYTES),
}
_SHAPE_MARKERS = (
    ("the naive test", "bytes % (ngpus * 16) == 0"),
    (
        "the 2-stage blocks",
        "(size / world_size_ + (threads / world_size_) - 1) /",
    ),
    ("the 1-stage blocks", "(size + (threads / world_size_) - 1) / (threads / world_size_)"),
    ("the pack count", "size /= d;"),
)


def parse_constants(cuh: str, py: str, source: str) -> DispatchConstants:
    """ValueError naming what is missing or absurd."""
    thread_num = _bounded("#define THREAD_NUM", _one(_THREAD_NUM, cuh, "#define THREAD_NUM"))
    if thread_num % 8:
        raise ValueError(f"#define THREAD_NUM {thread_num}: not a multiple of 8 lanes")
    max_blocks = _bounded("constexpr int kMaxBlocks", _one(_MAX_BLOCKS, cuh, "kMaxBlocks"))
    branch = _NEW_BRANCH.search(cuh)
    if branch is None:
        raise ValueError('no "use new version of allreduce kernel" branch before #define KL')
    limits = tuple(
        (
            _bounded("the 1-stage world size", int(w)),
            _bounded("the 1-stage byte limit", int(a) * int(b)),
        )
        for w, a, b in _LIMIT.findall(branch.group(1))
    )
    if not limits:
        raise ValueError("the new-kernel branch has no `world_size_ <= W && bytes < A * B` test")
    for what, marker in _SHAPE_MARKERS:
        if marker not in cuh:
            raise ValueError(f"{what} ({marker!r}) is not in the text: the model is stale")
    stage1 = aiter_fix.stage1(aiter_fix.squeeze(cuh))
    if stage1 is None or "__syncthreads()" not in stage1[1]:
        raise ValueError("cross_device_reduce_2stage's stage-1 loop holds no __syncthreads()")
    verdict, why = aiter_fix.classify(cuh)
    if verdict == aiter_fix.UNKNOWN:
        raise ValueError(f"cross_device_reduce_2stage's stage 1 is of no known shape: {why}")
    car = _CAR_MAX.search(py)
    if car is None:
        raise ValueError("no `_DEFAULT_CAR_MAX_SIZE = A * B` in custom_all_reduce.py")
    return DispatchConstants(
        thread_num=thread_num,
        max_blocks=max_blocks,
        one_stage_limits=limits,
        car_max_size=_bounded("_DEFAULT_CAR_MAX_SIZE", int(car.group(1)) * int(car.group(2))),
        source=source,
        stage1_whole_tiles=verdict == aiter_fix.FIXED,
    )


def _bounded(what: str, value: int) -> int:
    low, high = BOUNDS[what]
    if not low <= value <= high:
        raise ValueError(f"{what} is {value}, outside {low}..{high}: not a kernel aiter can launch")
    return value


def _one(pattern: re.Pattern[str], text: str, what: str) -> int:
    found = pattern.findall(text)
    if len(found) != 1:
        raise ValueError(f"expected one {what}, found {len(found)}")
    return int(found[0])


def car_max_size(default: int, env: Mapping[str, str]) -> int:
    """aiter's ``_resolve_car_max_size``."""
    raw = env.get(CAR_MAX_SIZE_ENV, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        return default
    if value < 0 or value > AITER_POOL_BYTES:
        return default
    return value


def installed_constants(
    env: Mapping[str, str], package_dir: str | None, header: str | None, fix: str
) -> DispatchConstants:
    """The constants of the aiter at ``package_dir`` from ``header``, the header its
    fingerprint ``fix`` read, else the pinned commit's with why."""
    if package_dir is None or header is None:
        where = "no aiter on the python path" if package_dir is None else fix
        base = replace(PINNED, source=f"{PINNED.source} (pinned: {where})")
    else:
        py = str(Path(package_dir, "dist", "device_communicators", "custom_all_reduce.py"))
        try:
            (cuh, why), (pys, py_why) = aiter_fix.read_header(header), aiter_fix.read_header(py)
            if cuh is None or pys is None:
                raise OSError(why or py_why)
            cuh_text, py_text = (b.decode("utf-8", errors="replace") for b in (cuh, pys))
            base = parse_constants(cuh_text, py_text, f"installed {header}, {py} (aiter_fix {fix})")
        except (OSError, ValueError) as exc:
            base = replace(PINNED, source=f"{PINNED.source} (pinned: {header} refused: {exc})")
    limit = car_max_size(base.car_max_size, env)
    source = base.source
    if limit != base.car_max_size:
        source += f"; {CAR_MAX_SIZE_ENV}={limit}"
    return replace(base, car_max_size=limit, source=source)


MATCHES = "matches ROCm/aiter#5694's stale read"
OTHER = "another fault"


@dataclass(frozen=True)
class Layout:
    """What places an element in the kernel."""

    tokens: int
    hidden: int
    tp: int
    dtype_size: int
    wave: int = CDNA_WAVE
    constants: DispatchConstants = PINNED


def matches(
    layout: Layout, rank: int, index: int | None, expected: float | None, seen: float | None
) -> bool:
    """Whether wrong element ``index`` on group rank ``rank`` fits the stale-read fingerprint
    (``docs/node.md``, "The fingerprint")."""
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
