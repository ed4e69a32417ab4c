"""Every test's tier, and the fixtures more than one test module uses.

Tiers (registered in ``pytest.ini``): ``snapshot``, ``unit``, ``rehearsal``, ``conformance``,
``mi355x``. A test under ``tests/<tier>/`` gets that tier's marker; a test or module that
carries a tier marker itself keeps it instead (``test_planning_imports_no_heavy_module`` in
``tests/unit`` is a ``snapshot`` test: the import-lightness bar belongs to that tier). A test
with no tier, or with two, stops the session at collection with the list of such tests, so
``pytest -m <tier>`` over the five tiers selects every collected test exactly once.

``pytest.ini`` runs the suite on pytest-xdist workers (``-n auto --dist loadgroup``); every
Ray test is in one of three xdist groups (:func:`ray_group`: the session head's, the two-node
cluster's, the tests that start their own heads), so each group runs in order on one worker
and one session head serves all its tests, while the other tests fill the workers around
them (one group for every Ray test ran them all in a row on one worker; more workers than
cores pushed a fail-fast latency past its bound). The grouping needs pytest < 9.2
(pytest-dev/pytest-xdist#1386: with pytest 9.2 and xdist 3.8 the group is silently ignored
and each worker starts its own head).

Hardware options and the ``mi355x`` skip live in the root ``conftest.py``; the rehearsal's
Ray head and the node options in their own directories' conftests. The conformance options
(``--miles-src``, ``--megatron-src``, ``--miles-python``; ``tests.conformance.checkout``) are
registered here because ``tests/unit/test_parse_probe.py`` uses them too, and pytest would not
load ``tests/conformance/conftest.py`` for a run of ``tests/unit`` alone.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conformance.checkout import add_options

if TYPE_CHECKING:
    from miles_amd.rules.model import Baseline

TESTS_DIR = Path(__file__).resolve().parent
TIERS = ("snapshot", "unit", "rehearsal", "conformance", "mi355x")


def directory_tier(path: Path) -> str | None:
    """``tests/<tier>/...`` -> ``<tier>``; None outside a tier directory."""
    try:
        parts = path.resolve().relative_to(TESTS_DIR).parts
    except ValueError:
        return None
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


def tier_problems(items: list[pytest.Item]) -> list[str]:
    """Give each test its directory's tier unless it names one; list those left with 0 or 2+."""
    problems = []
    for item in items:
        tiers = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
        default = directory_tier(item.path)
        if not tiers and default is not None:
            item.add_marker(default)
            tiers = {default}
        if len(tiers) != 1:
            problems.append(f"  {item.nodeid}: {', '.join(sorted(tiers)) or 'no tier'}")
    return problems


def ray_group(item: pytest.Item) -> str | None:
    """The xdist group of a rehearsal test, by the Ray cluster it uses; None for other tiers.

    ``ray``: the session head (``session_head``, ``ray_head``, ``cluster_env``,
    ``healthy_run``); ``ray-two-node``:
    ``test_cluster``'s two-node cluster (``cluster``); ``ray-own-head``: the tests whose code
    under test starts and stops its own heads. A group's tests run in order on one worker and
    share its cluster; the three groups may run at once, on different workers. The
    real-writer rehearsal (conformance tier, its own ``pytest`` in the conformance Python)
    stays ungrouped: its workers each start a session head, and it asserts no latency bound.
    So do the rehearsal tests marked ``no_ray`` (the canary's gloo ranks, a hostile
    dashboard): they start no Ray and fill whichever worker is free.
    """
    if item.get_closest_marker("rehearsal") is None or item.get_closest_marker("no_ray"):
        return None
    names = getattr(item, "fixturenames", ())
    if "session_head" in names:
        return "ray"
    return "ray-two-node" if "cluster" in names else "ray-own-head"


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    """SIGINT handled as at a terminal. A shell starts a background job (``cmd &``) with SIGINT
    ignored, and an ignored signal stays ignored across ``exec``: the Ctrl-C tests, which
    interrupt this process or send SIGINT to a CLI they start, then saw no KeyboardInterrupt
    (measured: three failures in a ``.ci/run`` started in the background). A handled signal is
    reset to the default at ``exec``, so the workers and CLIs started from here get Python's
    own handler too."""
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
    """The shipped ``patched`` baseline (jvvnhop9's published evidence and rules)."""
    from miles_amd.baseline.model import load_baseline

    return load_baseline("patched")


@pytest.fixture(scope="session")
def stock() -> Baseline:
    """The shipped ``stock`` baseline."""
    from miles_amd.baseline.model import load_baseline

    return load_baseline("stock")
