"""The application layer: what a command does with the pipeline, between the CLI and it.

``baselines``: which baseline judges what; ``gate``: judge a run dir, write its report, append
it to a named history, and compare two run dirs; ``train``: the canary, the driver, then the
gate. ``run/``, ``judge/`` and ``report/`` do not import this layer (pyproject's contracts).
"""

from __future__ import annotations

__all__ = ["AppError"]


class AppError(ValueError):
    """Bad input, named with the flag or file and the fix; the CLI exits 2 with it."""
