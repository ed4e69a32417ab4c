"""``--hardware auto``: the node's product (MI355X or MI350X) from what ``amd-smi`` or
``rocm-smi`` print, matched by regex; no tool, no GPU or a mix is a
:class:`HardwareDetectionError` saying what to pass instead.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Sequence

from miles_amd.recipe.settings import Hardware

PRODUCT_PATTERN = re.compile(r"MI35([05])X", re.IGNORECASE)
PROBE_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("amd-smi", "static", "--asic"),
    ("rocm-smi", "--showproductname"),
)

Runner = Callable[[Sequence[str]], str | None]


class HardwareDetectionError(RuntimeError):
    """``--hardware auto`` could not tell the node's product."""


def run_tool(argv: Sequence[str]) -> str | None:
    """Output of a ROCm tool, or None when it is not installed or fails."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def products_in(text: str) -> set[Hardware]:
    return {Hardware(f"MI35{m.group(1)}X") for m in PRODUCT_PATTERN.finditer(text)}


def detect_hardware(runner: Runner = run_tool) -> Hardware:
    """The one product every GPU of this node reports."""
    tried = []
    for argv in PROBE_COMMANDS:
        output = runner(argv)
        tried.append(argv[0])
        if output is None:
            continue
        found = products_in(output)
        if len(found) == 1:
            return found.pop()
        if len(found) > 1:
            names = ", ".join(sorted(h.value for h in found))
            raise HardwareDetectionError(
                f"--hardware auto: this node mixes {names}; pass --hardware explicitly"
            )
    raise HardwareDetectionError(
        f"--hardware auto: no MI355X/MI350X GPU found (asked {', '.join(tried)}); "
        "run on an AMD Instinct node or pass --hardware MI355X|MI350X"
    )
