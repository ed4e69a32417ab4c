"""Text people read fits :data:`WIDTH` columns: a longer line is wrapped at its spaces, not
cut; continuations keep its indentation plus ``indent``; a longer word is broken, every
character kept. The terminal renderers put every line through :func:`fit` after escaping.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

WIDTH = 100


def wrapped(line: str, indent: str = "    ", width: int = WIDTH) -> list[str]:
    if len(line) <= width:
        return [line]
    lead = line[: len(line) - len(line.lstrip(" "))]
    return textwrap.wrap(
        line,
        width=width,
        subsequent_indent=lead + indent,
        break_on_hyphens=False,
    ) or [line]


def fit(lines: Iterable[str], indent: str = "    ") -> str:
    """``lines`` wrapped (:func:`wrapped`) and joined, one newline after each."""
    return "".join(part + "\n" for line in lines for part in wrapped(line, indent))
