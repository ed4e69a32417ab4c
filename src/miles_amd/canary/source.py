"""The dispatch constants of the aiter that will run: read from its source text, else pinned.

Decides where :class:`~miles_amd.canary.dispatch.DispatchConstants` come from:

- :func:`parse_constants` reads them from the text of ``custom_all_reduce.cuh`` (``#define
  THREAD_NUM``, ``kMaxBlocks``, the ``world_size_ <= W && bytes < A * B`` pairs of the
  "use new version of allreduce kernel" branch) and of ``custom_all_reduce.py``
  (``_DEFAULT_CAR_MAX_SIZE``), in either kernel's shape: e4048607's and the fixed one of
  ROCm/aiter#5694 (01f53100: stage 1 runs whole tiles, ``stage1_whole_tiles``; which lines
  decide: ``miles_amd.aiter_fix``). It refuses (ValueError naming the line) a constant
  outside what aiter can launch (:data:`BOUNDS`) and a text whose branch no longer has the
  shape the dispatch model assumes (a stage-1 loop without ``__syncthreads()``, the naive
  test, the ``blocks`` formulas); ``tests/unit/test_canary_dispatch.py`` runs it on both
  commits' lines (``tests/unit/data/``);
- :func:`installed_constants`: the constants of the aiter a process imports (its package dir
  comes from ``aiter_fix``'s child, run with the PYTHONPATH of ``variants.aiter_pythonpath``):
  the header the fingerprint read (``aiter_fix.locate``: ``$AITER_META_DIR``, a wheel's
  ``aiter_meta/`` or a checkout's root) and ``aiter/dist/.../custom_all_reduce.py``, with
  ``AITER_CUSTOM_AR_MAX_SIZE`` applied as aiter's ``_resolve_car_max_size`` does. Without a
  readable, accepted source it is :data:`~miles_amd.canary.dispatch.PINNED`; ``source`` always
  names the file and its fingerprint, or the pinned commit and why.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from miles_amd import aiter_fix
from miles_amd.canary.dispatch import PINNED, DispatchConstants

CAR_MAX_SIZE_ENV = "AITER_CUSTOM_AR_MAX_SIZE"
AITER_POOL_BYTES = 1024 * 1024 * 1024  # CustomAllreduce(max_size=1 GiB), the registered pool
_THREAD_NUM = re.compile(r"#define\s+THREAD_NUM\s+(\d+)")
_MAX_BLOCKS = re.compile(r"constexpr\s+int\s+kMaxBlocks\s*=\s*(\d+)\s*;")
_NEW_BRANCH = re.compile(r"use new version of allreduce kernel(.*?)#define KL", re.S)
_LIMIT = re.compile(r"world_size_\s*<=\s*(\d+)\s*&&\s*bytes\s*<\s*(\d+)\s*\*\s*(\d+)")
_CAR_MAX = re.compile(r"^_DEFAULT_CAR_MAX_SIZE\s*=\s*(\d+)\s*\*\s*(\d+)", re.M)
# What aiter can launch: lanes for every world size up to HIP's 1024 threads a block, a grid
# its Signal arrays can index, 1-stage limits within the registered pool.
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
    """The constants in the two texts (module doc); ValueError naming what is missing or absurd."""
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
    """aiter's ``_resolve_car_max_size`` (ROCm/aiter e4048607, ``custom_all_reduce.py``)."""
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
    """The constants of the aiter at ``package_dir`` (None: no aiter) from ``header``, the
    ``custom_all_reduce.cuh`` its fingerprint ``fix`` read (``aiter_fix``), else the pinned
    commit's, with why (module doc)."""
    if package_dir is None or header is None:
        where = "no aiter on the python path" if package_dir is None else fix
        base = replace(PINNED, source=f"{PINNED.source} (pinned: {where})")
    else:
        py = Path(package_dir, "dist", "device_communicators", "custom_all_reduce.py")
        try:
            base = parse_constants(
                _text(Path(header)), _text(py), f"installed {header}, {py} (aiter_fix {fix})"
            )
        except (OSError, ValueError) as exc:
            base = replace(PINNED, source=f"{PINNED.source} (pinned: {header} refused: {exc})")
    limit = car_max_size(base.car_max_size, env)
    source = base.source
    if limit != base.car_max_size:
        source += f"; {CAR_MAX_SIZE_ENV}={limit}"
    return replace(base, car_max_size=limit, source=source)


def _text(path: Path) -> str:
    """A source file's text, at most ``aiter_fix.MAX_HEADER_BYTES``; OSError otherwise."""
    data, why = aiter_fix.read_header(str(path))
    if data is None:
        raise OSError(why)
    return data.decode("utf-8", errors="replace")
