"""The application layer's one error: input the user must fix, said in one line."""

from __future__ import annotations

__all__ = ["AppError"]


class AppError(ValueError):
    """Bad input, named with the flag or file and the fix; the CLI exits 2 with it."""
