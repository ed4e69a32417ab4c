"""The dispatch constants of the aiter that will run: read from its source text, else pinned.

Decides where :class:`~miles_amd.canary.dispatch.DispatchConstants` come from:

- :func:`parse_constants` reads them from the text of ``custom_all_reduce.cuh`` (``#define
  THREAD_NUM``, ``kMaxBlocks``, the ``world_size_ <= W && bytes < A * B`` pairs of the
  "use new version of allreduce kernel" branch) and of ``custom_all_reduce.py``
  (``_DEFAULT_CAR_MAX_SIZE``); it refuses (ValueError) a text whose branch no longer has the
  shape the dispatch model assumes: a stage-1 loop of ``cross_device_reduce_2stage`` holding
  ``__syncthreads()``, the naive test ``bytes % (ngpus * 16) == 0``, the 1-stage/2-stage
  ``blocks`` formulas. ``tests/unit/test_canary_dispatch.py`` runs it on the pinned commit's
  lines (``tests/unit/data/aiter_dispatch_e4048607.txt``) and holds them equal to
  ``dispatch.PINNED``;
- :func:`installed_constants` finds the installed aiter without importing it
  (``importlib.util.find_spec``), reads ``aiter_meta/csrc/include/custom_all_reduce.cuh`` (a
  pip install copies ``csrc`` there, ROCm/aiter ``setup.py``) or ``csrc/include/...`` beside
  the package (a source checkout), and applies ``AITER_CUSTOM_AR_MAX_SIZE`` as aiter's
  ``_resolve_car_max_size`` does (0 disables custom AR; unparsable, negative or above the
  1 GiB pool keeps the default). Without an installed aiter or a readable source it returns
  :data:`~miles_amd.canary.dispatch.PINNED`, and says so in ``source``.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from pathlib import Path

from miles_amd.canary.dispatch import PINNED, DispatchConstants

CAR_MAX_SIZE_ENV = "AITER_CUSTOM_AR_MAX_SIZE"
AITER_POOL_BYTES = 1024 * 1024 * 1024  # CustomAllreduce(max_size=1 GiB), the registered pool
_THREAD_NUM = re.compile(r"#define\s+THREAD_NUM\s+(\d+)")
_MAX_BLOCKS = re.compile(r"constexpr\s+int\s+kMaxBlocks\s*=\s*(\d+)\s*;")
_NEW_BRANCH = re.compile(r"use new version of allreduce kernel(.*?)#define KL", re.S)
_LIMIT = re.compile(r"world_size_\s*<=\s*(\d+)\s*&&\s*bytes\s*<\s*(\d+)\s*\*\s*(\d+)")
_CAR_MAX = re.compile(r"^_DEFAULT_CAR_MAX_SIZE\s*=\s*(\d+)\s*\*\s*(\d+)", re.M)
_STAGE1 = re.compile(
    r"cross_device_reduce_2stage\(.*?for\s*\(\s*int idx = start \+ tid; idx < end; "
    r"idx \+= stride\)\s*\{(.*?)end_sync",
    re.S,
)
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
    """The constants in the two texts (module doc); ValueError naming what is missing."""
    thread_num = _one(_THREAD_NUM, cuh, "#define THREAD_NUM")
    max_blocks = _one(_MAX_BLOCKS, cuh, "constexpr int kMaxBlocks")
    branch = _NEW_BRANCH.search(cuh)
    if branch is None:
        raise ValueError('no "use new version of allreduce kernel" branch before #define KL')
    limits = tuple((int(w), int(a) * int(b)) for w, a, b in _LIMIT.findall(branch.group(1)))
    if not limits:
        raise ValueError("the new-kernel branch has no `world_size_ <= W && bytes < A * B` test")
    for what, marker in _SHAPE_MARKERS:
        if marker not in cuh:
            raise ValueError(f"{what} ({marker!r}) is not in the text: the model is stale")
    stage1 = _STAGE1.search(cuh)
    if stage1 is None or "__syncthreads()" not in stage1.group(1):
        raise ValueError("cross_device_reduce_2stage's stage-1 loop holds no __syncthreads()")
    car = _CAR_MAX.search(py)
    if car is None:
        raise ValueError("no `_DEFAULT_CAR_MAX_SIZE = A * B` in custom_all_reduce.py")
    return DispatchConstants(
        thread_num=thread_num,
        max_blocks=max_blocks,
        one_stage_limits=limits,
        car_max_size=int(car.group(1)) * int(car.group(2)),
        source=source,
    )


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


def aiter_source_files(package_dir: Path) -> tuple[Path, Path] | None:
    """The installed ``.cuh`` and ``.py`` the constants are read from, when both exist."""
    py = package_dir / "dist" / "device_communicators" / "custom_all_reduce.py"
    for root in (package_dir.parent / "aiter_meta", package_dir.parent):
        cuh = root / "csrc" / "include" / "custom_all_reduce.cuh"
        if cuh.is_file() and py.is_file():
            return cuh, py
    return None


def aiter_package_dir() -> Path | None:
    """The installed ``aiter`` package's directory (found, not imported); None without one."""
    try:
        spec = importlib.util.find_spec("aiter")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def installed_constants(env: Mapping[str, str]) -> DispatchConstants:
    """The installed aiter's constants (module doc), else the pinned commit's."""
    package = aiter_package_dir()
    files = aiter_source_files(package) if package is not None else None
    if files is None:
        where = "no aiter installed" if package is None else f"no source beside {package}"
        base = PINNED
        source = f"{PINNED.source} ({where})"
    else:
        cuh, py = files
        try:
            base = parse_constants(
                cuh.read_text(encoding="utf-8", errors="replace"),
                py.read_text(encoding="utf-8", errors="replace"),
                f"installed {cuh}, {py}",
            )
            source = base.source
        except (OSError, ValueError) as exc:
            base = PINNED
            source = f"{PINNED.source} (installed source unreadable: {exc})"
    limit = car_max_size(base.car_max_size, env)
    if limit != base.car_max_size:
        source += f"; {CAR_MAX_SIZE_ENV}={limit}"
    return DispatchConstants(base.thread_num, base.max_blocks, base.one_stage_limits, limit, source)
