"""Options of the tiers under ``tests/``: loaded at startup for any test path below here.

The conformance tier's ``--miles-src``, ``--megatron-src`` and ``--miles-python`` live in
``tests.conformance.checkout``; ``tests/unit/test_parse_probe.py`` uses them too, so they are
registered here rather than in ``tests/conformance/conftest.py`` (which pytest would not load
for a run of ``tests/unit`` alone).
"""

from __future__ import annotations

import pytest

from tests.conformance.checkout import add_options


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)
