"""Every test's tier, the Ray tests' xdist groups, and fixtures several modules use.

A test under ``tests/<tier>/`` gets that tier's marker unless it carries one; a test with no
tier or two stops the session at collection, so ``pytest -m <tier>`` over the five tiers
selects every test once. Each Ray test joins the xdist group of the cluster it uses, so a group
runs in order on one worker (pytest < 9.2: pytest-dev/pytest-xdist#1386 ignores groups).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conformance.harness import add_options

if TYPE_CHECKING:
    from miles_amd.rules.model import Baseline

TESTS_DIR = Path(__file__).resolve().parent
TIERS = ("snapshot", "unit", "rehearsal", "conformance", "mi355x")


def tier_problems(items: list[pytest.Item]) -> list[str]:
    """Give each test its directory's tier unless it names one; list those left with 0 or 2+."""
    problems = []
    for item in items:
        tiers = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
        path = item.path.resolve()
        parts = path.relative_to(TESTS_DIR).parts if path.is_relative_to(TESTS_DIR) else ()
        default = parts[0] if len(parts) > 1 and parts[0] in TIERS else None
        if not tiers and default is not None:
            item.add_marker(default)
            tiers = {default}
        if len(tiers) != 1:
            problems.append(f"  {item.nodeid}: {', '.join(sorted(tiers)) or 'no tier'}")
    return problems


def ray_group(item: pytest.Item) -> str | None:
    """``ray`` (the session head), ``ray-two-node`` (``test_cluster``'s cluster) or
    ``ray-own-head`` for a rehearsal test; None for ``no_ray`` ones and other tiers."""
    if item.get_closest_marker("rehearsal") is None or item.get_closest_marker("no_ray"):
        return None
    names = getattr(item, "fixturenames", ())
    if "session_head" in names:
        return "ray"
    return "ray-two-node" if "cluster" in names else "ray-own-head"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    """SIGINT handled as at a terminal: a background job (``cmd &``) starts with it ignored,
    which survives ``exec`` and hides KeyboardInterrupt from the Ctrl-C tests and their CLIs."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# tryfirst: the markers must be on the items before `-m` deselects and before the root
# conftest skips mi355x tests.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = tier_problems(items)
    for item in items:
        group = ray_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if problems:
        raise pytest.UsageError(
            "every test needs exactly one tier marker; fix: put it under tests/<tier>/ or mark "
            f"it with one of {', '.join(TIERS)}:\n" + "\n".join(problems)
        )


@pytest.fixture(scope="session")
def patched() -> Baseline:
    from miles_amd.baseline.model import load_baseline

    return load_baseline("patched")


@pytest.fixture(scope="session")
def stock() -> Baseline:
    from miles_amd.baseline.model import load_baseline

    return load_baseline("stock")
