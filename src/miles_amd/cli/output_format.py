"""The ``--format`` choices of the commands that print a document (gate, compare, history).

A leaf of ``miles_amd.cli``, so the commands share it without importing each other.
"""

from __future__ import annotations

from enum import Enum


class OutputFormat(str, Enum):
    text = "text"
    json = "json"
    markdown = "markdown"
