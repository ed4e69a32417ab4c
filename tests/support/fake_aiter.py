"""A fake aiter package tree for CPU tests: a package that must be found, never imported (its
``__init__`` raises), with aiter's real lines (``tests/unit/data``) of e4048607 (not fixed) or
01f53100 (fixed), as a ROCm/aiter checkout (``AITER_PATCHED_DIR``) or a wheel (``aiter_meta/``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

DATA = Path(__file__).parents[1] / "unit" / "data"
CUH = "csrc/include/custom_all_reduce.cuh"
PY = "aiter/dist/device_communicators/custom_all_reduce.py"
Layout = Literal["checkout", "wheel"]


def sections(name: str) -> dict[str, str]:
    """A fixture's excerpts joined per source path."""
    text = (DATA / name).read_text(encoding="utf-8")
    found: dict[str, str] = {}
    for path, body in re.findall(
        r"^=== (\S+) lines \d+-\d+ ===\n(.*?)(?=^=== |\Z)", text, re.M | re.S
    ):
        found[path] = found.get(path, "") + body
    return found


def header_text(fixed: bool) -> str:
    """The header lines of the fixed (01f53100) or the stock (e4048607) kernel."""
    return sections("aiter_dispatch_01f53100.txt" if fixed else "aiter_dispatch_e4048607.txt")[CUH]


def fake_aiter(
    root: Path, *, fixed: bool, layout: Layout, header: str | None = None
) -> tuple[Path, Path]:
    """(the dir for PYTHONPATH, the header written) of a fake aiter under ``root``."""
    path_entry = root if layout == "checkout" else root / "site-packages"
    package = path_entry / "aiter"
    (package / "dist" / "device_communicators").mkdir(parents=True)
    (package / "__init__.py").write_text('raise ImportError("found, never imported")\n')
    py = sections("aiter_dispatch_e4048607.txt")[PY]
    (package / "dist" / "device_communicators" / "custom_all_reduce.py").write_text(py)
    csrc_root = path_entry if layout == "checkout" else path_entry / "aiter_meta"
    cuh = csrc_root / CUH
    cuh.parent.mkdir(parents=True)
    cuh.write_text(header if header is not None else header_text(fixed))
    return path_entry, cuh
