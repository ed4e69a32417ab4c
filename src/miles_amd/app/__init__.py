"""The application layer: what a command does with the pipeline, between the CLI and it."""

from __future__ import annotations

__all__ = ["AppError"]


class AppError(ValueError):
    """Bad input, named with the flag or file and the fix; the CLI exits 2 with it."""
